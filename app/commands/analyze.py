"""Compute the attention-redundancy metrics of checkpoints and store them.

Each PATH_OR_ID is a checkpoint file or folder (ingested first, as `ingest`
would) or the id of a stored checkpoint. Results are stored per checkpoint,
layer and head; analysing the same checkpoint again with the same metric
version reads them back instead of recomputing. `--activations` adds the
metrics that need a forward pass on sample text (Hugging Face folders and
qkvscope's own checkpoints); where none is possible the notes say why.

JSON (--json): {"checkpoint": {...}, "metrics": [{"layer", "head", "metric",
"value"}...], "notes": {metric: why absent}, "cached": bool} per checkpoint,
a list when several are given. Metric names: see `python -m app analyze --list`.
"""
from __future__ import annotations

import argparse
import sys

import pandas as pd

from analysis.registry import METRICS
from app.commands._common import add_db_argument, print_json, store_from

NAME = "analyze"
HELP = "compute K/V, Q/K and rank metrics of checkpoints (cached in the database)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("targets", nargs="*", metavar="PATH_OR_ID",
                        help="checkpoint file/folder (ingested first) or stored checkpoint id")
    add_db_argument(parser)
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None,
                        help="where to compute (default: cuda if available, else cpu)")
    parser.add_argument("--activations", action="store_true",
                        help="also run a forward pass on sample text for the activation metrics")
    parser.add_argument("--force", action="store_true", help="recompute even when results are stored")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a summary table")
    parser.add_argument("--list", action="store_true", help="list the metrics with their help and exit")


class _Bar:
    """A one-line progress bar on stderr (only when stderr is a terminal or asked for)."""

    def __init__(self, label: str, stream=sys.stderr):
        self.label, self.stream = label, stream

    def __call__(self, done: int, total: int, what: str) -> None:
        width = 24
        filled = width * done // max(total, 1)
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {what:<24}")
        if done >= total and what.endswith("done"):
            self.stream.write("\n")
        self.stream.flush()


def _payload(results) -> dict:
    first = results[0]
    frame = pd.concat([r.frame for r in results], ignore_index=True)
    notes: dict[str, str] = {}
    for r in results:
        notes.update(r.notes)
    metrics = [{"layer": int(row.layer), "head": None if pd.isna(row.head) else int(row.head),
                "metric": row.metric, "value": None if pd.isna(row.value) else float(row.value)}
               for row in frame.itertuples()]
    return {"checkpoint": {"id": first.checkpoint_id, "path": first.path},
            "metrics": metrics, "notes": notes, "cached": all(r.cached for r in results)}


def _print_table(payload: dict) -> None:
    ck = payload["checkpoint"]
    print(f"checkpoint {ck['id']}: {ck['path']}" + ("  (cached)" if payload["cached"] else ""))
    df = pd.DataFrame(payload["metrics"])
    if not df.empty:
        summary = df.groupby("metric", sort=False)["value"].agg(["count", "mean", "min", "max"])
        print(summary.to_string(float_format=lambda x: f"{x:.4g}"))
    for metric, why in sorted(payload["notes"].items()):
        print(f"  {metric}: {why}")


def run(args: argparse.Namespace) -> int:
    if args.list:
        for m in METRICS:
            print(f"{m.name:22} {m.level:11} {m.axis:10} {m.help}")
        return 0
    if not args.targets:
        print("error: give at least one PATH_OR_ID (or --list)", file=sys.stderr)
        return 2
    from app import jobs

    store = store_from(args)
    payloads = []
    for target in args.targets:
        cid = jobs.resolve(store, target)
        bar = _Bar(f"checkpoint {cid}")
        results = jobs.analyze(store, cid, activations=args.activations, device=args.device,
                               progress=bar, force=args.force)
        payloads.append(_payload(results))
    if args.json:
        print_json(payloads[0] if len(payloads) == 1 else payloads)
    else:
        for p in payloads:
            _print_table(p)
    return 0
