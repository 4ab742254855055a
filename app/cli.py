"""``qkvscope`` (installed by ``pip install .``; ``python -m app`` in a checkout): the
command-line interface, built from ``app.commands``.

User errors (``loaders.errors.QkvscopeError``, ``analysis.errors.AnalysisError``)
and ``OSError`` on a named path print one line on stderr (characters that are
not printable escaped) and exit 2; anything else is a bug and keeps its
traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from types import ModuleType

import app.commands
from analysis.errors import AnalysisError
from loaders.discovery import module_names, modules
from loaders.errors import QkvscopeError
from loaders.report import TerminalSafe, one_line


def command_modules() -> list[ModuleType]:
    """Every command module in ``app.commands``, sorted by name."""
    return modules(app.commands, ("NAME", "run"))


def command_module(name: str) -> ModuleType | None:
    """The module of the command ``name`` alone (its file: the name with ``_`` for ``-``), or None
    when no command is called so. ``main`` imports only this one when the command line names a
    command: the others' imports (``analyze``'s pandas and metric registry) cost a light
    command such as ``info`` or ``checkpoints`` 0.47 instead of 0.10 s on a 2-core machine."""
    stem = name.replace("-", "_")
    if stem not in module_names(app.commands):
        return None
    mod = importlib.import_module(f"app.commands.{stem}")
    return mod if getattr(mod, "NAME", None) == name and hasattr(mod, "run") else None


def prog_name() -> str:
    """``qkvscope`` when run as the installed command, else ``python -m app``."""
    return "qkvscope" if os.path.basename(sys.argv[0]) == "qkvscope" else "python -m app"


def build_parser(only: ModuleType | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of the command ``only`` alone (the same subparser)."""
    parser = argparse.ArgumentParser(
        prog=prog_name(),
        description="qkvscope: does a transformer need all three attention projections?")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in [only] if only is not None else command_modules():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=getattr(mod, "__doc__", None) or mod.HELP,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv``; its stdout and stderr written through
    ``loaders.report.TerminalSafe`` (control characters from names in files escaped)."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = TerminalSafe(out), TerminalSafe(err)
    try:
        return _main(argv)
    finally:
        sys.stdout, sys.stderr = out, err


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    only = command_module(argv[0]) if argv and not argv[0].startswith("-") else None
    args = build_parser(only).parse_args(argv)
    try:
        rc = int(args._run(args) or 0)
        sys.stdout.flush()       # here, so that a reader gone (below) is not an error at exit
        return rc
    except (QkvscopeError, AnalysisError) as exc:
        print(one_line(f"error: {exc}".replace("\n", " ")), file=sys.stderr)
        return 2
    except BrokenPipeError:      # `... --json | head`: the reader has what it wanted
        _quiet_stdout()
        return 141               # 128 + SIGPIPE, what a shell reports for a writer whose reader left
    except OSError as exc:       # a path the user named: unreadable, vanished, ...
        where = f"{exc.filename}: " if exc.filename else ""
        print(one_line(f"error: {where}{exc.strerror or exc}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit raises no second BrokenPipeError
    (the recipe of Python's ``signal`` documentation, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
