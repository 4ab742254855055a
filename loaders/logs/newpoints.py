"""A run's new points inside the store transaction: inserted in one statement,
then checked and fixed in SQL.

Every reader's points reach ``points`` the same way. A CSV reader
hands over a SELECT over DuckDB's ``read_csv`` of the file (``SqlPoints``), so
a large log is parsed once, straight into the table; the other readers'
pandas/Arrow frames are registered as a view and read by the same INSERT.
What used to be checked in numpy before inserting is then asked of the
inserted rows:

* NaN becomes NULL on the way in; +-Inf is kept (a diverged run).
* Metric names a CSV reader left raw (``SqlPoints``) are normalised
  (``normalise_metric``): one UPDATE per distinct name that changes, none in
  the usual case. A frame's names are the reader's (the HF Trainer reader
  keeps the closing summary's ``train_loss`` apart from the curve).
* First and last step per metric (the journal's ``last``, appends that reach
  back) and the names: one GROUP BY. A run with no stored points and more
  than ``SUMMARY_AT_ONCE_POINTS`` new ones takes them from its ``run_stats``
  rows, computed at once (``refresh_run_stats``): in the usual case (no name
  to normalise, no repeat) they are already the run's summary, and the ingest
  does not compute it again (``stats_fresh``), so a large log is scanned once.
  A smaller run is summarised with the file's other runs when the file ends,
  in one statement for all (a sweep's export of 1,000 runs: 1,000 small runs).
* Steps that go back within a metric (a resumed run) and repeated (step,
  metric) pairs: one fetch of (step, metric code) in file order, checked in
  numpy (``went_back_and_repeats``). Then the point logged last wins: one
  DELETE of the earlier ones by rowid.

A run with no stored points gets its new points straight into ``points``: in
this transaction its rows there are exactly the new ones. Otherwise (a grown log, a
second file of a shared run) they are staged in a temporary table, so what is
new can be told from what was stored, and moved by ``move_staged``.

File order is scan order: DuckDB keeps insertion order unless
``preserve_insertion_order`` is off (checked; then rows are read ORDER BY
rowid, whose order is the insertion order either way).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from loaders.logs.base import SOURCE_VIEW, SqlPoints, Unread, normalise_metric
from loaders.store import refresh_run_stats

# Every result is fetched whole (fetchall): DuckDB refuses ``register`` while
# a result of the connection is unfinished.

#: Temporary table of new points that cannot go straight into ``points``.
STAGE = "qkv_new_points"
#: NaN (a diverged run) is stored as NULL, whatever the reader.
_VALUE = "CASE WHEN isnan(value) THEN NULL ELSE value END"
#: Up to this many metrics the code per point is computed in SQL
#: (``list_position`` is linear in the number of names); beyond, from Arrow.
_SQL_CODES_MAX = 64
#: A run with no stored points and more new points than this is summarised (``run_stats``) at
#: once, and its first and last steps read from the summary; a smaller one is summarised with
#: the file's other runs at the end of the file (``loaders.logs.ingest``).
SUMMARY_AT_ONCE_POINTS = 100_000
#: ``step * k + code`` (k <= _SQL_CODES_MAX) fits in int64 for steps below this in magnitude.
_KEY_STEP_LIMIT = 1 << 56


class FileChanged(Exception):
    """The file changed while DuckDB read it (a log being written): the
    transaction must be rolled back and the file read from a copy of the bytes
    planned for (``PointSource.frozen``)."""


@dataclass
class NewPoints:
    """Where a run's new points are in this transaction, and what they hold."""

    table: str                 # where they are now: points, or STAGE
    where: str                 # SQL condition for the new rows of ``table``
    params: dict               # its named parameters
    n: int = 0                 # points, after repeated ones were dropped
    first: dict[str, int] = field(default_factory=dict)   # metric -> lowest step
    last: dict[str, int] = field(default_factory=dict)    # metric -> highest step
    went_back: bool = False    # steps of some metric go back: a resumed run
    #: ``run_stats`` of the run already summarise its points (a run without
    #: stored points, left unchanged after its summary).
    stats_fresh: bool = False
    #: Cells of the source that are not numbers (``SqlPoints.unread``), for the report.
    unread: Unread = field(default_factory=Unread)

    @property
    def staged(self) -> bool:
        return self.table == STAGE


def insert_new_points(con: duckdb.DuckDBPyConnection, run_id: int, points, *,
                      direct: bool) -> NewPoints:
    """Insert ``points`` (``SqlPoints`` or a frame) for ``run_id`` and check them.

    ``direct``: the run has no stored points, so they go straight into
    ``points``; else into the ``STAGE`` table (see ``move_staged``).
    Errors of a ``SqlPoints`` file's content propagate as DuckDB raises them;
    ``FileChanged`` when its file changed while DuckDB read it.
    """
    # On an error the transaction is aborted and rolled back with its connection,
    # view included; nothing to undo here.
    select, params = _source_select(con, points)
    if direct:
        n = con.execute(f"INSERT INTO points SELECT $run_id, step, metric, {_VALUE}, wall_time, tokens "
                        f"FROM ({select})", {**params, "run_id": run_id}).fetchall()[0][0]
        new = NewPoints("points", "run_id = $run_id", {"run_id": run_id}, n)
    else:
        con.execute(f"""CREATE OR REPLACE TEMP TABLE {STAGE} (
                            step BIGINT, metric VARCHAR, value DOUBLE, wall_time DOUBLE, tokens BIGINT)""")
        n = con.execute(f"INSERT INTO {STAGE} SELECT step, metric, {_VALUE}, wall_time, tokens FROM ({select})",
                        params or None).fetchall()[0][0]
        new = NewPoints(STAGE, "true", {}, n)
    if isinstance(points, SqlPoints) and points.unread:
        new.unread = _unread(con, points)
    if isinstance(points, SqlPoints) and points.source.changed():
        raise FileChanged()
    con.unregister(SOURCE_VIEW)
    if new.n:
        _check(con, new, normalise=isinstance(points, SqlPoints))
    return new


def _unread(con, points: SqlPoints) -> Unread:
    """What ``points.select`` could not read of its source: counted in one pass,
    the texts fetched in a second only when there are some."""
    counts, texts = points.unread
    cells, rows = con.execute(counts, _used(counts, points.params)).fetchall()[0]
    if not cells and not rows:
        return Unread()
    cell_texts, row_texts = con.execute(texts, _used(texts, points.params)).fetchall()[0]
    return Unread(int(cells), list(cell_texts), int(rows), list(row_texts))


def _used(sql: str, params: dict) -> dict | None:
    """The named parameters of ``params`` that ``sql`` uses (DuckDB refuses others)."""
    return {k: v for k, v in params.items() if re.search(rf"\${re.escape(k)}\b", sql)} or None


def _source_select(con, points) -> tuple[str, dict]:
    """Register ``points`` as ``SOURCE_VIEW``; the SELECT of its points and its parameters."""
    if isinstance(points, SqlPoints):
        con.register(SOURCE_VIEW, points.source(con))
        return points.select, dict(points.params)
    con.register(SOURCE_VIEW, points)            # a pandas DataFrame or an Arrow table
    return (f"SELECT step, CAST(metric AS VARCHAR) AS metric, CAST(value AS DOUBLE) AS value, "
            f"wall_time, tokens FROM {SOURCE_VIEW}"), {}


def _check(con, new: NewPoints, *, normalise: bool) -> None:
    """Names, first/last steps, resumes and repeats of the new points (see the module docstring)."""
    table, where, params = new.table, new.where, new.params
    if new.staged or new.n <= SUMMARY_AT_ONCE_POINTS:
        rows = con.execute(f"SELECT metric, min(step), max(step) FROM {table} WHERE {where} GROUP BY metric "
                           "ORDER BY metric",
                           params or None).fetchall()
    else:                 # points holds exactly the run's new points: its summary has the same steps
        refresh_run_stats(con, [params["run_id"]])
        rows = con.execute("SELECT metric, first_step, last_step FROM run_stats WHERE run_id = $run_id "
                           "ORDER BY metric",
                           params).fetchall()
        new.stats_fresh = True
    for name, lo, hi in rows:
        norm = normalise_metric(name) if normalise else name
        if norm != name:
            con.execute(f"UPDATE {table} SET metric = $norm WHERE {where} AND metric = $name",
                        {**params, "norm": norm, "name": name})
            new.stats_fresh = False
        new.first[norm] = min(lo, new.first.get(norm, lo))
        new.last[norm] = max(hi, new.last.get(norm, hi))
    went_back, repeats = _went_back_and_repeats_of(con, new)
    if went_back or repeats:
        # Latest wins: of the points of one (step, metric), keep the one logged last.
        new.n -= con.execute(
            f"""DELETE FROM {table} WHERE {where} AND rowid IN (
                    SELECT rowid FROM {table} WHERE {where}
                    QUALIFY row_number() OVER (PARTITION BY step, metric ORDER BY rowid DESC) > 1)""",
            params or None).fetchall()[0][0]
        new.stats_fresh = False
    new.went_back = went_back


def _went_back_and_repeats_of(con, new: NewPoints) -> tuple[bool, bool]:
    """``went_back_and_repeats`` of the new points, fetched in file order.

    Usually (a wide row per step, or a long log that lists a step's metrics
    in one order) one int64 per point settles it: ``key = step * k + code``,
    with codes numbered in the order the first points list the metrics. If
    ``key`` strictly increases, then for two points i < j of one metric
    ``step_j > step_i``: nothing goes back and nothing repeats. Only when it
    does not are steps and codes (``key // k``, ``key % k``) checked whole.
    """
    order = "" if con.execute("SELECT current_setting('preserve_insertion_order')").fetchall()[0][0] \
        else " ORDER BY rowid"
    names = sorted(new.first)
    k = len(names)
    span = max(max(map(abs, new.first.values()), default=0), max(map(abs, new.last.values()), default=0))
    if not 2 <= k <= _SQL_CODES_MAX or span >= _KEY_STEP_LIMIT:
        return went_back_and_repeats(*_steps_and_codes(con, new, names, order))
    table, where, params = new.table, new.where, new.params
    first = con.execute(f"SELECT metric FROM {table} WHERE {where}{order} LIMIT {k}", params or None).fetchall()
    listed = list(dict.fromkeys(m for (m,) in first))
    names = listed + sorted(set(names) - set(listed))               # (k,) code = position here
    got = con.execute(f"SELECT step * {k} + (list_position($names, metric) - 1) AS key FROM {table} "
                      f"WHERE {where}{order}", {**params, "names": names}).fetchnumpy()
    key = np.asarray(got["key"], dtype=np.int64)                    # (n,) file order
    if bool(np.all(key[1:] > key[:-1])):
        return False, False
    return went_back_and_repeats(key // k, (key % k).astype(np.uint8))


def _steps_and_codes(con, new: NewPoints, names: list[str], order: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(step per point, metric code per point or None for one metric), in file order."""
    table, where, params = new.table, new.where, new.params
    if len(names) <= 1:
        got = con.execute(f"SELECT step FROM {table} WHERE {where}{order}", params or None).fetchnumpy()
        return np.asarray(got["step"], dtype=np.int64), None
    if len(names) <= _SQL_CODES_MAX:
        got = con.execute(f"SELECT step, (list_position($names, metric) - 1)::UTINYINT AS code FROM {table} "
                          f"WHERE {where}{order}", {**params, "names": names}).fetchnumpy()
        return np.asarray(got["step"], dtype=np.int64), np.asarray(got["code"])
    tbl = con.sql(f"SELECT step, metric FROM {table} WHERE {where}{order}", params=params or None).to_arrow_table()
    codes = pc.dictionary_encode(tbl.column("metric")).combine_chunks().indices
    return tbl.column("step").to_numpy(), codes.to_numpy(zero_copy_only=False)


def went_back_and_repeats(steps: np.ndarray, codes: np.ndarray | None) -> tuple[bool, bool]:
    """(steps of some metric go back, some metric logs one step twice in a row),
    points in file order. Unless its steps go back, a metric logs a step twice
    in a row exactly when it logs it twice; either way the run needs the
    latest point per (step, metric) kept.

    ``steps``: (n,) int64; ``codes``: (n,) one integer >= 0 per metric, or None
    when all points are of one metric.
    """
    if len(steps) < 2 or bool(np.all(steps[1:] > steps[:-1])):   # strictly increasing overall
        return False, False
    if codes is None:
        return bool(np.any(steps[1:] < steps[:-1])), bool(np.any(steps[1:] == steps[:-1]))
    top = int(codes.max(initial=0))
    if top < 64 and bool(np.all(steps[1:] >= steps[:-1])):
        # No step goes back overall, so none within a metric; a (step, metric)
        # repeats only inside a block of equal steps (a wide row, one step of a
        # long CSV): there, as many points as distinct metrics, or a repeat.
        width = next(t for t in (np.uint8, np.uint16, np.uint32, np.uint64) if top < np.iinfo(t).bits)
        bits = np.left_shift(width(1), codes.astype(width, copy=False))         # (n,) one bit per metric
        starts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]])          # (blocks,)
        distinct = np.bitwise_count(np.bitwise_or.reduceat(bits, starts))      # (blocks,)
        return False, bool(np.any(np.diff(np.r_[starts, len(steps)]) != distinct))
    order = np.argsort(codes, kind="stable")         # (n,) grouped by metric, file order kept within
    steps, codes = steps[order], codes[order]
    same = codes[1:] == codes[:-1]                   # (n-1,) neighbours of one metric
    back = same & (steps[1:] < steps[:-1])
    repeat = same & (steps[1:] == steps[:-1])
    return bool(back.any()), bool(repeat.any())


def replace_stored(con, run_id: int) -> int:
    """Delete the stored points of ``run_id`` that the staged points log again; how many."""
    n_old = con.execute(
        f"""SELECT count(*) FROM points p, (SELECT DISTINCT step, metric FROM {STAGE}) n
            WHERE p.run_id = $run_id AND p.step = n.step AND p.metric = n.metric""",
        {"run_id": run_id}).fetchall()[0][0]
    if n_old:
        con.execute(f"DELETE FROM points WHERE run_id = $run_id AND (step, metric) IN (SELECT (step, metric) FROM {STAGE})",
                    {"run_id": run_id})
    return n_old


def drop_points(con, run_ids) -> None:
    """Delete every stored point of ``run_ids`` (a rewritten file's runs, before it is read again)."""
    con.execute("DELETE FROM points WHERE run_id IN (SELECT unnest(?::INTEGER[]))", [list(run_ids)])


def move_staged(con, run_id: int, new: NewPoints) -> None:
    """Insert the staged points for ``run_id`` into ``points`` and drop the stage."""
    con.execute(f"INSERT INTO points SELECT $run_id, step, metric, value, wall_time, tokens FROM {STAGE}",
                {"run_id": run_id})
    con.execute(f"DROP TABLE {STAGE}")
