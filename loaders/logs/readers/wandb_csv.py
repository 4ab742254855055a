"""Weights & Biases CSV exports: a ``Step`` column and columns
``<run name> - <metric>`` with ``__MIN``/``__MAX`` companions (dropped: they
are the band around the same metric); one file holds many runs, one per
name. An export is rewritten, not appended: a changed file is read again.
A cell that is not a number is no point and is counted on the file's report
line (``_csv``).
"""
from __future__ import annotations

from pathlib import Path

from loaders.errors import LogFormatError
from loaders.logs.base import Parsed, RunData, SqlPoints, empty_points, is_text_head
from loaders.logs.readers._csv import (STEP_COLUMNS, WANDB_COL, CsvFile, classify_csv, column, pick,
                                       read_csv_log, unpivot_select, unread_select)

NAME = "wandb_csv"
PRIORITY = 50
HELP = "Weights & Biases CSV export: columns '<run> - <metric>' (+ __MIN/__MAX); many runs"
APPENDABLE = False
EXAMPLE = "exports/wandb_export_val_loss.csv"
ROWS_READ_BY_STORE = True


def sniff(path: Path, head: bytes) -> bool:
    return is_text_head(head) and classify_csv(path, head) == NAME


def plan(path: Path, fields: list[str], delim: str) -> dict:
    step = pick(fields, STEP_COLUMNS)
    runs: dict[str, list[list[str]]] = {}
    for f in fields:
        m = WANDB_COL.match(f)
        if m and not m.group("band"):
            runs.setdefault(m.group("run"), []).append([f, m.group("metric")])
    if step is None or not runs:
        raise LogFormatError(path, "expected a W&B export: a Step column and columns "
                                   f"'<run> - <metric>', found columns {fields[:10]}")
    return {"fields": fields, "delim": delim, "step": step, "runs": runs}


def extract(source: CsvFile | None, state: dict) -> list[RunData]:
    out = []
    for run, cols in state["runs"].items():
        if source is None:
            out.append(RunData(name=run, points=empty_points()))
            continue
        metrics = [(column(state, c), m) for c, m in cols]
        select, params = unpivot_select(column(state, state["step"]), metrics, None, None)
        unread = unread_select(column(state, state["step"]), [c for c, _ in metrics])
        out.append(RunData(name=run, points=SqlPoints(source, select, params, unread=unread)))
    return out


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    return read_csv_log(path, plan, extract, start=start, state=state, complete=complete)
