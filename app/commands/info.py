"""Describe one checkpoint: architecture, variant, geometry, parameters, KV bytes.

Examples:
  python -m app info runs/kv-mqa/checkpoints/final.safetensors
  python -m app info path/to/hf-folder --json

Reads metadata and one layer at a time (safetensors are memory-mapped), so it
is cheap for files larger than memory. Nothing is written to the database.
"""
from __future__ import annotations

import argparse

from app.commands._common import print_json

NAME = "info"
HELP = "what is this checkpoint? (architecture, variant, geometry, parameters)"

_ORDER = ("architecture", "variant", "n_layers", "n_heads", "n_kv_heads", "d_model", "d_head",
          "norm", "positions", "attn_scale", "dtype", "kv_bytes_per_token", "nonfinite")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="checkpoint file, Hugging Face folder or zip")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from loaders.checkpoints import inspect_checkpoint

    info = inspect_checkpoint(args.path)
    if args.json:
        print_json(info)
        return 0
    print(args.path)
    for key in _ORDER:
        if key in info:
            print(f"  {key:<20} {info[key]}")
    params = info["params"]
    share = params["attention"] / params["total"] if params["total"] else 0.0
    print(f"  {'params':<20} {params['total']:,} total, {params['attention']:,} attention ({share:.1%})")
    return 0
