"""The DuckDB store: schema, migrations, connections, transactions.

One file holds everything (DESIGN.md, "Store"). DuckDB lets one process write
a file at a time, so nothing here keeps a connection open for long: every
operation opens a connection, does its work inside one transaction and closes
it. A second process that finds the file locked retries with back-off for
``busy_timeout`` seconds, then raises ``DatabaseBusyError``. That is what lets
``python -m app ingest`` run while the dashboard serves the same file.

Values always go in as parameters, never formatted into SQL.

Schema versions are a list of migrations; ``open`` applies the missing ones in
one transaction, so a file written by an older qkvscope is upgraded in place
and a failed upgrade leaves it as it was.
"""
from __future__ import annotations

import contextlib
import os
import random
import time
from pathlib import Path
from typing import Iterator

import duckdb

from loaders.bundled import DB_ENV, default_db_path  # noqa: F401  (importers of the store find them here)
from loaders.errors import DatabaseBusyError, StoreError
from loaders import duck


#: The summary of points per (run, metric), in ``run_stats``' column order; ``{where}``
#: narrows the runs. ``fv`` is the value where it is finite, else NULL: ``isfinite`` is
#: evaluated once per point, not once per aggregate (11 ms of 30 on a 2M-point run), and
#: NaN, +-Inf and NULL drop out of ``min``/``max``/``arg_min``/``arg_max`` by themselves.
#: The non-finite count is then the values (NaN and +-Inf) minus the finite ones.
#: Migration 8 fills ``run_stats`` with this text: a later change to it keeps a copy for
#: migration 8, as ``_RUN_STATS_SELECT_3`` keeps migration 3's.
RUN_STATS_SELECT = """
    SELECT run_id, metric, count(*), count(value), count(value) - count(fv),
           min(step), max(step),
           max(step) FILTER (WHERE fv IS NOT NULL),
           arg_max(fv, step) FILTER (WHERE fv IS NOT NULL),
           min(fv),
           arg_min(step, fv),
           max(fv),
           arg_max(step, fv)
    FROM (SELECT run_id, metric, step, value, CASE WHEN isfinite(value) THEN value END AS fv
          FROM points {where}) GROUP BY run_id, metric"""
#: ``run_stats`` as schema 3 made it (without ``top``, ``top_step``): what migration 3
#: fills it with, kept as it was released.
_RUN_STATS_SELECT_3 = """
    SELECT run_id, metric, count(*), count(value), count(value) - count(fv),
           min(step), max(step),
           max(step) FILTER (WHERE fv IS NOT NULL),
           arg_max(fv, step) FILTER (WHERE fv IS NOT NULL),
           min(fv),
           arg_min(step, fv)
    FROM (SELECT run_id, metric, step, value, CASE WHEN isfinite(value) THEN value END AS fv
          FROM points {where}) GROUP BY run_id, metric"""

# Each entry: (version, statements). Append only; never edit a released entry.
MIGRATIONS: list[tuple[int, list[str]]] = [
    (1, [
        """CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR)""",
        """CREATE SEQUENCE run_ids START 1""",
        """CREATE TABLE runs (
            id INTEGER PRIMARY KEY DEFAULT nextval('run_ids'),
            name VARCHAR NOT NULL,
            source VARCHAR NOT NULL,          -- file or folder the run came from
            format VARCHAR NOT NULL,          -- log reader name
            variant VARCHAR NOT NULL DEFAULT 'unknown',
            n_kv_heads INTEGER,
            weight_decay DOUBLE,
            lr DOUBLE,
            seed BIGINT,
            model_size BIGINT,
            config JSON,
            resumed BOOLEAN NOT NULL DEFAULT false,
            created_at TIMESTAMP NOT NULL DEFAULT current_timestamp,
            UNIQUE (source, name)
        )""",
        # User corrections of run metadata; applied over what ingest found, so
        # they survive re-ingestion.
        """CREATE TABLE run_overrides (
            run_id INTEGER NOT NULL,
            field VARCHAR NOT NULL,
            value JSON,
            updated_at TIMESTAMP NOT NULL DEFAULT current_timestamp,
            PRIMARY KEY (run_id, field)
        )""",
        # One row per (run, step, metric). No key and no index: appends must
        # stay fast, and points arrive run by run, so DuckDB's per-row-group
        # min/max already skips most of the table for ``WHERE run_id = ?``.
        """CREATE TABLE points (
            run_id INTEGER NOT NULL,
            step BIGINT NOT NULL,
            metric VARCHAR NOT NULL,
            value DOUBLE,
            wall_time DOUBLE,
            tokens BIGINT
        )""",
        # What was read from each file, so re-ingesting adds nothing and a
        # grown log appends only its new part.
        """CREATE TABLE ingest_journal (
            path VARCHAR PRIMARY KEY,
            kind VARCHAR NOT NULL,            -- 'log' or 'checkpoint'
            format VARCHAR,
            size BIGINT NOT NULL,
            mtime DOUBLE NOT NULL,
            sha256 VARCHAR,
            read_bytes BIGINT,                -- how far a text log was consumed
            state JSON,                       -- reader state for appends
            ingested_at TIMESTAMP NOT NULL DEFAULT current_timestamp
        )""",
        """CREATE SEQUENCE checkpoint_ids START 1""",
        """CREATE TABLE checkpoints (
            id INTEGER PRIMARY KEY DEFAULT nextval('checkpoint_ids'),
            path VARCHAR NOT NULL,
            sha256 VARCHAR NOT NULL UNIQUE,
            size BIGINT,
            architecture VARCHAR NOT NULL,
            variant VARCHAR NOT NULL,
            n_layers INTEGER NOT NULL,
            n_heads INTEGER NOT NULL,
            n_kv_heads INTEGER NOT NULL,
            d_model INTEGER NOT NULL,
            d_head INTEGER NOT NULL,
            norm VARCHAR,
            positions VARCHAR,
            attn_scale DOUBLE,
            dtype VARCHAR,
            params_total BIGINT,
            params_attention BIGINT,
            kv_bytes_per_token BIGINT,
            nonfinite BIGINT NOT NULL DEFAULT 0,  -- NaN/Inf count in attention weights
            run_id INTEGER,
            step BIGINT,
            config JSON,
            ingested_at TIMESTAMP NOT NULL DEFAULT current_timestamp
        )""",
        """CREATE TABLE analysis_results (
            checkpoint_id INTEGER NOT NULL,
            layer INTEGER,                     -- NULL: whole model
            head INTEGER,                      -- NULL: whole layer
            metric VARCHAR NOT NULL,
            value DOUBLE,                      -- NULL: not defined (see analysis_notes)
            metric_version INTEGER NOT NULL,
            computed_at TIMESTAMP NOT NULL DEFAULT current_timestamp
        )""",
        # One row per finished analysis job: a cache key, and why metrics are absent.
        """CREATE TABLE analysis_jobs (
            checkpoint_id INTEGER NOT NULL,
            kind VARCHAR NOT NULL,             -- 'weights' or 'activations'
            metric_version INTEGER NOT NULL,
            device VARCHAR,
            seconds DOUBLE,
            notes JSON,                        -- {metric: reason it is absent}
            computed_at TIMESTAMP NOT NULL DEFAULT current_timestamp,
            PRIMARY KEY (checkpoint_id, kind, metric_version)
        )""",
        """CREATE INDEX results_ckpt ON analysis_results (checkpoint_id, metric)""",
    ]),
    (2, [
        # Where batch analysis (app.batch) wrote each result as Parquet: a local
        # file or an object-storage URL, readable with read_parquet(location).
        """CREATE TABLE analysis_result_files (
            checkpoint_id INTEGER NOT NULL,
            kind VARCHAR NOT NULL,             -- 'weights' or 'activations'
            metric_version INTEGER NOT NULL,
            sha256 VARCHAR NOT NULL,           -- the checkpoint's content hash (the partition key)
            location VARCHAR NOT NULL,         -- .../part.parquet: layer, head, metric, value
            job_location VARCHAR NOT NULL,     -- .../job.parquet: notes, seconds, device
            n_rows BIGINT NOT NULL,
            registered_at TIMESTAMP NOT NULL DEFAULT current_timestamp,
            PRIMARY KEY (checkpoint_id, kind, metric_version)
        )""",
    ]),
    (3, [
        # Per (run, metric) summary of ``points``, kept in the same transaction
        # as every write to points (``refresh_run_stats``), so listing runs and
        # final values never scans the whole points table.
        """CREATE TABLE run_stats (
            run_id INTEGER NOT NULL,
            metric VARCHAR NOT NULL,
            n BIGINT NOT NULL,                 -- points, NULL values included
            n_values BIGINT NOT NULL,          -- points with a value (NaN is stored as NULL)
            nonfinite BIGINT NOT NULL,         -- +-Inf values (a diverged run)
            first_step BIGINT,
            last_step BIGINT,
            final_step BIGINT,                 -- highest step with a finite value
            final DOUBLE,                      -- the finite value at final_step
            best DOUBLE,                       -- lowest finite value
            best_step BIGINT,
            PRIMARY KEY (run_id, metric)
        )""",
        "INSERT INTO run_stats " + _RUN_STATS_SELECT_3.format(where=""),
    ]),
    (4, [
        # What each result means (issue "Numbers a researcher can trust"): the
        # value independent projections of the same shapes give, how many sample
        # tokens stand behind an activation value, and its 95% interval.
        "ALTER TABLE analysis_results ADD COLUMN chance DOUBLE",      # NULL: no chance level defined
        "ALTER TABLE analysis_results ADD COLUMN n_tokens BIGINT",    # NULL: a weight metric
        "ALTER TABLE analysis_results ADD COLUMN ci_low DOUBLE",      # NULL: not sampled
        "ALTER TABLE analysis_results ADD COLUMN ci_high DOUBLE",
        # The sample an activation job ran on ({"text", "tokens", "context", ...}): part of
        # its cache key, so another text or token count is computed, not read back.
        "ALTER TABLE analysis_jobs ADD COLUMN sample JSON",
        # A weights job's ties read from the tensors (analysis.tied): {"variant", "layers": [...]}.
        "ALTER TABLE analysis_jobs ADD COLUMN tied JSON",
    ]),
    (5, [
        # Which tower each layer belongs to, for checkpoints of several attention stacks
        # (CLIP/SigLIP vision and text): ModelMeta.towers as [{"name", "first_layer", "n_layers",
        # "n_heads", "n_kv_heads", "d_model", "d_head"}, ...]; NULL or [] for one stack. Result rows
        # keep the checkpoint's layer numbering; a layer's tower is the entry whose range holds it.
        "ALTER TABLE checkpoints ADD COLUMN towers JSON",
    ]),
    (6, [
        # Whether lower or higher is better for a logged metric, where the user set it on the
        # Experiments page (analysis.directions reads the name otherwise): 'min' or 'max'.
        """CREATE TABLE metric_directions (
            metric    VARCHAR PRIMARY KEY,
            direction VARCHAR NOT NULL CHECK (direction IN ('min', 'max'))
        )""",
    ]),
    (7, [
        # Points logged without a wall time or a token count (most CSVs) are stored without
        # those two columns: DuckDB analyses every column of every row group it writes, and
        # two all-NULL columns cost 0.06 s of 0.28 per 2M points (wide CSV ingest).
        # ``points`` becomes the view every reader already queries; writers pick the table.
        # The rename moves no data: what was stored stays in points_full.
        "ALTER TABLE points RENAME TO points_full",
        """CREATE TABLE points_lean (
            run_id INTEGER NOT NULL,
            step BIGINT NOT NULL,
            metric VARCHAR NOT NULL,
            value DOUBLE
        )""",
        """CREATE VIEW points AS
            SELECT run_id, step, metric, value, wall_time, tokens FROM points_full
            UNION ALL
            SELECT run_id, step, metric, value, NULL::DOUBLE AS wall_time, NULL::BIGINT AS tokens
            FROM points_lean""",
    ]),
    (8, [
        # Each run's highest finite value of each metric, kept like its lowest: the best value
        # of an accuracy (Experiments' final values, ViT runs) and the Results table's max read
        # the summary instead of grouping every point (on 2,000 runs x 50,000 steps: 1.3-2.2 s
        # and 2.9-4.0 s a read). The summary is derived data: rebuilt from the points.
        "ALTER TABLE run_stats ADD COLUMN top DOUBLE",          # highest finite value (an accuracy's best)
        "ALTER TABLE run_stats ADD COLUMN top_step BIGINT",     # its step
        "DELETE FROM run_stats",
        "INSERT INTO run_stats " + RUN_STATS_SELECT.format(where=""),
    ]),
    (9, [
        # The project a run or checkpoint belongs to (``loaders.projects``): what ingest was told
        # (``--project``), the tracker's own project name, or the name of the folder ingested.
        # Pages compare runs of one project only. Rows stored before are given the folder above
        # their run's folder (a run's log: .../PROJECT/RUN/log) and a checkpoint its run's project,
        # else the folder above its own (.../PROJECT/checkpoint).
        "ALTER TABLE runs ADD COLUMN project VARCHAR",
        "ALTER TABLE checkpoints ADD COLUMN project VARCHAR",
        """UPDATE runs SET project = coalesce(nullif(list_extract(string_split(source, '/'), -3), ''),
                                              nullif(list_extract(string_split(source, '/'), -2), ''))""",
        """UPDATE checkpoints SET project = coalesce(
               (SELECT r.project FROM runs r WHERE r.id = checkpoints.run_id),
               nullif(list_extract(string_split(path, '/'), -2), ''))""",
    ]),
    (10, [
        # Chance as a distribution and "above chance" as a test: the null band (2.5% and 97.5%
        # quantiles of the null draws), the Benjamini-Hochberg call (NULL: not tested) and whether
        # the value is fixed by construction (a tie, rank deficiency, too few tokens).
        "ALTER TABLE analysis_results ADD COLUMN chance_low DOUBLE",
        "ALTER TABLE analysis_results ADD COLUMN chance_high DOUBLE",
        "ALTER TABLE analysis_results ADD COLUMN above_chance BOOLEAN",
        "ALTER TABLE analysis_results ADD COLUMN degenerate BOOLEAN DEFAULT false",
    ]),
    (11, [
        # One points table again: storing points without time columns in a table of their own
        # (schema 7) saved no wait a user sees (docs/performance.md, "Speed mechanisms"). Those
        # rows join the others, after them (so of a step stored in both, theirs stays the later
        # one), with NULL wall_time and tokens; the view goes and the table takes its name.
        "DROP VIEW points",
        "INSERT INTO points_full SELECT run_id, step, metric, value, NULL, NULL FROM points_lean",
        "DROP TABLE points_lean",
        "ALTER TABLE points_full RENAME TO points",
    ]),
    (12, [
        # Metrics of pairs: a cross-layer value is the row (layer, layer2) with head NULL, a
        # cross-head value the row (layer, head, head2); NULL on every other row.
        "ALTER TABLE analysis_results ADD COLUMN layer2 INTEGER",
        "ALTER TABLE analysis_results ADD COLUMN head2 INTEGER",
    ]),
]

def refresh_run_stats(con: duckdb.DuckDBPyConnection, run_ids) -> None:
    """Recompute ``run_stats`` of these runs; call inside the transaction that
    changed their points."""
    ids = sorted({int(i) for i in run_ids})
    if not ids:
        return
    # One run (every ingest of a one-run log): ``=`` scans without the semi-join.
    where, arg = ("run_id = ?", ids[0]) if len(ids) == 1 else ("run_id IN (SELECT unnest(?::INTEGER[]))", ids)
    con.execute(f"DELETE FROM run_stats WHERE {where}", [arg])
    con.execute("INSERT INTO run_stats " + RUN_STATS_SELECT.format(where=f"WHERE {where}"), [arg])

SCHEMA_VERSION = MIGRATIONS[-1][0]



def _is_lock_error(exc: Exception) -> bool:
    msg = str(exc).lower()
    return "lock" in msg or "could not set lock" in msg or "conflicting" in msg


#: The first bytes of an SQLite database (its header string).
_SQLITE_MAGIC = b"SQLite format 3\x00"


def _check_database_file(path: Path) -> None:
    """A ``StoreError`` for a path that exists and is not a regular file (a FIFO would block the
    open forever, a folder gives a raw error). Only ``stat``: opening and closing the file here
    would drop the POSIX locks DuckDB holds on it in this process (closing any descriptor of a
    file releases them), letting another process write at the same time."""
    if path.exists() and not path.is_file():
        raise StoreError(f"{path}: not a regular file; give --db a DuckDB file, or a new path to create one")


def _not_duckdb(path: Path, exc: Exception) -> StoreError:
    """The error for a file DuckDB cannot open: an SQLite file named as such (DuckDB would reach
    for its sqlite extension), else DuckDB's own message. Read only after the open failed, so
    this process holds no DuckDB lock on the file to lose."""
    try:
        with open(path, "rb") as f:
            sqlite = f.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
    except OSError:
        sqlite = False
    if sqlite:
        return StoreError(f"{path}: not a DuckDB database (an SQLite file); give --db a DuckDB file, "
                          "or a new path to create one")
    return StoreError(f"{path}: cannot open database: {exc}")


#: The files this process found at the current schema, each as ``_file_state`` saw it then. A
#: ``Store`` made later for the same unchanged file (each cached read of a page makes one) skips
#: the check and the connection it needs: a DuckDB open builds its catalog anew, ~10 ms of CPU,
#: and without this half of a page's opens would be such checks. A write to the file or its WAL
#: (another process's ingest, a file copied over it) changes the state, and the next ``Store``
#: checks again. One state per file (its real path): the last one found current.
_CURRENT: dict[str, tuple] = {}


def _file_state(path: Path) -> tuple | None:
    """``(real path, device, inode, mtime_ns, size)`` of the file and ``(mtime_ns, size)`` of its
    WAL (zeros where there is none); None where the file is not there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    try:
        wal = os.stat(f"{path}.wal")
        wal_state = (wal.st_mtime_ns, wal.st_size)
    except OSError:
        wal_state = (0, 0)
    return (os.path.realpath(path), st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, *wal_state)


class Store:
    """A qkvscope database file. Cheap to create; connections are short-lived.

    ``with store.connect() as con:`` gives a connection for reads;
    ``with store.transaction() as con:`` one whose work commits at the end of
    the block or rolls back entirely on any exception.
    """

    def __init__(self, path: str | Path | None = None, *, busy_timeout: float = 30.0):
        self.path = Path(path).expanduser() if path is not None else default_db_path()
        self.busy_timeout = busy_timeout
        self._migrated = False

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r})"

    # -- connections -------------------------------------------------------
    def writable(self) -> bool:
        """Whether this process may write the database: the file (where it exists) and its folder,
        which gets DuckDB's write-ahead log (False on a read-only mount or without permission)."""
        folder = self.path.parent if self.path.parent.exists() else Path(".")
        return os.access(folder, os.W_OK) and (not self.path.exists() or os.access(self.path, os.W_OK))

    def _open(self, read_only: bool) -> duckdb.DuckDBPyConnection:
        if read_only and not self.path.exists():
            raise StoreError(f"{self.path}: no database here yet (run `python -m app ingest PATH --db {self.path}`)")
        _check_database_file(self.path)
        if not read_only and self.path.exists() and not self.writable():
            raise StoreError(f"{self.path}: the database is read-only here (a read-only mount or no write "
                             "permission on it or its folder): it can be browsed, not written; copy it to a "
                             "writable place to store into it")
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.busy_timeout
        delay = 0.02
        while True:
            try:
                con = duck.connect(str(self.path), read_only=read_only)
                # a query over ~2 s would draw DuckDB's progress bar into the server's log
                con.execute("SET enable_progress_bar = false")
                return con
            except duckdb.IOException as exc:
                if not _is_lock_error(exc):
                    raise _not_duckdb(self.path, exc) from exc
                if time.monotonic() >= deadline:
                    raise DatabaseBusyError(
                        f"{self.path}: database is busy (another qkvscope process is writing); "
                        f"gave up after {self.busy_timeout:g} s, try again when it finishes"
                    ) from exc
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 0.5)
            except duckdb.Error as exc:
                raise StoreError(f"{self.path}: not a readable DuckDB database: {exc}") from exc

    @contextlib.contextmanager
    def connect(self, *, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short-lived connection, migrated to the current schema. A database this process
        cannot write (``writable``) is opened read-only, when its schema is current: it can be
        browsed; ``transaction`` refuses to write it with one line."""
        if not self._migrated:
            self.migrate()
        con = self._open(read_only or not self.writable())
        try:
            yield con
        finally:
            con.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """One all-or-nothing transaction on a fresh connection."""
        if self.path.exists() and not self.writable():
            self._open(read_only=False)           # the one-line error of a read-only database
        with self.connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                yield con
                con.execute("COMMIT")
            except (duckdb.Error, OSError) as exc:
                _rollback(con)
                full = disk_full(self.path, exc)
                if full is None:
                    raise
                raise full from None
            except BaseException:
                _rollback(con)
                raise

    # -- schema ------------------------------------------------------------
    def schema_version(self, con: duckdb.DuckDBPyConnection | None = None) -> int:
        def read(c: duckdb.DuckDBPyConnection) -> int:
            has_meta = c.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_name = 'meta'"
            ).fetchone()[0]
            if not has_meta:
                return 0
            row = c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            return int(row[0]) if row else 0
        if con is not None:
            return read(con)
        con = self._open(read_only=False)
        try:
            return read(con)
        finally:
            con.close()

    def _check_schema_read_only(self) -> None:
        """A read-only database is browsed only at the schema this qkvscope reads (it cannot migrate it)."""
        con = self._open(read_only=True)
        try:
            current = self.schema_version(con)
        finally:
            con.close()
        if current != SCHEMA_VERSION:
            raise StoreError(f"{self.path}: the database is read-only here and at schema version {current}; "
                             f"this qkvscope reads version {SCHEMA_VERSION}: open it once where it can be written")

    def migrate(self) -> int:
        """Apply missing migrations in one transaction; returns the version. A database that
        cannot be written is only checked to be at the current version. A file this process
        already found current, unchanged since (``_CURRENT``), is not opened."""
        state = _file_state(self.path)
        if state is not None and _CURRENT.get(state[0]) == state:
            self._migrated = True
            return SCHEMA_VERSION
        if self.path.exists() and not self.writable():
            self._check_schema_read_only()
            self._current()
            return SCHEMA_VERSION
        con = self._open(read_only=False)
        try:
            current = self.schema_version(con)
            if current > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: database schema version {current} is newer than this "
                    f"qkvscope understands ({SCHEMA_VERSION}); upgrade qkvscope")
            if current < SCHEMA_VERSION:
                con.execute("BEGIN TRANSACTION")
                try:
                    for version, statements in MIGRATIONS:
                        if version <= current:
                            continue
                        for sql in statements:
                            con.execute(sql)
                        con.execute(
                            "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(version)])
                except BaseException:
                    con.execute("ROLLBACK")
                    raise
                con.execute("COMMIT")
        finally:
            con.close()
        self._current()
        return SCHEMA_VERSION

    def _current(self) -> None:
        """Remember that this file is at the current schema, as it is now (after the connection
        that checked it closed)."""
        self._migrated = True
        state = _file_state(self.path)
        if state is not None:
            _CURRENT[state[0]] = state

    # -- checkpoints ---------------------------------------------------------
    CHECKPOINT_FIELDS = (
        "id", "path", "sha256", "size", "architecture", "variant", "n_layers", "n_heads",
        "n_kv_heads", "d_model", "d_head", "norm", "positions", "attn_scale", "dtype",
        "params_total", "params_attention", "kv_bytes_per_token", "nonfinite", "run_id",
        "step", "project", "ingested_at",
    )

    def checkpoints(self, con: duckdb.DuckDBPyConnection | None = None) -> list[dict]:
        """Every stored checkpoint, oldest first, as plain dicts."""
        sql = f"SELECT {', '.join(self.CHECKPOINT_FIELDS)} FROM checkpoints ORDER BY id"
        if con is None:
            with self.connect() as c:
                return _rows(c.execute(sql))
        return _rows(con.execute(sql))


    def checkpoint(self, checkpoint_id: int) -> dict:
        """``id, path, architecture, variant`` of one stored checkpoint; a ``StoreError``
        naming the stored ids when there is none with ``checkpoint_id``."""
        with self.connect() as con:
            row = con.execute("SELECT id, path, architecture, variant FROM checkpoints WHERE id = ?",
                              [checkpoint_id]).fetchone()
            if row is None:
                ids = [r[0] for r in con.execute("SELECT id FROM checkpoints ORDER BY id").fetchall()]
                raise StoreError(f"{self.path}: no checkpoint with id {checkpoint_id} "
                                 f"(stored ids: {ids if ids else 'none'})")
        return dict(zip(("id", "path", "architecture", "variant"), row))


def _rows(cursor: duckdb.DuckDBPyConnection) -> list[dict]:
    cols = [d[0] for d in cursor.description]
    return [dict(zip(cols, row)) for row in cursor.fetchall()]


#: What DuckDB or the OS says when a write finds no room (ENOSPC, EDQUOT, EFBIG).
_FULL = ("No space left on device", "Disk quota exceeded", "File too large")


def disk_full(path: Path, exc: BaseException) -> StoreError | None:
    """The one-line error for a write that found the disk full, else None."""
    said = next((f for f in _FULL if f in str(exc)), None)
    if said is None:
        return None
    return StoreError(f"{path}: the disk is full ({said}); nothing of this step was stored: "
                      "free space and run it again")


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:        # a failed COMMIT has ended the transaction already
        pass
