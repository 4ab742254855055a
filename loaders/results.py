"""Analysis results in the store: the one place that writes and reads them back as a job.

An analysis job (``app.jobs`` in-process, ``app.batch`` from Parquet) replaces
one checkpoint's rows of one kind (``weights`` / ``activations``) and metric
version, and records an ``analysis_jobs`` row (the cache key, with the notes
that say why a metric is absent). Both paths go through ``replace_results``
so the delete-and-insert is written once. ``loaders`` imports neither
``analysis`` nor ``app``: the metric version and the metric names of a kind
come in as arguments.

Each row: ``layer, head, metric, value, chance, n_tokens, ci_low, ci_high,
chance_low, chance_high, above_chance, degenerate, layer2, head2`` (``RESULT_FIELDS``;
``layer2``/``head2``: the second layer or head of a pair metric's row, NULL on every other row).
Non-finite values, chance levels and bands are stored as NULL (the notes say
why); ``n_tokens``, ``ci_low``, ``ci_high`` are NULL for weight metrics;
``above_chance`` is NULL where nothing was tested; ``degenerate`` is never NULL
(false unless the value is fixed by construction).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import duckdb
import pandas as pd

from loaders.store import Store

#: The stored columns of one result row, in order.
RESULT_FIELDS = ("layer", "head", "metric", "value", "chance", "n_tokens", "ci_low", "ci_high", "chance_low",
                 "chance_high", "above_chance", "degenerate", "layer2", "head2")
#: The SQL type of each optional column a Parquet file may lack (written by an older qkvscope).
_MISSING_TYPE = {"n_tokens": "BIGINT", "above_chance": "BOOLEAN", "degenerate": "BOOLEAN", "layer2": "INTEGER",
                 "head2": "INTEGER"}


@dataclass
class StoredJob:
    """A finished job read back: its rows (``RESULT_FIELDS``) and its ``analysis_jobs`` row."""

    rows: pd.DataFrame
    notes: dict[str, str]
    seconds: float
    device: str | None
    sample: dict | None = None      # what an activation job ran on (None: weights)
    tied: dict | None = None        # a weights job's ties read from the tensors


def _as_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (at least layer, head, metric, value) with every ``RESULT_FIELDS`` column, typed."""
    out = pd.DataFrame({
        "layer": frame["layer"].astype("Int64"),
        "head": frame["head"].astype("Int64"),
        "metric": frame["metric"].astype(str),
    })
    for col in ("value", "chance", "ci_low", "ci_high", "chance_low", "chance_high"):
        out[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64") if col in frame.columns \
            else float("nan")
    for col in ("n_tokens", "layer2", "head2"):
        out[col] = (pd.to_numeric(frame[col], errors="coerce").astype("Int64")
                    if col in frame.columns else pd.array([pd.NA] * len(frame), dtype="Int64"))
    out["above_chance"] = pd.array(frame["above_chance"] if "above_chance" in frame.columns
                                   else [pd.NA] * len(frame), dtype="boolean")
    out["degenerate"] = (frame["degenerate"].fillna(False).astype(bool) if "degenerate" in frame.columns
                         else pd.Series(False, index=frame.index, dtype=bool)).to_numpy()
    return out[list(RESULT_FIELDS)].reset_index(drop=True)


_FINITE = "CASE WHEN isfinite({0}) THEN {0} ELSE NULL END"
_INSERT = (f"INSERT INTO analysis_results (checkpoint_id, {', '.join(RESULT_FIELDS)}, metric_version) "
           f"SELECT ?, layer, head, metric, {_FINITE.format('value')}, {_FINITE.format('chance')}, n_tokens, "
           f"{_FINITE.format('ci_low')}, {_FINITE.format('ci_high')}, {_FINITE.format('chance_low')}, "
           f"{_FINITE.format('chance_high')}, above_chance, coalesce(degenerate, false), layer2, head2, ? "
           f"FROM {{source}}")


def replace_results(con: duckdb.DuckDBPyConnection, *, checkpoint_id: int, kind: str, metrics: list[str],
                    metric_version: int, notes: dict[str, str] | str, seconds: float | None,
                    device: str | None, frame: pd.DataFrame | None = None,
                    parquet: list[str] | None = None, sha256: str | None = None,
                    sample: dict | str | None = None, tied: dict | str | None = None) -> int:
    """Replace one checkpoint's results of ``kind`` (the rows of ``metrics``) at ``metric_version``
    with ``frame`` or with the rows of the Parquet files ``parquet`` whose ``checkpoint_sha256`` is
    ``sha256``; record the job row. Call inside a transaction. Returns the rows inserted.

    A Parquet file without the chance columns (written by an older qkvscope) gives NULLs there.
    """
    con.execute("DELETE FROM analysis_results WHERE checkpoint_id = ? AND metric_version = ? "
                "AND list_contains(?, metric)", [checkpoint_id, metric_version, list(metrics)])
    con.execute("DELETE FROM analysis_jobs WHERE checkpoint_id = ? AND kind = ? AND metric_version = ?",
                [checkpoint_id, kind, metric_version])
    if frame is not None:
        rows = _as_rows(frame)
        con.register("_qkv_rows", rows)
        try:
            n = con.execute(_INSERT.format(source="_qkv_rows"), [checkpoint_id, metric_version]).fetchone()[0]
        finally:
            con.unregister("_qkv_rows")
    else:
        have = {r[0] for r in con.execute(
            "DESCRIBE SELECT * FROM read_parquet(?, hive_partitioning = false, union_by_name = true)",
            [parquet]).fetchall()}
        cols = ", ".join(c if c in have else f"NULL::{_MISSING_TYPE.get(c, 'DOUBLE')} AS {c}"
                         for c in RESULT_FIELDS)
        source = (f"(SELECT {cols} FROM read_parquet(?, hive_partitioning = false, union_by_name = true) "
                  "WHERE checkpoint_sha256 = ?)")
        n = con.execute(_INSERT.format(source=source),
                        [checkpoint_id, metric_version, parquet, sha256]).fetchone()[0]
    con.execute("INSERT INTO analysis_jobs (checkpoint_id, kind, metric_version, device, seconds, notes, sample, "
                "tied) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [checkpoint_id, kind, metric_version, device, seconds] + [
                    None if x is None else x if isinstance(x, str) else json.dumps(x, sort_keys=True)
                    for x in (notes, sample, tied)])
    return int(n)


def _missing(metrics, with_rows, notes: dict) -> set[str]:
    """The metrics of ``metrics`` a stored job has neither rows nor a note for."""
    return set(metrics) - set(with_rows) - set(notes)


def _same_sample(stored: dict | None, wanted: dict) -> bool:
    """Whether a stored activation job ran on the sample ``wanted`` (its ``SampleSpec.key``)."""
    return stored is not None and all(stored.get(k) == v for k, v in wanted.items())


def current_job(store: Store, *, checkpoint_id: int, kind: str, metrics: list[str], metric_version: int,
                sample: dict | None = None, rows: bool = True) -> StoredJob | None:
    """The stored job of ``kind`` if it is current, else None (the analysis has to run).

    The one staleness rule every caller (``analyze`` on the command line, the
    Inspector, Compare, the batch) applies. A stored job is current when

    * it was stored at ``metric_version`` (the running code's), and
    * every metric of ``metrics`` (the metrics of its level registered now) has
      rows or a note saying why it is absent: a metric registered after the job
      was stored (a plugin switched on) makes it stale, and
    * for ``sample`` given (an activation job's ``SampleSpec.key``), it ran on
      that sample; ``sample`` None takes whichever sample it ran on.

    ``rows`` False reads only which metrics have rows (the notes and the job row
    are read either way): the returned job's ``rows`` are then empty.
    """
    with store.connect() as con:
        job = con.execute(
            "SELECT notes, seconds, device, sample, tied FROM analysis_jobs WHERE checkpoint_id = ? AND kind = ? "
            "AND metric_version = ?", [checkpoint_id, kind, metric_version]).fetchone()
        if job is None:
            return None
        notes = json.loads(job[0]) if job[0] else {}
        job_sample = json.loads(job[3]) if job[3] else None
        if sample is not None and not _same_sample(job_sample, sample):
            return None
        if rows:
            frame = con.execute(
                f"SELECT {', '.join(RESULT_FIELDS)} FROM analysis_results WHERE checkpoint_id = ? "
                "AND metric_version = ? AND list_contains(?, metric) "
                "ORDER BY layer, metric, head NULLS FIRST, layer2 NULLS FIRST, head2 NULLS FIRST",
                [checkpoint_id, metric_version, list(metrics)]).df()
            with_rows = set(frame["metric"])
        else:
            frame = pd.DataFrame(columns=list(RESULT_FIELDS))
            with_rows = {r[0] for r in con.execute(
                "SELECT DISTINCT metric FROM analysis_results WHERE checkpoint_id = ? AND metric_version = ? "
                "AND list_contains(?, metric)", [checkpoint_id, metric_version, list(metrics)]).fetchall()}
    if _missing(metrics, with_rows, notes):
        return None
    return StoredJob(_as_rows(frame), notes, float(job[1] or 0.0), job[2], job_sample,
                     json.loads(job[4]) if job[4] else None)


def current_notes(store: Store, checkpoint_id: int, wanted: dict[str, list[str]],
                  metric_version: int) -> dict[str, str] | None:
    """The merged notes of the current jobs (``current_job``) of every kind in ``wanted``
    (``{kind: its metrics}``), or None when any of them is not current."""
    notes: dict[str, str] = {}
    for kind in sorted(wanted):
        job = current_job(store, checkpoint_id=checkpoint_id, kind=kind, metrics=wanted[kind],
                          metric_version=metric_version, rows=False)
        if job is None:
            return None
        notes.update(job.notes)
    return notes


def stored_ties(store: Store, checkpoint_id: int, metric_version: int) -> list[dict] | None:
    """Per layer, the ties the stored weights analysis at ``metric_version`` read from the tensors
    (``analysis.tied.tied_layer``: ``layer, q_identity, q_eq_k, k_eq_v, q_eq_v``), or None when no
    such analysis is stored or it kept no ties."""
    with store.connect() as con:
        row = con.execute("SELECT tied FROM analysis_jobs WHERE checkpoint_id = ? AND kind = 'weights' "
                          "AND metric_version = ?", [int(checkpoint_id), int(metric_version)]).fetchone()
    tied = json.loads(row[0]) if row and row[0] else None
    return tied.get("layers") if isinstance(tied, dict) else None
