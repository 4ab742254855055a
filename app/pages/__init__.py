"""Dashboard pages, one module each.

A page module defines ``TITLE``, ``ICON`` (a material icon), ``ORDER`` (its
place in the navigation), ``URL_PATH`` and ``render()``. Pages read widgets,
call one function of ``loaders``/``analysis``/``app.jobs``, and render; they
hold no SQL strings and no tensor math.
"""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def page_modules() -> list[ModuleType]:
    """Every page module, in navigation order."""
    mods = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        if all(hasattr(mod, a) for a in ("TITLE", "ICON", "ORDER", "URL_PATH", "render")):
            mods.append(mod)
    return sorted(mods, key=lambda m: (m.ORDER, m.URL_PATH))
