"""``python -m app``: the command-line interface, built from ``app.commands``.

User errors (``loaders.errors.QkvscopeError``, ``analysis.errors.AnalysisError``)
and ``OSError`` on a named path print one line on stderr (characters that are
not printable escaped) and exit 2; anything else is a bug and keeps its
traceback.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from types import ModuleType

import app.commands
from analysis.errors import AnalysisError
from loaders.errors import QkvscopeError
from loaders.report import one_line


def command_modules() -> list[ModuleType]:
    """Every command module in ``app.commands``, sorted by name."""
    mods = []
    for info in sorted(pkgutil.iter_modules(app.commands.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"app.commands.{info.name}")
        if hasattr(mod, "NAME") and hasattr(mod, "run"):
            mods.append(mod)
    return mods


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m app",
        description="qkvscope: does a transformer need all three attention projections?")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in command_modules():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=getattr(mod, "__doc__", None) or mod.HELP,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except (QkvscopeError, AnalysisError) as exc:
        print(one_line(f"error: {exc}".replace("\n", " ")), file=sys.stderr)
        return 2
    except OSError as exc:       # a path the user named: unreadable, vanished, ...
        where = f"{exc.filename}: " if exc.filename else ""
        print(one_line(f"error: {where}{exc.strerror or exc}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
