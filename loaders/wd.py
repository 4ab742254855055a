"""Reads for weight-decay sensitivity (``analysis.wd_sensitivity``, ``python -m app wd-sensitivity``).

Every read opens a short-lived connection (``Store.connect``) and passes values
as parameters.
"""
from __future__ import annotations

import pandas as pd

from analysis import registry
from loaders.curves import StoredCurves
from loaders.run_table import run_table
from loaders.store import Store

#: per-layer Frobenius norms of the projections, as stored by the weights analysis (the registry's ``norms`` family)
NORM_METRICS = tuple(registry.names(family="norms"))


#: Columns of ``wd_runs``.
WD_RUN_COLUMNS = ["run_id", "project", "task", "d_model", "n_layers", "n_heads", "n_kv_heads", "variant",
                  "weight_decay", "lr", "last_step", "config"]


def wd_runs(store: Store) -> pd.DataFrame:
    """Every run (``loaders.run_table``, by id): ``WD_RUN_COLUMNS``, ``config`` a dict. ``project``,
    ``task`` and the geometry keep runs that are not comparable apart (``analysis.comparable``);
    ``lr`` is a covariate of the random-sweep regression (``analysis.wd_regression``) when the
    config names no learning rate."""
    return run_table(store).rename(columns={"id": "run_id"}).reindex(columns=WD_RUN_COLUMNS)


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
                ) -> tuple[pd.DataFrame, StoredCurves, pd.DataFrame]:
    """``wd_runs``, the curves of ``metric`` (``loaders.curves.StoredCurves``: read run by run when
    ``analysis.wd_sensitivity`` iterates them; at a step stored twice, the value stored last) and
    ``projection_norm_rows``, as the command uses them."""
    return wd_runs(store), StoredCurves(store, metric), projection_norm_rows(store, norm_metrics)
