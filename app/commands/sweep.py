"""Train a grid of variant models: variants x weight decays x kv-head counts.

  python -m app sweep --variants qkv,wq_identity,q_eq_k,k_eq_v,q_eq_k_eq_v \\
      --weight-decays 0.0,0.03,0.1 --out runs/sweep [--n-kv-heads 4,2,1] [--jobs 2]

Each run goes to <out>/<variant>-<mha|gqaN|mqa>-wd<wd>; finished runs are
skipped and unfinished ones resumed when the sweep is run again.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.commands._common import print_json
from app.commands.train import add_model_train_arguments, configs_from_args

NAME = "sweep"
HELP = "train a grid of runs (variants x weight decays x kv heads), several processes at once"


def _list(cast):
    def parse(text: str) -> list:
        return [cast(t) for t in text.split(",") if t.strip()]
    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="folder of run folders")
    p.add_argument("--variants", type=_list(str), default=["qkv"],
                   help="comma-separated variants (default qkv)")
    p.add_argument("--weight-decays", type=_list(float), default=[0.1],
                   help="comma-separated weight decays (default 0.1)")
    p.add_argument("--n-kv-heads", dest="kv_list", type=_list(int), default=None,
                   help="comma-separated kv head counts (default: n-head, i.e. MHA)")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at once (default 1)")
    p.add_argument("--json", action="store_true", help="print the run summaries as JSON")
    add_model_train_arguments(p, single=False)


def run(args: argparse.Namespace) -> int:
    # here: torch loads when the command runs, not at CLI start
    from experiments.distributed import refuse_under_torchrun

    refuse_under_torchrun('sweep')
    from experiments.config import VARIANTS
    from experiments.sweep import grid, run_sweep  # torch: only when a sweep starts

    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        print(f"error: unknown variant(s) {', '.join(bad)}; expected some of {', '.join(VARIANTS)}",
              file=sys.stderr)
        return 2
    try:
        mc, tc = configs_from_args(args)
        specs = grid(args.variants, args.weight_decays, n_kv_heads=args.kv_list or [None],
                     model=mc, training=tc)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results = run_sweep(specs, args.out, jobs=args.jobs, resume=True)
    if args.json:
        print_json(results)
    else:
        for r in results:
            print(f"{r['name']:<28} val {r['final_val_loss']:.4f}  params {r['params']:>9,}  "
                  f"kv bytes/token {r['kv_bytes_per_token']:,}")
    return 0
