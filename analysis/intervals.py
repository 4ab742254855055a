"""Intervals from few independent units: runs (seeds) and token windows.

``mean_interval(values)``: the Student t interval of the mean of ``n`` runs,
``mean -+ t_{n-1, (1+confidence)/2} s / sqrt(n)`` (``s`` the sample standard deviation with
``n - 1`` degrees of freedom). With 2-3 seeds a percentile bootstrap cannot reach past the runs'
min and max and covers a 95% target about half the time (``bench/interval_coverage.py``,
docs/statistics.md); the t interval is exact for normal seed noise. One value has no spread:
``(None, None)``. Used by ``analysis.wd_sensitivity`` (each weight decay's mean loss) and the
Experiments page's final-metric summary (``app.charts.final_summary``), so the two pages bound
the same runs' mean the same way.

``jackknife(estimates, full)``: the delete-one jackknife (Efron & Tibshirani 1993, ch. 11) of
``N`` leave-one-unit-out estimates ``theta_(i)`` and the all-unit estimate ``theta``: the
bias-corrected value ``N theta - (N - 1) mean_i theta_(i)`` (it removes a bias of order 1/n,
e.g. a Gram statistic's small-sample bias) and the standard error
``sqrt((N - 1)/N sum_i (theta_(i) - mean)^2)``; ``t_quantile(df)`` gives the interval's
multiplier with ``N - 1`` degrees of freedom (few units: a normal quantile would be too narrow).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from scipy.stats import t as student_t

#: Resamples of the bootstraps that remain (percentile intervals of other statistics) and the
#: confidence of every interval.
N_BOOT = 1000
CONFIDENCE = 0.95


def t_quantile(df: int, confidence: float = CONFIDENCE) -> float:
    """The ``(1 + confidence) / 2`` quantile of Student's t with ``df`` degrees of freedom."""
    return float(student_t.ppf((1 + confidence) / 2, df))


def percentile_interval(values: np.ndarray, confidence: float = CONFIDENCE, *,
                        method: str = "linear") -> tuple[float, float]:
    """The central ``confidence`` range of ``values`` (bootstrap replicates): their quantiles."""
    lo, hi = np.quantile(values, [(1 - confidence) / 2, 1 - (1 - confidence) / 2], method=method)
    return float(lo), float(hi)


def mean_interval(values, confidence: float = CONFIDENCE) -> tuple[float | None, float | None]:
    """Student t interval of the mean of ``values`` (finite floats, one per run), ``n - 1``
    degrees of freedom; ``(None, None)`` for fewer than two."""
    y = np.asarray(values, dtype=float)
    if len(y) < 2:
        return None, None
    half = t_quantile(len(y) - 1, confidence) * y.std(ddof=1) / math.sqrt(len(y))
    return float(y.mean() - half), float(y.mean() + half)


def jackknife(estimates: torch.Tensor, full: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Bias-corrected value and standard error from leave-one-out ``estimates`` ``[N, ...]`` and
    the all-unit estimate ``full`` ``[...]`` (module docstring); a NaN estimate is left out of the
    mean and the spread (``N`` then counts the finite ones)."""
    ok = torch.isfinite(estimates)
    n = ok.sum(0).to(estimates.dtype)
    mean = torch.where(ok, estimates, 0).sum(0) / n
    dev2 = torch.where(ok, (estimates - mean).square(), 0).sum(0)
    return n * full - (n - 1) * mean, ((n - 1) / n * dev2).sqrt()
