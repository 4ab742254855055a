"""Batch results as Parquet and their registration in the store: every SQL statement of ``app.batch``.

``app.batch`` writes each result as Parquet (``part.parquet`` rows, ``job.parquet``
marker; layer groups ``part-L<first>-<last>.parquet``) and, on the driver, reads
them back into ``analysis_results`` / ``analysis_jobs`` (through
``loaders.results.replace_results``) and records where they live in
``analysis_result_files``. The statements it needs are here:

* object storage: ``load_httpfs`` (``INSTALL httpfs; LOAD httpfs``), and an S3
  secret from given keys (``create_s3_secret``) or the AWS SDK credential chain
  (``create_credential_chain_secret``);
* Parquet files: ``file_exists`` (a ``glob`` count, works for URLs),
  ``copy_to_parquet`` (``COPY ... TO``), ``read_group_job``, ``read_layer_rows``,
  ``read_job``, ``count_rows`` (``read_parquet`` without Hive partitions);
* the store: ``stored_checkpoints`` (the geometry a batch plans with),
  ``registered_files`` and ``record_result_file`` (``analysis_result_files``).

``loaders`` imports neither ``analysis`` nor ``app``: the metric version comes in as an
argument. Values are bound as parameters; only ``COPY ... TO`` and ``CREATE SECRET``
take none, so their literals go through ``sql_string``. Readers of Parquet raise
``duckdb.Error`` as DuckDB does: the caller names the result it was reading.
"""
from __future__ import annotations

import re

import duckdb
import pandas as pd

from loaders.errors import StoreError
from loaders.store import Store

#: The columns of ``checkpoints`` a batch plans with (``stored_checkpoints`` returns them as dicts).
STORED_COLUMNS = ("id", "path", "sha256", "n_layers", "n_heads", "n_kv_heads", "d_model", "d_head", "dtype",
                  "params_attention")
_SECRET = "qkvscope_s3"


def sql_string(text: str) -> str:
    """``text`` as a SQL string literal. Only for statements that take no parameters
    (``COPY ... TO``, ``CREATE SECRET``); everything else binds values."""
    return "'" + text.replace("'", "''") + "'"


# -- object storage ----------------------------------------------------------------------
def load_httpfs(con: duckdb.DuckDBPyConnection) -> None:
    """DuckDB's ``httpfs`` extension (downloaded once, so it needs network access the first time)."""
    con.execute("INSTALL httpfs")
    con.execute("LOAD httpfs")


def create_s3_secret(con: duckdb.DuckDBPyConnection, *, key_id: str, secret: str, session_token: str | None = None,
                     endpoint: str | None = None, region: str | None = None) -> None:
    """A temporary S3 secret from explicit keys (DuckDB ``PROVIDER config``). ``endpoint`` may carry
    a scheme: DuckDB wants ``host[:port]``, the scheme goes in ``USE_SSL`` (``http://``: false)."""
    parts = [f"KEY_ID {sql_string(key_id)}", f"SECRET {sql_string(secret)}"]
    if session_token:
        parts.append(f"SESSION_TOKEN {sql_string(session_token)}")
    if endpoint:
        parts.append(f"USE_SSL {'false' if endpoint.startswith('http://') else 'true'}")
        parts.append(f"ENDPOINT {sql_string(re.sub(r'^https?://', '', endpoint).rstrip('/'))}")
    if region:
        parts.append(f"REGION {sql_string(region)}")
    con.execute(f"CREATE OR REPLACE TEMPORARY SECRET {_SECRET} (TYPE s3, PROVIDER config, {', '.join(parts)})")


def create_credential_chain_secret(con: duckdb.DuckDBPyConnection) -> None:
    """A temporary S3 secret from the AWS SDK credential chain (DuckDB's ``aws`` extension)."""
    con.execute("INSTALL aws")
    con.execute("LOAD aws")
    con.execute(f"CREATE OR REPLACE TEMPORARY SECRET {_SECRET} (TYPE s3, PROVIDER credential_chain)")


# -- Parquet files ------------------------------------------------------------------------
def file_exists(con: duckdb.DuckDBPyConnection, url: str) -> bool:
    """Whether ``url`` names a file (an object, for an object-storage URL)."""
    # fetchall: a result left half-read (fetchone) blocks the connection's next register()
    return bool(con.execute("SELECT count(*) FROM glob(?)", [url]).fetchall()[0][0])


def copy_to_parquet(con: duckdb.DuckDBPyConnection, frame: pd.DataFrame, target: str) -> None:
    """Write ``frame`` as one Parquet file at ``target`` (a path or an object-storage URL)."""
    con.register("_qkv_out", frame)
    try:
        con.execute(f"COPY _qkv_out TO {sql_string(target)} (FORMAT PARQUET)")
    finally:
        con.unregister("_qkv_out")


def read_group_job(con: duckdb.DuckDBPyConnection, url: str) -> list[tuple]:
    """A layer group's job file: ``(checkpoint_sha256, metric_version, first_layer, last_layer,
    notes, seconds, device, host, tied)`` per row (``tied`` NULL in a file written without it)."""
    have = {r[0] for r in con.execute("DESCRIBE SELECT * FROM read_parquet(?, hive_partitioning = false)",
                                      [url]).fetchall()}
    tied = "tied" if "tied" in have else "NULL AS tied"
    return con.execute("SELECT checkpoint_sha256, metric_version, first_layer, last_layer, notes, seconds, "
                       f"device, host, {tied} FROM read_parquet(?, hive_partitioning = false)", [url]).fetchall()


def read_layer_rows(con: duckdb.DuckDBPyConnection, url: str) -> pd.DataFrame:
    """``layer, head, metric, value, layer2, head2`` of one part file, in file order."""
    return con.execute("SELECT layer, head, metric, value, layer2, head2 FROM read_parquet(?, hive_partitioning = false, "
                       "union_by_name = true)", [url]).df()


def read_job(con: duckdb.DuckDBPyConnection, url: str) -> pd.DataFrame:
    """Every column of a checkpoint's ``job.parquet``."""
    return con.execute("SELECT * FROM read_parquet(?, hive_partitioning = false)", [url]).df()


def count_rows(con: duckdb.DuckDBPyConnection, parts: list[str]) -> int:
    """Rows in the Parquet files ``parts`` together."""
    return int(con.execute("SELECT count(*) FROM read_parquet(?, hive_partitioning = false)",
                           [parts]).fetchall()[0][0])


# -- the store ----------------------------------------------------------------------------
def stored_checkpoints(store: Store, ids: list[int]) -> list[dict]:
    """``STORED_COLUMNS`` of each checkpoint in ``ids``, in that order; a ``StoreError`` names the
    first id that is not stored."""
    with store.connect() as con:
        rows = con.execute(f"SELECT {', '.join(STORED_COLUMNS)} FROM checkpoints WHERE list_contains(?, id) "
                           "ORDER BY id", [ids]).fetchall()
    by_id = {r[0]: dict(zip(STORED_COLUMNS, r)) for r in rows}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise StoreError(f"{store.path}: no checkpoint with id {missing[0]} (stored ids: {sorted(by_id) or 'none'})")
    return [by_id[i] for i in ids]


def registered_files(store: Store, *, checkpoint_id: int, sha256: str,
                     metric_version: int) -> dict[str, tuple[str, str, int]]:
    """Per kind, ``(location, job_location, n_rows)`` of the registered result files of this
    checkpoint (and content hash) at ``metric_version`` that still have their job row."""
    with store.connect() as con:
        rows = con.execute(
            """SELECT f.kind, f.location, f.job_location, f.n_rows FROM analysis_result_files f
               JOIN analysis_jobs j USING (checkpoint_id, kind, metric_version)
               WHERE f.checkpoint_id = ? AND f.metric_version = ? AND f.sha256 = ?""",
            [checkpoint_id, metric_version, sha256]).fetchall()
    return {kind: (location, job, n) for kind, location, job, n in rows}


def record_result_file(con: duckdb.DuckDBPyConnection, *, checkpoint_id: int, kind: str, metric_version: int,
                       sha256: str, location: str, job_location: str, n_rows: int) -> None:
    """Replace where one result (checkpoint, kind, metric version) lives. Call inside a transaction."""
    con.execute("DELETE FROM analysis_result_files WHERE checkpoint_id = ? AND kind = ? "
                "AND metric_version = ?", [checkpoint_id, kind, metric_version])
    con.execute("INSERT INTO analysis_result_files (checkpoint_id, kind, metric_version, sha256, location, "
                "job_location, n_rows) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [checkpoint_id, kind, metric_version, sha256, location, job_location, n_rows])
