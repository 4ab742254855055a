"""Arguments and output helpers shared by the command modules."""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from loaders.hub_names import resolve
from loaders.store import DB_ENV, Store


def add_db_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", type=Path, default=None,
                        help=f"database file (default: ${DB_ENV}, else data/qkvscope.duckdb in a checkout, "
                             "else qkvscope.duckdb in the user data folder)")


def add_download_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--download", action="store_true",
                        help="fetch a Hugging Face model name (org/name) that is not in the local cache: "
                             "config.json and safetensors only, never model code (default: the cache only)")


def add_figures_argument(parser: argparse.ArgumentParser) -> None:
    """``--figures DIR``, written by ``app.figures.write_figures`` (imported only when it is given)."""
    parser.add_argument("--figures", type=Path, default=None, metavar="DIR",
                        help="also write the main figures to DIR as SVG, PDF and PNG (plotly's export: "
                             "kaleido with the system's Chrome or Chromium)")


def checkpoint_path(name: str, download: bool = False) -> str:
    """A checkpoint argument as the path to read: a path that exists is itself; a Hugging
    Face repo id (``org/name``) or cache folder (``models--org--name``) is its snapshot
    in the local cache (``loaders.hub_names``), fetched first only with ``--download``."""
    path = resolve(name, download=download)
    return name if path == Path(name).expanduser() else str(path)   # a path as the user wrote it


def store_from(args: argparse.Namespace) -> Store:
    return Store(args.db)


def json_ready(obj):
    """``obj`` as the JSON every command prints: NaN/Inf become null, tuples lists, timestamps and
    paths strings (the notebook API returns the same)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if hasattr(obj, "item"):  # numpy / torch scalars
        return json_ready(obj.item())
    return str(obj)


def print_json(obj) -> None:
    json.dump(json_ready(obj), sys.stdout, indent=2, allow_nan=False)
    sys.stdout.write("\n")
