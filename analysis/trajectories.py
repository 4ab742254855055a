"""Metric trajectories: every stored metric against training step, per run.

``trajectories(results, checkpoints)`` joins analysis results
(``checkpoint_id, layer, head, metric, value``) with checkpoints
(``id``/``checkpoint_id``, ``run_id``, ``step``) and returns
``run_id, step, checkpoint_id, layer, head, metric, value`` sorted by run,
metric, layer, head and step; checkpoints without a run or a step are left
out (they have no place on a training-step axis).

``summarise(traj, over="head")`` averages over heads (one line per layer) or
over ``"layer"`` as well (one line per run and metric); NaN values are skipped.

``ema(values, weight, steps=...)`` smooths a training curve as TensorBoard and
W&B do: a debiased exponential moving average whose decay is applied per unit
of x (the training step), not per logged point, so a validation curve logged
every 250 steps is smoothed as much per step as a training curve logged every
20 (``smooth`` applies it per run of a curves frame).
"""
from __future__ import annotations

import numpy as np
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


#: The default reference step is the x range of everything on one chart divided by this, so one
#: smoothing weight means the same on a chart of 4,000 steps as on one of 400,000 (W&B's
#: time-weighted EMA scales the step to the chart's x range the same way).
REFERENCE_DIVISIONS = 1000


def reference_step(x) -> float:
    """The default x unit the smoothing weight applies to: ``(max x - min x) / 1000``; 1 when the
    x values span no range (one point, or all at one step)."""
    x = np.asarray(x, dtype="float64")
    x = x[np.isfinite(x)]
    span = float(x.max() - x.min()) if x.size else 0.0
    return span / REFERENCE_DIVISIONS if span > 0 else 1.0


def ema(values, weight: float, *, steps=None, reference: float | None = None) -> np.ndarray:
    """Time-weighted, debiased exponential moving average of one curve (``values`` in step order).

    With decay ``a_i = weight ** ((steps[i] - steps[i-1]) / reference)`` per gap,
    ``num_i = a_i num_(i-1) + v_i``, ``den_i = a_i den_(i-1) + 1``, ``s_i = num_i / den_i``:
    each point is the average of the points so far, weighted by ``weight`` to the power of
    their distance in reference steps. For equally spaced points (``steps`` None: one
    reference step apart) this is TensorBoard's smoothing exactly, ``e_i = w e_(i-1) +
    (1 - w) v_i`` debiased by ``1 - w^(i+1)`` (the de-bias of Kingma & Ba 2015); the
    time-weighted form is W&B's TWEMA. The first smoothed point equals the first value.

    ``reference`` defaults to ``reference_step(steps)`` (a thousandth of the curve's x range);
    pass one shared value to smooth several curves of one chart alike. The last smoothed
    point is kept inside the range of the last two values (``min(v_(n-1), v_n)`` to
    ``max(...)``), so a smoothed line never ends off the data where the data ends (a steadily
    falling loss would otherwise end above its last values by the EMA's lag). NaN values
    are passed through as NaN and do not enter the average. ``weight`` 0 returns a copy.
    """
    v = np.asarray(values, dtype="float64")
    if not 0.0 <= weight < 1.0:
        raise AnalysisError(f"smoothing weight must be in [0, 1); got {weight}")
    if weight == 0.0 or len(v) == 0:
        return v.copy()
    x = np.arange(len(v), dtype="float64") if steps is None else np.asarray(steps, dtype="float64")
    if x.shape != v.shape:
        raise AnalysisError(f"ema: {len(v)} values but {len(x)} steps")
    if reference is None:
        reference = 1.0 if steps is None else reference_step(x)
    if not reference > 0:
        raise AnalysisError(f"ema: reference step must be > 0; got {reference}")
    out = np.full_like(v, np.nan)
    num = den = 0.0
    prev_x = None
    for i, (xi, vi) in enumerate(zip(x, v)):  # sequential recurrence; curves are <= 2,000 points
        if not np.isfinite(vi):
            continue
        decay = 1.0 if prev_x is None else weight ** (max(xi - prev_x, 0.0) / reference)
        num, den, prev_x = decay * num + vi, decay * den + 1.0, xi
        out[i] = num / den
    finite = np.flatnonzero(np.isfinite(v))
    if len(finite) >= 2:                        # the line ends between the last two values
        a, b = v[finite[-2]], v[finite[-1]]
        out[finite[-1]] = min(max(out[finite[-1]], min(a, b)), max(a, b))
    return out


def smooth(frame: pd.DataFrame, weight: float, *, by: str = "run_id", column: str = "value",
           x: str = "x", reference: float | None = None) -> pd.DataFrame:
    """A copy of a curves frame with ``column`` smoothed by ``ema`` within each ``by`` group,
    in the order of ``x``. All groups share one reference step (default: a thousandth of the
    whole frame's x range), so curves logged at different densities are smoothed alike."""
    out = frame.copy() if frame.index.is_unique else frame.reset_index(drop=True)
    if weight == 0.0 or out.empty:
        return out
    index = out.index
    if reference is None:
        reference = reference_step(out[x])
    out = out.sort_values([by, x], kind="stable")
    parts = [pd.Series(ema(g[column].to_numpy(), weight, steps=g[x].to_numpy(), reference=reference),
                       index=g.index) for _, g in out.groupby(by, sort=False)]
    out[column] = pd.concat(parts)
    return out.loc[index]
