"""Wide CSV logs: a step column (``step``, ``global_step``, ``iter``, ...) and
one numeric column per metric.

A file without a step column but with ``epoch`` (paper B's per-epoch logs,
``epoch,train_loss,val_loss,val_top1,val_top5,epoch_time_sec,lr``; timm's
``summary.csv``) uses the epoch as its step axis, and the run's config says
``step_axis: "epoch"``. Read by DuckDB (``_csv``): each row's cells become
points in row-major order (UNPIVOT); an empty cell is no point, a cell that
is not a number is no point and is counted on the file's report line.

A column whose cells are text labels (``_csv.label_columns``: paper B's
``task,variant,step,loss_mean``) names runs: one run per combination of
the label columns' values (``task=COPY variant=QKV``), not a metric.
"""
from __future__ import annotations

from pathlib import Path

from loaders.errors import LogFormatError
from loaders.logs.base import Parsed, RunData, SqlPoints, empty_points, is_text_head
from loaders.logs.readers._csv import (STEP_COLUMNS, TOKEN_COLUMNS, WALL_COLUMNS, CsvFile, classify_csv,
                                       column, columns, head_text, label_columns, pick, read_csv_log, split_runs,
                                       step_column, unpivot_select, unread_select)

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
    others = [f for f in fields if f not in (step, wall, tokens) and f]
    text = head_text(path)
    labels = label_columns(text, delim, fields, others)
    metrics = [f for f in others if f not in labels]
    return {"fields": fields, "delim": delim, "step": step, "wall": wall, "tokens": tokens,
            "metrics": metrics, "labels": labels, "step_axis": axis}


def extract(source: CsvFile | None, state: dict) -> list[RunData]:
    config = {"step_axis": "epoch"} if state.get("step_axis") == "epoch" else {}
    if source is None:
        return [RunData(name="", points=empty_points(), config=config)]
    # ``metrics`` and ``labels`` are planned by this version; a state planned before has neither
    labels = state.get("labels") or []
    metrics = state.get("metrics") or [f for f in state["fields"] if f not in (
        state["step"], state["wall"], state["tokens"]) and f]
    names = columns(state)
    cols = [(names[f], f) for f in metrics if f not in labels]
    step, wall, tokens = (column(state, state[k]) for k in ("step", "wall", "tokens"))

    def run(where: str, params: dict) -> RunData:
        select, sel_params = unpivot_select(step, cols, wall, tokens, where)
        unread = unread_select(step, [c for c, _ in cols], where)
        return RunData(name="", points=SqlPoints(source, select, {**sel_params, **params},
                                                 unread=unread), config=dict(config))
    return split_runs(source, state, run)


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    return read_csv_log(path, plan, extract, start=start, state=state, complete=complete)
