"""Run the benchmarks under bench/ and print one table of results.

Examples:
  python -m app bench --quick                 # smallest sizes: a smoke run of every script
  python -m app bench                         # the full sizes docs/performance.md quotes
  python -m app bench --only log_ingest --json
  python -m app bench --list

Every bench/*.py script runs in its own process; each figure is a ratio
measured side by side in the same run (or an absolute time where the target
is one), with its target and pass/FAIL. The same code as bench/run_all.py.
Exit status: 0 when every target passed, 1 when one failed or a script broke.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

NAME = "bench"
HELP = "run every benchmark (bench/*.py) and print one table against the targets"

_RUNNER = Path(__file__).resolve().parents[2] / "bench" / "run_all.py"


def _runner():
    """bench/run_all.py, loaded by path (bench/ is a folder of scripts, not a package)."""
    name = "qkvscope_bench_run_all"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _RUNNER)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod                      # dataclasses look their module up here
        spec.loader.exec_module(mod)
    return sys.modules[name]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    if _RUNNER.is_file():
        _runner().add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if not _RUNNER.is_file():     # an installed qkvscope: bench/ is part of a checkout only
        print(f"error: {_RUNNER}: no such file; the benchmarks run in a checkout of qkvscope "
              "(python -m app bench there), they are not installed", file=sys.stderr)
        return 2
    return _runner().run(args)
