"""Correct or add a run's metadata; the correction survives re-ingestion.

Fields: name, variant (qkv, wq_identity, q_eq_k, k_eq_v, q_eq_k_eq_v, unknown;
the papers' spellings such as Q-K=V or KEqualsV are accepted), n_kv_heads,
weight_decay, lr, seed, model_size, resumed, project (the project the pages compare
the run within); any other FIELD is kept in the
run's config. VALUE is parsed as JSON when it can be (numbers, true/false,
null), else taken as text. `--unset FIELD` removes a correction.

Example:
  python -m app run-meta 3 --set weight_decay=0.03 --set variant=k_eq_v --db my.duckdb
"""
from __future__ import annotations

import argparse
import json

from app.commands._common import add_db_argument, print_json, store_from
from loaders.errors import QkvscopeError
from loaders.logs import set_run_metadata

NAME = "run-meta"
HELP = "correct or add a run's metadata (variant, weight_decay, lr, ...)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", type=int, metavar="RUN_ID", help="run id (see `python -m app runs`)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="FIELD=VALUE",
                        help="set a field (repeatable)")
    parser.add_argument("--unset", dest="unsets", action="append", default=[], metavar="FIELD",
                        help="remove a correction (repeatable)")
    add_db_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the run as JSON")


def parse_assignment(text: str):
    """``FIELD=VALUE`` -> (field, value); VALUE as JSON when it parses, else text."""
    if "=" not in text:
        raise QkvscopeError(f"--set {text!r}: expected FIELD=VALUE")
    field, raw = text.split("=", 1)
    field = field.strip()
    if not field:
        raise QkvscopeError(f"--set {text!r}: expected FIELD=VALUE, found an empty FIELD")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return field, value


def run(args: argparse.Namespace) -> int:
    fields = dict(parse_assignment(s) for s in args.sets)
    for f in args.unsets:
        fields[f] = None
    row = set_run_metadata(store_from(args), args.run_id, **fields)
    if args.json:
        print_json(row)
        return 0
    for key in ("id", "name", "project", "variant", "n_kv_heads", "weight_decay", "lr", "seed", "model_size", "resumed"):
        print(f"{key:>13}: {row[key]}")
    print(f"{'overrides':>13}: {', '.join(row['overrides']) or '-'}")
    return 0
