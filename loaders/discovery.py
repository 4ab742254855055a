"""Plug-in modules found by listing a package: layouts, log readers, CLI commands, pages.

A package that holds one module per member (one converter per layout, one reader per log
format, one file per command or page) lists them with ``modules``: every module of the package
whose name does not start with ``_`` is imported, and those that define all the names a member
must define are returned, sorted by module name. A module that lacks one of them (a helper
shared by the members) is not a member.
"""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def module_names(package: ModuleType) -> list[str]:
    """The public module names of ``package`` (not starting with ``_``), sorted, none imported."""
    return sorted(i.name for i in pkgutil.iter_modules(package.__path__) if not i.name.startswith("_"))


def modules(package: ModuleType, required: tuple[str, ...]) -> list[ModuleType]:
    """The modules of ``package`` that define every name in ``required``, sorted by module name."""
    found = [importlib.import_module(f"{package.__name__}.{name}") for name in module_names(package)]
    return [mod for mod in found if all(hasattr(mod, a) for a in required)]
