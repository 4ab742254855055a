"""Weights & Biases CSV exports: a ``Step`` column and columns
``<run name> - <metric>`` with ``__MIN``/``__MAX`` companions (dropped: they
are the band around the same metric); one file holds many runs, one per
name. An export is rewritten, not appended: a changed file is read again.

A sweep's export has thousands of columns (1,000 runs: 3,001), so the file
is read once for all its runs (``ExportCells``): DuckDB's ``read_csv`` and
one ``UNPIVOT`` put every metric cell into a temporary table of the store's
transaction, ordered by run, and each run's points and unreadable cells are
SELECTs of its own part of that table. Binding ``read_csv`` over 3,001
columns and reading them takes about a second: once per file, not once per run.

A cell that is not a number is no point and is counted on the file's report
line (``_csv``); a row whose step is not a number is counted once, however
many runs it holds cells of.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

import duckdb

from loaders.errors import LogFormatError
from loaders.logs.base import SOURCE_VIEW, Parsed, RunData, SqlPoints, empty_points, is_text_head, normalise_metric
from loaders.logs.readers._csv import (STEP_COLUMNS, WANDB_COL, CsvFile, cast_step, classify_csv, pick, quote,
                                       read_csv_log)

NAME = "wandb_csv"
PRIORITY = 50
HELP = "Weights & Biases CSV export: columns '<run> - <metric>' (+ __MIN/__MAX); many runs"
APPENDABLE = False
EXAMPLE = "exports/wandb_export_val_loss.csv"
ROWS_READ_BY_STORE = True

#: The file's view while ``ExportCells`` reads it into its table.
_FILE_VIEW = "qkv_wandb_file"


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


@dataclass(frozen=True)
class ExportCells:
    """Every metric cell of a W&B export, read once (a ``PointSource`` shared by its runs).

    The first call on a connection reads the file (``csv``) into the temporary
    table ``table``, one row per non-empty metric cell and one per non-empty
    step cell, sorted by (run, row, column) so that a run's SELECT reads only
    its own blocks:

    ``__run`` (index of the run, NULL for the step column), ``__rn`` (the
    row, in file order), ``__col`` (the column's index in the header),
    ``__step`` (the row's step as a number, NULL when it is not one),
    ``__value`` (the cell as a number, NULL when it is not one), ``__text``
    (the cell where it is not a number, and the step cell).

    Later calls on the same connection (the export's other runs) return the
    table. It lives as long as the connection: one store transaction.
    """

    csv: CsvFile
    step: int                              # index of the step column in the header
    cells: tuple[tuple[int, int], ...]     # (index in the header, run index) of each metric column
    table: str = field(default_factory=lambda: f"qkv_wandb_cells_{uuid.uuid4().hex}")

    def __call__(self, con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyRelation:
        made = con.execute("SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name = ?",
                           [self.table]).fetchall()[0][0]
        if not made:
            self._make(con)
        return con.table(self.table)

    def _make(self, con: duckdb.DuckDBPyConnection) -> None:
        # UNPIVOT drops NULL (empty) cells; the step column joins it, so that a
        # row whose step is not a number is seen even when its metric cells are empty.
        cols = [self.step, *(i for i, _ in self.cells)]
        names = self.csv.columns
        runs: list[int | None] = [None] * len(names)            # (fields,) run index per column
        for i, r in self.cells:
            runs[i] = r
        # On an error the store's transaction is rolled back with its connection, view included.
        con.register(_FILE_VIEW, self.csv(con))
        con.execute(f"""
            CREATE TEMP TABLE {self.table} AS
            SELECT list_extract($runs, __col + 1) AS __run, __rn, __col, __step,
                   TRY_CAST(__cell AS DOUBLE) AS __value,
                   CASE WHEN __col = {self.step} OR TRY_CAST(__cell AS DOUBLE) IS NULL THEN __cell END AS __text
            FROM (SELECT __rn, __step, CAST(substr(__name, 4) AS INTEGER) AS __col, __cell
                  FROM (SELECT row_number() OVER () AS __rn, {cast_step(names[self.step])} AS __step,
                               {", ".join(f"{quote(names[i])} AS __c{i}" for i in cols)}
                        FROM {_FILE_VIEW})
                  UNPIVOT (__cell FOR __name IN ({", ".join(f"__c{i}" for i in cols)})))
            ORDER BY __run NULLS FIRST, __rn, __col""", {"runs": runs})
        con.unregister(_FILE_VIEW)

    def changed(self) -> bool:
        return self.csv.changed()

    def frozen(self) -> ExportCells:
        return replace(self, csv=self.csv.frozen())


def run_points(cells: ExportCells, run: int, metrics: list[tuple[int, str]], *, first: bool) -> SqlPoints:
    """Run ``run``'s points of ``cells``, and its cells that are not numbers.

    ``metrics``: (index in the header, metric as logged) of its columns. Its
    points are its cells that are numbers in rows whose step is one, in file
    order (row, then column); the others are counted as ``unread_select``
    counts them (blank cells are empty ones). Rows without a step number are
    the file's, counted with the ``first`` run.
    """
    own = f"__run = {int(run)}"
    bad = f"{own} AND __step IS NOT NULL AND __value IS NULL AND trim(__text) <> ''"
    width = len(cells.csv.columns)
    select = f"""
        SELECT __step AS step, list_extract($metrics, list_position($cols, __col)) AS metric,
               __value AS value, NULL::DOUBLE AS wall_time, NULL::BIGINT AS tokens
        FROM {SOURCE_VIEW} WHERE {own} AND __step IS NOT NULL AND __value IS NOT NULL
        ORDER BY __rn, __col"""
    params = {"cols": [i for i, _ in metrics], "metrics": [normalise_metric(m) for _, m in metrics]}
    rows = f"(SELECT count(DISTINCT __rn) FROM {SOURCE_VIEW} WHERE __step IS NULL)" if first else "0"
    row_texts = f"""(SELECT coalesce(list(t ORDER BY f), []) FROM (
                        SELECT t, min(__rn) AS f FROM (
                            SELECT __rn, coalesce(max(__text) FILTER (WHERE __run IS NULL), '') AS t
                            FROM {SOURCE_VIEW} WHERE __step IS NULL GROUP BY __rn)
                        GROUP BY t ORDER BY f LIMIT 4))""" if first else "[]"
    counts = f"SELECT (SELECT count(*) FROM {SOURCE_VIEW} WHERE {bad}), {rows}"
    texts = f"""
        SELECT (SELECT coalesce(list(t ORDER BY f), []) FROM (
                   SELECT __text AS t, min(__rn * {width} + __col) AS f FROM {SOURCE_VIEW} WHERE {bad}
                   GROUP BY t ORDER BY f LIMIT 4)),
               {row_texts}"""
    return SqlPoints(cells, select, params, unread=(counts, texts))


def extract(source: CsvFile | None, state: dict) -> list[RunData]:
    if source is None:
        return [RunData(name=run, points=empty_points()) for run in state["runs"]]
    index: dict[str, int] = {}                                   # header field -> its (first) column
    for i, f in enumerate(state["fields"]):
        index.setdefault(f, i)
    runs = [[(index[f], m) for f, m in cols] for cols in state["runs"].values()]
    cells = ExportCells(source, index[state["step"]], tuple((i, r) for r, cols in enumerate(runs) for i, _ in cols))
    return [RunData(name=name, points=run_points(cells, r, runs[r], first=r == 0))
            for r, name in enumerate(state["runs"])]


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    return read_csv_log(path, plan, extract, start=start, state=state, complete=complete)
