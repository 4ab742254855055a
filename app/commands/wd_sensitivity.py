"""How sensitive is each variant to weight decay?

Runs are grouped by variant and by everything in their config except weight
decay (and seeds, output folders, names). Per group: the final and best
validation loss of each run against its weight decay, a robust slope of the
final loss against log10(weight decay) (Huber regression), its curvature, the
best weight decay, loss spikes and divergence per run, and (where analysed
checkpoints of the runs exist) the projection norms of each run's latest
analysed checkpoint.

JSON (--json): a list with one object per (variant, group): variant, group,
weight_decays, final_val_loss, best_val_loss, slope, curvature,
best_weight_decay, n_runs, run_ids, spikes, diverged, projection_norms.
"""
from __future__ import annotations

import argparse

import pandas as pd

from analysis.wd_sensitivity import projection_norms_vs_wd, wd_sensitivity
from app.commands._common import add_db_argument, print_json, store_from
from loaders.store import Store

NAME = "wd-sensitivity"
HELP = "validation loss against weight decay per variant: slope, best wd, spikes, divergence"

NORM_METRICS = ["norm_q", "norm_k", "norm_v", "norm_o"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_db_argument(parser)
    parser.add_argument("--metric", default="val/loss", help="loss metric to use (default: val/loss)")
    parser.add_argument("--spike-ratio", type=float, default=0.1,
                        help="a rise above (1 + ratio) x the best loss so far is a spike (default 0.1)")
    parser.add_argument("--diverge-ratio", type=float, default=1.5,
                        help="final loss above ratio x the best loss means diverged (default 1.5)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def read_inputs(store: Store, metric: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``runs``, ``points`` (latest value per run and step) and projection-norm rows."""
    with store.connect() as con:
        runs = con.execute("SELECT id AS run_id, variant, weight_decay, config FROM runs ORDER BY id").df()
        points = con.execute(
            """SELECT run_id, step, value FROM points WHERE metric = ?
               QUALIFY row_number() OVER (PARTITION BY run_id, step ORDER BY rowid DESC) = 1
               ORDER BY run_id, step""", [metric]).df()
        norms = con.execute(
            """SELECT c.run_id, c.step, r.metric, r.value
               FROM analysis_results r JOIN checkpoints c ON c.id = r.checkpoint_id
               WHERE c.run_id IS NOT NULL AND c.step IS NOT NULL AND list_contains(?, r.metric)
                 AND r.value IS NOT NULL""", [NORM_METRICS]).df()
    return runs, points, norms


def run(args: argparse.Namespace) -> int:
    store = store_from(args)
    runs, points, norms = read_inputs(store, args.metric)
    table = wd_sensitivity(runs, points, spike_ratio=args.spike_ratio, diverge_ratio=args.diverge_ratio)
    pn = projection_norms_vs_wd(runs, norms)
    out = []
    for row in table.to_dict("records"):
        for key in ("slope", "curvature", "best_weight_decay"):   # pandas turns None into NaN
            if row[key] is not None and pd.isna(row[key]):
                row[key] = None
        mine = pn[pn["run_id"].isin(row["run_ids"])]
        row["projection_norms"] = mine[["run_id", "weight_decay", "step", "metric", "value"]].to_dict("records")
        out.append(row)
    if args.json:
        print_json(out)
        return 0
    if not out:
        print(f"no runs with a weight decay and '{args.metric}' points in {store.path}")
        return 0
    for row in out:
        slope = "n/a" if row["slope"] is None else f"{row['slope']:+.4f}"
        print(f"{row['variant']} [{row['group']}]  runs={row['n_runs']}  slope d{args.metric}/dlog10(wd)={slope}"
              f"  best wd={row['best_weight_decay']}")
        for wd, fin, best, sp, dv in zip(row["weight_decays"], row["final_val_loss"], row["best_val_loss"],
                                         row["spikes"], row["diverged"]):
            fin_s = "n/a" if fin is None else f"{fin:.4f}"
            best_s = "n/a" if best is None else f"{best:.4f}"
            print(f"   wd={wd:<10g} final={fin_s:<8} best={best_s:<8} spikes={sp}{'  DIVERGED' if dv else ''}")
    return 0
