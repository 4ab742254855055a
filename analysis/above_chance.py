""""Above chance" as a test: a value outside its null band, at a 5% false discovery rate.

Every chance level is a distribution (``analysis.chance`` for weights, the
random-projection draws of ``analysis.activations``), kept as its sorted draws.

* ``p_value(value, null)``: two-sided, ``p = min(1, 2 min(F_<=, F_>=))`` with
  ``F_<= = (1 + #{null <= value}) / (n + 1)`` (and ``F_>=`` likewise): the
  empirical p-value that counts the value as one more draw (Davison & Hinkley
  1997, eq. 4.11), so it is never below ``2 / (n + 1)``. A value beyond every
  draw gets the smaller of that floor and a normal tail fitted to the draws,
  ``2 Phi(-|value - mean| / sd)``: with a few hundred draws the empirical floor
  alone could never pass a Benjamini-Hochberg threshold of ``0.05 / m`` over
  ``m`` heads, and a planted structure (a tied head at 1 against a null of
  0.2 +- 0.02) is many standard deviations out. NaN where the value or the
  null is missing or the null has no spread and holds the value.
* ``flag(frame)``: per metric and per row kind (per-head rows, per-layer
  rows) of one checkpoint, the "heads shown" on one heatmap, Benjamini &
  Hochberg's (1995) step-up procedure at ``Q = 0.05`` over the rows' p-values:
  the largest ``k`` with ``p_(k) <= k Q / m`` rejects the ``k`` smallest. A row
  is ``above_chance`` True when rejected **and** its value (weights) or its whole
  95% interval (activations) lies outside the null band ``[chance_low,
  chance_high]``; False when tested and not; NA when it is not tested:
  degenerate rows (``analysis.degenerate``), rows without a chance level or band,
  and activation rows without an interval. Degenerate rows are also left out of
  ``m``. "Above" is "outside": for a ``min`` metric (an effective rank) the
  redundant side is below the band, and a ``none`` metric has no side.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

#: False discovery rate of every "above chance" call.
Q = 0.05
#: Quantiles of the null band (``chance_low``, ``chance_high``) over the draws (x heads).
NULL_BAND = (0.025, 0.975)


def p_value(value, null) -> float:
    """Two-sided p-value of ``value`` against the sorted draws ``null`` (module docstring)."""
    if value is None or not math.isfinite(value) or null is None or len(null) == 0:
        return math.nan
    x = np.asarray(null, dtype=float)
    n = len(x)
    below = int(np.searchsorted(x, value, side="right"))          # draws <= value
    above = n - int(np.searchsorted(x, value, side="left"))       # draws >= value
    p = min(1.0, 2 * min(1 + below, 1 + above) / (n + 1))
    if below == n or above == n:                                  # beyond every draw (or all equal)
        sd = float(x.std(ddof=1)) if n > 1 else 0.0
        if sd > 0:
            z = abs(value - float(x.mean())) / sd
            p = min(p, math.erfc(z / math.sqrt(2)))              # 2 Phi(-z)
        elif float(x[0]) == value:
            return math.nan                                       # a null without spread that holds it
        else:
            p = 0.0
    return p


def bh_reject(p: np.ndarray, q: float = Q) -> np.ndarray:
    """Benjamini-Hochberg step-up at false discovery rate ``q`` over the finite ``p``: which are rejected
    (NaN never)."""
    p = np.asarray(p, dtype=float)
    ok = np.isfinite(p)
    out = np.zeros(len(p), dtype=bool)
    m = int(ok.sum())
    if m == 0:
        return out
    idx = np.flatnonzero(ok)
    order = idx[np.argsort(p[idx], kind="stable")]
    passed = np.flatnonzero(p[order] <= q * np.arange(1, m + 1) / m)
    if len(passed):
        out[order[: passed[-1] + 1]] = True
    return out


def flag(frame: pd.DataFrame, *, q: float = Q) -> pd.DataFrame:
    """``frame`` (``RESULT_COLUMNS`` plus ``p_null``, one checkpoint) with ``above_chance`` filled
    (module docstring) and ``p_null`` dropped. Returns a copy."""
    out = frame.copy()
    for col in ("ci_low", "ci_high", "chance_low", "chance_high", "p_null"):   # a frame that computed none
        if col not in out.columns:
            out[col] = np.nan
    if "degenerate" not in out.columns:
        out["degenerate"] = False
    sampled = out["ci_low"].notna() | out["ci_high"].notna()
    value_lo = out["ci_low"].where(sampled, out["value"]).astype(float)
    value_hi = out["ci_high"].where(sampled, out["value"]).astype(float)
    band = out["chance_low"].notna() & out["chance_high"].notna()
    outside = (value_lo > out["chance_high"]) | (value_hi < out["chance_low"])
    degenerate = out["degenerate"].fillna(False).astype(bool)
    testable = band & value_lo.notna() & value_hi.notna() & ~degenerate & out["p_null"].notna()
    result = pd.Series(pd.NA, index=out.index, dtype="boolean")
    whole = out["head"].isna()
    for _, idx in out[testable].groupby([out["metric"], whole], sort=False).groups.items():
        rejected = bh_reject(out.loc[idx, "p_null"].to_numpy(dtype=float), q)
        result.loc[idx] = rejected & outside.loc[idx].to_numpy()
    out["above_chance"] = result
    return out.drop(columns=["p_null"])
