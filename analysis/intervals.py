"""Intervals over runs: the percentile bootstrap of a mean, shared by every page that shows
the mean of a few runs (seeds) with its uncertainty.

``mean_interval(values, rng)``: ``n_boot`` resamples of the ``n`` values with replacement,
the mean of each, and the ``(1 - confidence) / 2`` and ``1 - (1 - confidence) / 2`` quantiles
of those means (``numpy.quantile``, linear interpolation): the percentile interval of Efron &
Tibshirani (1993, ch. 13). One value has no spread to resample: ``(None, None)``. With very
few runs the percentile interval is narrow (it cannot reach past the runs' min and max), so a
page shows ``n`` beside it. Used by ``analysis.wd_sensitivity`` (each weight decay's mean
loss) and the Experiments page's final-metric summary (``app.charts.final_summary``), so the
two pages bound the same runs' mean the same way.
"""
from __future__ import annotations

import numpy as np

#: Resamples and confidence of every interval over runs.
N_BOOT = 1000
CONFIDENCE = 0.95


def percentile_interval(values: np.ndarray, confidence: float = CONFIDENCE, *,
                        method: str = "linear") -> tuple[float, float]:
    """The central ``confidence`` range of ``values`` (bootstrap replicates): their quantiles."""
    lo, hi = np.quantile(values, [(1 - confidence) / 2, 1 - (1 - confidence) / 2], method=method)
    return float(lo), float(hi)


def mean_interval(values, rng: np.random.Generator, *, n_boot: int = N_BOOT,
                  confidence: float = CONFIDENCE) -> tuple[float | None, float | None]:
    """Percentile-bootstrap interval of the mean of ``values`` (finite floats, one per run);
    ``(None, None)`` for fewer than two. Draws ``[n_boot, n]`` indices from ``rng``."""
    y = np.asarray(values, dtype=float)
    if len(y) < 2:
        return None, None
    boot = y[rng.integers(0, len(y), size=(n_boot, len(y)))].mean(axis=1)   # [n_boot]
    return percentile_interval(boot, confidence)
