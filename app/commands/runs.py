"""List the training runs stored in the database, with their metadata.

Each run: id, name, project (``loaders.projects``), source (the log it came from), format (the log reader),
variant, n_kv_heads, weight_decay, lr, seed, model_size, resumed, n_points,
metrics (names), first_step, last_step, config, overrides (fields the user
set with `python -m app run-meta`; already applied to the values shown).

Example:
  python -m app runs --db my.duckdb --json
"""
from __future__ import annotations

import argparse

from app.commands._common import add_db_argument, print_json, store_from
from loaders.logs import list_runs

NAME = "runs"
HELP = "list stored training runs: variant, weight decay, lr, points, metrics"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_db_argument(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON list of run objects")
    parser.add_argument("--config", action="store_true",
                        help="with --json: include each run's config (large); without it omitted")


def _fmt(x, spec: str = "") -> str:
    if x is None:
        return "-"
    return format(x, spec) if spec else str(x)


def run(args: argparse.Namespace) -> int:
    runs = list_runs(store_from(args))
    if args.json:
        if not args.config:
            for r in runs:
                r.pop("config", None)
        print_json(runs)
        return 0
    if not runs:
        print("no runs stored yet: python -m app ingest PATH")
        return 0
    print(f"{'id':>4}  {'name':<28} {'format':<14} {'variant':<12} {'wd':>8} {'lr':>9} "
          f"{'points':>8} {'steps':>15}  metrics")
    for r in runs:
        steps = f"{_fmt(r['first_step'])}-{_fmt(r['last_step'])}"
        name = r["name"] if len(r["name"]) <= 28 else r["name"][:27] + "…"
        mark = "*" if r["overrides"] else " "
        metrics = ", ".join(r["metrics"][:6]) + (f" (+{len(r['metrics']) - 6})" if len(r["metrics"]) > 6 else "")
        print(f"{r['id']:>4}{mark} {name:<28} {r['format']:<14} {r['variant']:<12} "
              f"{_fmt(r['weight_decay'], 'g'):>8} {_fmt(r['lr'], 'g'):>9} {r['n_points']:>8} {steps:>15}  "
              f"{metrics}{' (resumed)' if r['resumed'] else ''}")
    if any(r["overrides"] for r in runs):
        print("* metadata corrected by the user (python -m app run-meta)")
    return 0
