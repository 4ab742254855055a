"""PyTorch Lightning ``CSVLogger`` logs: ``version_N/metrics.csv`` beside
``hparams.yaml``, a wide CSV with sparse columns (``epoch`` kept as a
metric). Read as ``csv_wide`` reads its files; a version folder given as the
path is read through its ``metrics.csv`` (``sniff_dir``). The folder's other
files (``hparams.yaml``, ``checkpoints/``) are walked as usual.
"""
from __future__ import annotations

from pathlib import Path

from loaders.logs.base import Parsed, is_text_head
from loaders.logs.readers import csv_wide
from loaders.logs.readers._csv import VERSION_DIR, classify_csv, read_csv_log

NAME = "lightning"
PRIORITY = 52
HELP = "PyTorch Lightning CSVLogger folder (version_N/metrics.csv + hparams.yaml)"
APPENDABLE = True
EXAMPLE = "lightning_logs/version_0/metrics.csv"
ROWS_READ_BY_STORE = True


def sniff_dir(folder: Path) -> Path | None:
    """``version_N/metrics.csv`` for a Lightning version folder, else None."""
    csv = folder / "metrics.csv"
    if csv.is_file() and ((folder / "hparams.yaml").is_file() or VERSION_DIR.match(folder.name)):
        return csv
    return None


def sniff(path: Path, head: bytes) -> bool:
    return is_text_head(head) and classify_csv(path, head) == NAME


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    return read_csv_log(path, csv_wide.plan, csv_wide.extract, start=start, state=state, complete=complete)
