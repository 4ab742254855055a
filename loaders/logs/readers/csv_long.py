"""Long CSV logs: columns ``step,metric,value`` (optionally ``wall_time``,
``tokens``), one point per row. Read by DuckDB (``_csv``); a value cell that
is empty or not a number is no point, and is counted on the file's report
line ("2 cells not numbers: n/a, ''").

Every other column (``run``, ``seed``, ``task,variant``) names runs: one run
per combination of their values (``seed=1 task=COPY``), in the order they
first appear. A column of dates or times is not one (a timestamp).
"""
from __future__ import annotations

from pathlib import Path

from loaders.errors import LogFormatError
from loaders.logs.base import (SOURCE_VIEW, Parsed, RunData, SqlPoints, empty_points, is_text_head,
                               metric_alias_sql)
from loaders.logs.readers._csv import (DATETIME, LONG_REQUIRED, TOKEN_COLUMNS, WALL_COLUMNS, CsvFile,
                                       cast_step, cast_tokens, cast_wall, classify_csv, column, head_text,
                                       pick, quote, read_csv_log, sample_rows, split_runs, unread_select)

NAME = "csv_long"
PRIORITY = 51
HELP = "CSV with columns step,metric,value (optionally wall_time, tokens)"
APPENDABLE = True
EXAMPLE = "runs/exp1/metrics_long.csv"
ROWS_READ_BY_STORE = True


def sniff(path: Path, head: bytes) -> bool:
    return is_text_head(head) and classify_csv(path, head) == NAME


def plan(path: Path, fields: list[str], delim: str) -> dict:
    low = {f.lower(): f for f in fields}
    missing = sorted(LONG_REQUIRED - set(low))
    if missing:
        raise LogFormatError(path, f"expected columns step, metric, value; missing {missing}")
    wall, tokens = pick(fields, WALL_COLUMNS), pick(fields, TOKEN_COLUMNS)
    own = {low["step"], low["metric"], low["value"], wall, tokens}
    rows = sample_rows(head_text(path), delim)
    labels = [f for i, f in enumerate(fields) if f and f not in own
              and not any(DATETIME.match(r[i].strip()) for r in rows if len(r) > i)]
    return {"fields": fields, "delim": delim, "step": low["step"], "metric": low["metric"],
            "value": low["value"], "wall": wall, "tokens": tokens, "labels": labels}


def extract(source: CsvFile | None, state: dict) -> list[RunData]:
    if source is None:
        return [RunData(name="", points=empty_points())]
    col = {k: column(state, state[k]) for k in ("step", "metric", "value", "wall", "tokens")}

    def run(where: str, params: dict) -> RunData:
        select = f"""
            SELECT step, {metric_alias_sql("metric")} AS metric, value, wall_time, tokens FROM (
              SELECT {cast_step(col["step"])} AS step, {quote(col["metric"])} AS metric,
                     TRY_CAST({quote(col["value"])} AS DOUBLE) AS value,
                     {cast_wall(col["wall"])} AS wall_time, {cast_tokens(col["tokens"])} AS tokens
              FROM {SOURCE_VIEW} WHERE {where})
            WHERE step IS NOT NULL AND metric IS NOT NULL AND value IS NOT NULL"""
        unread = unread_select(col["step"], [col["value"]], f"({where}) AND {quote(col['metric'])} IS NOT NULL",
                               empty_counts=True)
        return RunData(name="", points=SqlPoints(source, select, params, unread=unread))
    return split_runs(source, state, run)


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    return read_csv_log(path, plan, extract, start=start, state=state, complete=complete)
