"""analysis.intervals: the percentile bootstrap of a mean over runs."""
from __future__ import annotations

import numpy as np
import pytest

from analysis.intervals import mean_interval, percentile_interval


def test_fewer_than_two_runs_have_no_interval():
    assert mean_interval([], np.random.default_rng(0)) == (None, None)
    assert mean_interval([2.5], np.random.default_rng(0)) == (None, None)


def test_equal_runs_have_no_width():
    assert mean_interval([3.0, 3.0, 3.0], np.random.default_rng(0)) == (3.0, 3.0)


def test_two_runs_known_answer():
    # resampled means of (1, 3) are 1, 2 or 3 with probability 1/4, 1/2, 1/4: the 2.5% and
    # 97.5% quantiles of 1,000 of them are the two runs themselves
    assert mean_interval([1.0, 3.0], np.random.default_rng(0)) == (1.0, 3.0)


def test_the_interval_is_the_quantiles_of_resampled_means_in_float64():
    y = np.random.default_rng(1).normal(0.0, 1.0, 30).astype(np.float32)
    idx = np.random.default_rng(7).integers(0, 30, size=(1000, 30))
    ref = np.quantile(y.astype(np.float64)[idx].mean(axis=1), [0.025, 0.975])
    assert mean_interval(y.astype(np.float64), np.random.default_rng(7)) == pytest.approx(tuple(ref), rel=1e-12)
    # and it covers about +-1.96 standard errors
    se = y.std(ddof=1) / np.sqrt(30)
    lo, hi = mean_interval(y.astype(np.float64), np.random.default_rng(7))
    assert hi - lo == pytest.approx(2 * 1.96 * se, rel=0.15)


def test_percentile_interval_is_the_central_range():
    assert percentile_interval(np.arange(101.0)) == pytest.approx((2.5, 97.5), abs=1e-12)
    assert percentile_interval(np.arange(101.0), 0.5) == pytest.approx((25.0, 75.0), abs=1e-12)
