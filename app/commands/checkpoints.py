"""List the checkpoints stored in the database, with their geometry.

Example:
  python -m app checkpoints --db my.duckdb --json
"""
from __future__ import annotations

import argparse

from app.commands._common import add_db_argument, print_json, store_from

NAME = "checkpoints"
HELP = "list stored checkpoints and their geometry"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_db_argument(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON list")


def checkpoint_json(row: dict) -> dict:
    """The stable JSON shape: info's geometry fields plus id, path, sha256, run_id, step, project."""
    out = {k: row[k] for k in ("id", "path", "sha256", "architecture", "variant", "n_layers",
                               "n_heads", "n_kv_heads", "d_model", "d_head", "norm", "positions",
                               "attn_scale", "dtype", "kv_bytes_per_token", "nonfinite",
                               "run_id", "step", "project")}
    out["params"] = {"total": row["params_total"], "attention": row["params_attention"]}
    return out


def run(args: argparse.Namespace) -> int:
    rows = [checkpoint_json(r) for r in store_from(args).checkpoints()]
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print("no checkpoints stored yet: python -m app ingest PATH")
        return 0
    print(f"{'id':>4}  {'architecture':<18} {'variant':<12} {'L':>3} {'H':>3} {'KV':>3} "
          f"{'d_model':>7} {'d_head':>6}  path")
    for r in rows:
        print(f"{r['id']:>4}  {r['architecture']:<18} {r['variant']:<12} {r['n_layers']:>3} "
              f"{r['n_heads']:>3} {r['n_kv_heads']:>3} {r['d_model']:>7} {r['d_head']:>6}  {r['path']}")
    return 0
