"""Wide CSV logs: a step column (``step``, ``global_step``, ``iter``, ...) and
one numeric column per metric.

A file without a step column but with ``epoch`` (paper B's per-epoch logs,
``epoch,train_loss,val_loss,val_top1,val_top5,epoch_time_sec,lr``; timm's
``summary.csv``) uses the epoch as its step axis, and the run's config says
``step_axis: "epoch"``. Read by DuckDB (``_csv``): each row's cells become
points in row-major order (UNPIVOT); an empty cell is no point.
"""
from __future__ import annotations

from pathlib import Path

from loaders.errors import LogFormatError
from loaders.logs.base import Parsed, RunData, SqlPoints, empty_points, is_text_head
from loaders.logs.readers._csv import (STEP_COLUMNS, TOKEN_COLUMNS, WALL_COLUMNS, CsvFile, classify_csv,
                                       column, column_names, pick, read_csv_log, step_column,
                                       unpivot_select)

NAME = "csv_wide"
PRIORITY = 53
HELP = "CSV with a step column and one column per metric (step,train_loss,val_loss,...)"
APPENDABLE = True
EXAMPLE = "checkpoints_imagenet/vit_s16_imagenet_QKV.csv"
ROWS_READ_BY_STORE = True


def sniff(path: Path, head: bytes) -> bool:
    return is_text_head(head) and classify_csv(path, head) == NAME


def plan(path: Path, fields: list[str], delim: str) -> dict:
    step, axis = step_column(fields)
    if step is None:
        raise LogFormatError(path, f"expected a step column ({', '.join(STEP_COLUMNS[:5])}, ...) "
                                   f"or an epoch column, found columns {fields[:10]}")
    wall = pick(fields, WALL_COLUMNS)
    tokens = pick(fields, TOKEN_COLUMNS)
    metrics = [f for f in fields if f not in (step, wall, tokens) and f]
    return {"fields": fields, "delim": delim, "step": step, "wall": wall, "tokens": tokens,
            "metrics": metrics, "step_axis": axis}


def extract(source: CsvFile | None, state: dict) -> list[RunData]:
    config = {"step_axis": "epoch"} if state.get("step_axis") == "epoch" else {}
    if source is None:
        return [RunData(name="", points=empty_points(), config=config)]
    fields, cols = state["fields"], column_names(state["fields"])
    metrics = [(c, f) for c, f in zip(cols, fields) if f not in (state["step"], state["wall"],
                                                                  state["tokens"]) and f]
    select, params = unpivot_select(column(state, state["step"]), metrics, column(state, state["wall"]),
                                    column(state, state["tokens"]))
    timed = bool(state["wall"] or state["tokens"])
    return [RunData(name="", points=SqlPoints(source, select, params, timed=timed), config=config)]


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    return read_csv_log(path, plan, extract, start=start, state=state, complete=complete)
