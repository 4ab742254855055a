"""Long CSV logs: columns ``step,metric,value`` (optionally ``wall_time``,
``tokens``), one point per row. Read by DuckDB (``_csv``); an empty value
cell is no point, one that is no number is a point without a value.
"""
from __future__ import annotations

from pathlib import Path

from loaders.errors import LogFormatError
from loaders.logs.base import (SOURCE_VIEW, Parsed, RunData, SqlPoints, empty_points, is_text_head,
                               metric_alias_sql)
from loaders.logs.readers._csv import (LONG_REQUIRED, TOKEN_COLUMNS, WALL_COLUMNS, CsvFile, cast_step,
                                       cast_tokens, cast_wall, classify_csv, column, pick, quote,
                                       read_csv_log)

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
    return {"fields": fields, "delim": delim, "step": low["step"], "metric": low["metric"],
            "value": low["value"], "wall": pick(fields, WALL_COLUMNS),
            "tokens": pick(fields, TOKEN_COLUMNS)}


def extract(source: CsvFile | None, state: dict) -> list[RunData]:
    if source is None:
        return [RunData(name="", points=empty_points())]
    col = {k: column(state, state[k]) for k in ("step", "metric", "value", "wall", "tokens")}
    select = f"""
        SELECT step, {metric_alias_sql("metric")} AS metric, value, wall_time, tokens FROM (
          SELECT {cast_step(col["step"])} AS step, {quote(col["metric"])} AS metric,
                 TRY_CAST({quote(col["value"])} AS DOUBLE) AS value,
                 {cast_wall(col["wall"])} AS wall_time, {cast_tokens(col["tokens"])} AS tokens,
                 {quote(col["value"])} AS raw
          FROM {SOURCE_VIEW})
        WHERE step IS NOT NULL AND metric IS NOT NULL AND raw IS NOT NULL"""
    return [RunData(name="", points=SqlPoints(source, select, timed=bool(col["wall"] or col["tokens"])))]


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    return read_csv_log(path, plan, extract, start=start, state=state, complete=complete)
