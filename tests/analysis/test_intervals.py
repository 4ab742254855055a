"""analysis.intervals: the t interval of a mean over runs, the jackknife over units."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from analysis.intervals import jackknife, mean_interval, percentile_interval, t_quantile


def test_fewer_than_two_runs_have_no_interval():
    assert mean_interval([]) == (None, None)
    assert mean_interval([2.5]) == (None, None)


def test_equal_runs_have_no_width():
    assert mean_interval([3.0, 3.0, 3.0]) == (3.0, 3.0)


def test_two_runs_known_answer():
    # mean 2, s = sqrt(2), t_{1, 0.975} = 12.7062047362: 2 -+ 12.7062 * sqrt(2) / sqrt(2)
    assert mean_interval([1.0, 3.0]) == pytest.approx((2 - 12.7062047362, 2 + 12.7062047362), rel=1e-10)


def test_t_quantiles_from_tables():
    assert t_quantile(1) == pytest.approx(12.7062047362, rel=1e-9)
    assert t_quantile(2) == pytest.approx(4.30265272975, rel=1e-9)
    assert t_quantile(7) == pytest.approx(2.36462425159, rel=1e-9)
    assert t_quantile(7, 0.9) == pytest.approx(1.89457860506, rel=1e-9)


def test_t_interval_covers_normal_means_with_two_and_three_runs():
    rng = np.random.default_rng(0)
    for n in (2, 3):
        hits = [lo <= 0.0 <= hi for lo, hi in (mean_interval(rng.normal(0, 1, n)) for _ in range(4000))]
        assert np.mean(hits) == pytest.approx(0.95, abs=0.012), n


def test_jackknife_of_a_mean_is_the_mean_and_its_standard_error():
    y = torch.tensor([1.0, 4.0, 2.0, 7.0], dtype=torch.float64)
    loo = torch.stack([(y.sum() - v) / 3 for v in y])
    value, se = jackknife(loo, y.mean())
    assert float(value) == pytest.approx(3.5, abs=1e-12)
    assert float(se) == pytest.approx(float(y.std() / 2), rel=1e-12)          # s / sqrt(n)


def test_jackknife_removes_a_one_over_n_bias():
    """The plug-in variance sum (y - mean)^2 / n has bias -sigma^2 / n; the jackknife gives the
    unbiased s^2 exactly (Efron & Tibshirani 1993, ch. 10)."""
    y = torch.tensor([0.3, -1.2, 2.5, 0.9, 1.1], dtype=torch.float64)
    plug = lambda v: ((v - v.mean()) ** 2).mean()                              # noqa: E731
    loo = torch.stack([plug(torch.cat([y[:i], y[i + 1:]])) for i in range(5)])
    value, _ = jackknife(loo, plug(y))
    assert float(value) == pytest.approx(float(y.var(unbiased=True)), rel=1e-12)


def test_jackknife_leaves_out_non_finite_estimates():
    value, se = jackknife(torch.tensor([1.0, float("nan"), 3.0], dtype=torch.float64), torch.tensor(2.0))
    assert float(value) == pytest.approx(2.0) and float(se) == pytest.approx(1.0)    # N = 2


def test_percentile_interval_is_the_central_range():
    assert percentile_interval(np.arange(101.0)) == pytest.approx((2.5, 97.5), abs=1e-12)
    assert percentile_interval(np.arange(101.0), 0.5) == pytest.approx((25.0, 75.0), abs=1e-12)
