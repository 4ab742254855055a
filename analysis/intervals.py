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

import functools
import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

#: Draws of the weight-decay statistics (wild-bootstrap refits, posterior draws of the best wd,
#: the regression's case bootstrap) and the confidence of every interval.
N_BOOT = 1000
CONFIDENCE = 0.95


def _t_central(t: float, df: int) -> float:
    """``P(|T| < t)`` for Student's t with integer ``df`` (Abramowitz & Stegun 26.7.3-4): with
    ``a = atan(t / sqrt(df))``, ``c = cos^2 a``, odd ``df``: ``(2/pi)(a + sin a cos a (1 + 2/3 c +
    2*4/(3*5) c^2 + ...))`` over ``(df - 3)/2`` terms; even: ``sin a (1 + 1/2 c + 1*3/(2*4) c^2 +
    ...)`` over ``(df - 2)/2`` terms."""
    a = math.atan(t / math.sqrt(df))
    c = math.cos(a) ** 2
    odd = df % 2
    term, total = 1.0, 1.0
    for k in range(1, (df - 1) // 2 if odd else df // 2):
        term *= c * (2 * k if odd else 2 * k - 1) / (2 * k + 1 if odd else 2 * k)
        total += term
    if odd:
        return 2 / math.pi * (a + (math.sin(a) * math.cos(a) * total if df > 1 else 0.0))
    return math.sin(a) * total


@functools.lru_cache(maxsize=256)
def t_quantile(df: int, confidence: float = CONFIDENCE) -> float:
    """The ``(1 + confidence) / 2`` quantile of Student's t with ``df`` (a positive integer)
    degrees of freedom: ``P(|T| < t) = confidence`` solved by bisection to float64 precision."""
    lo, hi = 0.0, 1.0
    while _t_central(hi, df) < confidence:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if _t_central(mid, df) < confidence else (lo, mid)
    return (lo + hi) / 2


def percentile_interval(values: np.ndarray, confidence: float = CONFIDENCE, *,
                        method: str = "linear") -> tuple[float, float]:
    """The central ``confidence`` range of ``values`` (bootstrap replicates or posterior draws): their quantiles."""
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
    # tensor methods only: this module stays importable without torch (the pages' intervals)
    ok = estimates.isfinite()
    n = ok.sum(0).to(estimates.dtype)
    mean = estimates.where(ok, 0).sum(0) / n
    dev2 = (estimates - mean).square().where(ok, 0).sum(0)
    return n * full - (n - 1) * mean, ((n - 1) / n * dev2).sqrt()
