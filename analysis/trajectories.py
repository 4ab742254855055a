"""Metric trajectories: every stored metric against training step, per run.

``trajectories(results, checkpoints)`` joins analysis results
(``checkpoint_id, layer, head, metric, value``) with checkpoints
(``id``/``checkpoint_id``, ``run_id``, ``step``) and returns
``run_id, step, checkpoint_id, layer, head, metric, value`` sorted by run,
metric, layer, head and step; checkpoints without a run or a step are left
out (they have no place on a training-step axis).

``summarise(traj, over="head")`` averages over heads (one line per layer) or
over ``"layer"`` as well (one line per run and metric); NaN values are skipped.
"""
from __future__ import annotations

import pandas as pd

from analysis.errors import AnalysisError

COLUMNS = ["run_id", "step", "checkpoint_id", "layer", "head", "metric", "value"]


def trajectories(results: pd.DataFrame, checkpoints: pd.DataFrame) -> pd.DataFrame:
    """Metric values against training step (see module docstring)."""
    ck = checkpoints.rename(columns={"id": "checkpoint_id"})
    missing = sorted({"checkpoint_id", "run_id", "step"} - set(ck.columns))
    if missing:
        raise AnalysisError(f"trajectories: checkpoints frame lacks columns {missing}; found {sorted(ck.columns)}")
    ck = ck[ck["run_id"].notna() & ck["step"].notna()][["checkpoint_id", "run_id", "step"]]
    out = results.merge(ck, on="checkpoint_id", how="inner")
    out = out[COLUMNS].sort_values(["run_id", "metric", "layer", "head", "step"], na_position="first")
    return out.reset_index(drop=True)


def summarise(traj: pd.DataFrame, *, over: str = "head") -> pd.DataFrame:
    """Mean over heads (``over="head"``) or over heads and layers (``over="layer"``)."""
    if over not in ("head", "layer"):
        raise AnalysisError(f"summarise: expected over='head' or 'layer', found {over!r}")
    keys = ["run_id", "metric", "step"] if over == "layer" else ["run_id", "metric", "layer", "step"]
    return traj.groupby(keys, as_index=False, dropna=False)["value"].mean()
