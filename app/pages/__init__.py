"""Dashboard pages, one module each.

A page module defines ``TITLE``, ``ICON`` (a material icon), ``ORDER`` (its
place in the navigation), ``URL_PATH`` and ``render()``. Pages read widgets,
call one function of ``loaders``/``analysis``/``app.jobs``, and render; they
hold no SQL strings and no tensor math.
"""
from __future__ import annotations

import sys
from types import ModuleType

from loaders.discovery import modules


def page_modules() -> list[ModuleType]:
    """Every page module, in navigation order."""
    mods = modules(sys.modules[__name__], ("TITLE", "ICON", "ORDER", "URL_PATH", "render"))
    return sorted(mods, key=lambda m: (m.ORDER, m.URL_PATH))
