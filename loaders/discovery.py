"""Plug-in modules found by listing a package: layouts, log readers, CLI commands, pages.

A package that holds one module per member (one converter per layout, one reader per log
format, one file per command or page) lists them with ``modules``: every module of the package
whose name does not start with ``_`` is imported, and those that define all the names a member
must define are returned, sorted by module name. A module that lacks one of them (a helper
shared by the members) is not a member.

``declared`` reads the same members' constants from their source without importing them
(module-level ``NAME = "gpt2"``, ``PRIORITY = 40``, ``MODEL_TYPES = frozenset({...})``): a
package that needs only some members for a request (one layout of twenty for one checkpoint)
orders them by these and imports a member when its turn comes.
"""
from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path
from types import ModuleType


def module_names(package: ModuleType) -> list[str]:
    """The public module names of ``package`` (not starting with ``_``), sorted, none imported."""
    return sorted(i.name for i in pkgutil.iter_modules(package.__path__) if not i.name.startswith("_"))


def modules(package: ModuleType, required: tuple[str, ...]) -> list[ModuleType]:
    """The modules of ``package`` that define every name in ``required``, sorted by module name."""
    found = [importlib.import_module(f"{package.__name__}.{name}") for name in module_names(package)]
    return [mod for mod in found if all(hasattr(mod, a) for a in required)]


#: What ``declared`` gives for a constant whose value is not a literal: the member is imported.
UNREAD = object()


def declared(package: ModuleType, required: tuple[str, ...],
             constants: tuple[str, ...]) -> dict[str, dict[str, object]]:
    """``{module name: {constant: value}}`` for the modules of ``package`` whose source defines
    every name in ``required`` at module level (a ``def``, ``class`` or assignment), none imported.
    Each of ``constants`` a module assigns at module level is read with ``ast.literal_eval`` (a
    ``frozenset(...)``/``set(...)``/``tuple(...)`` of a literal included), ``UNREAD`` when it is no
    literal (the caller imports that module to read it), absent when not assigned."""
    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_"):
            continue
        source = Path(getattr(info.module_finder, "path", "")) / f"{info.name}.py"
        if info.ispkg or not source.is_file():       # a package or a compiled module: read by importing it
            mod = importlib.import_module(f"{package.__name__}.{info.name}")
            if all(hasattr(mod, a) for a in required):
                found[mod.__name__] = {c: getattr(mod, c) for c in constants if hasattr(mod, c)}
            continue
        tree = ast.parse(source.read_text(encoding="utf-8"))
        defined: dict[str, ast.expr | None] = {}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined[node.name] = None
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name):
                        defined[target.id] = node.value
            elif isinstance(node, (ast.Import, ast.ImportFrom)):     # ``from x import detect``
                for alias in node.names:
                    defined[(alias.asname or alias.name).split(".")[0]] = None
        if all(name in defined for name in required):
            found[f"{package.__name__}.{info.name}"] = {c: _literal(defined[c]) for c in constants if c in defined}
    return dict(sorted(found.items()))


def _literal(node: ast.expr | None) -> object:
    if node is None:
        return UNREAD
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("frozenset", "set", "tuple") and len(node.args) <= 1 and not node.keywords):
        inner = _literal(node.args[0]) if node.args else ()
        return UNREAD if inner is UNREAD else {"frozenset": frozenset, "set": set, "tuple": tuple}[node.func.id](inner)
    try:
        return ast.literal_eval(node)
    except ValueError:
        return UNREAD
