"""Reads for weight-decay sensitivity (``analysis.wd_sensitivity``, ``python -m app wd-sensitivity``).

Every read opens a short-lived connection (``Store.connect``) and passes values
as parameters.
"""
from __future__ import annotations

import pandas as pd

from loaders.store import POINT_TABLES, Store

#: per-layer Frobenius norms of the projections, as stored by the weights analysis
NORM_METRICS = ("norm_q", "norm_k", "norm_v", "norm_o")


def wd_runs(store: Store) -> pd.DataFrame:
    """Every run: ``run_id, variant, weight_decay, lr, config`` (config as stored, a JSON string), by id.
    ``lr`` is a covariate of the random-sweep regression (``analysis.wd_regression``) when the
    config names no learning rate."""
    with store.connect() as con:
        return con.execute("SELECT id AS run_id, variant, weight_decay, lr, config FROM runs ORDER BY id").df()


def loss_points(store: Store, metric: str) -> pd.DataFrame:
    """``run_id, step, value`` of ``metric``: at a step logged twice, the value stored last.

    Ingest leaves one point per (run, step, metric); a database written by hand
    may hold more. ``points`` is a view (schema 7), which has no ``rowid``, so
    the order of insertion is read from each table behind it; across the two a
    row of ``points_lean`` counts as the later (ingest never leaves both)."""
    parts = " UNION ALL ".join(f"SELECT run_id, step, value, {i} AS part, rowid AS seq FROM {t} WHERE metric = $m"
                               for i, t in enumerate(POINT_TABLES))
    with store.connect() as con:
        return con.execute(
            f"""SELECT run_id, step, value FROM ({parts})
                QUALIFY row_number() OVER (PARTITION BY run_id, step ORDER BY part DESC, seq DESC) = 1
                ORDER BY run_id, step""", {"m": metric}).df()


def projection_norm_rows(store: Store, metrics=NORM_METRICS) -> pd.DataFrame:
    """``run_id, step, metric, value`` of the stored ``metrics`` of checkpoints that belong to a
    run and have a step (one row per layer and head as stored)."""
    with store.connect() as con:
        return con.execute(
            """SELECT c.run_id, c.step, r.metric, r.value
               FROM analysis_results r JOIN checkpoints c ON c.id = r.checkpoint_id
               WHERE c.run_id IS NOT NULL AND c.step IS NOT NULL AND list_contains(?, r.metric)
                 AND r.value IS NOT NULL""", [list(metrics)]).df()


def read_inputs(store: Store, metric: str, norm_metrics=NORM_METRICS
                ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``wd_runs``, ``loss_points`` of ``metric`` and ``projection_norm_rows``, as the command uses them."""
    return wd_runs(store), loss_points(store, metric), projection_norm_rows(store, norm_metrics)
