"""Smoothing of training curves: the time-weighted, debiased EMA (known answers by hand)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.errors import AnalysisError
from analysis.trajectories import ema, reference_step, smooth


def _per_point_ema(values, w):
    """TensorBoard's smoothing written out: e_i = w e_(i-1) + (1 - w) v_i, e_-1 = 0, / (1 - w^(i+1))."""
    out, e = [], 0.0
    for i, v in enumerate(values):
        e = w * e + (1 - w) * v
        out.append(e / (1 - w ** (i + 1)))
    return np.array(out)


def test_equally_spaced_points_give_tensorboards_debiased_ema():
    v = np.array([5.0, 3.0, 4.0, 2.5, 2.0, 2.2])
    # the last point is kept between the last two values; the others are exactly TensorBoard's
    np.testing.assert_allclose(ema(v, 0.6)[:-1], _per_point_ema(v, 0.6)[:-1], rtol=1e-12)
    # by hand: [0, 10] at 0.5 -> 0, (0.5 * 0 + 10) / (0.5 + 1) = 6.667
    np.testing.assert_allclose(ema([0.0, 10.0], 0.5), [0.0, 10.0 / 1.5])
    np.testing.assert_allclose(ema([1.0, 1.0, 1.0], 0.9), [1.0, 1.0, 1.0])  # a constant stays constant


def test_debiased_first_point_equals_the_first_value():
    assert ema([3.7, 1.0, 2.0], 0.99)[0] == 3.7
    assert ema([3.7, 1.0], 0.9, steps=[100, 350])[0] == 3.7


def test_seventeen_eval_points_at_0_9_end_within_the_data():
    # a validation loss every 250 steps, falling from 5.4 to 1.3 (the demo's shape)
    steps = np.arange(0, 4001, 250)
    loss = 1.3 + 4.1 * np.exp(-steps / 600)
    s = ema(loss, 0.9, steps=steps)
    assert len(steps) == 17
    lo, hi = min(loss[-2:]), max(loss[-2:])
    assert lo <= s[-1] <= hi
    assert s[0] == loss[0]
    # per logged point (the old smoothing) it ended far above the data
    assert _per_point_ema(loss, 0.9)[-1] - loss[-1] > 0.3


def test_time_weighting_by_hand():
    # reference 10 steps: gaps of 10 and 20 decay by 0.5 and 0.25
    s = ema([4.0, 2.0, 1.0, 1.0], 0.5, steps=[0, 10, 30, 40], reference=10)
    n1, d1 = 0.5 * 4 + 2, 0.5 + 1            # 4, 1.5
    n2, d2 = 0.25 * n1 + 1, 0.25 * d1 + 1    # 2, 1.375
    n3, d3 = 0.5 * n2 + 1, 0.5 * d2 + 1      # 2, 1.6875
    np.testing.assert_allclose(s, [4.0, n1 / d1, n2 / d2, 1.0])  # last clipped into [1, 1]
    assert n3 / d3 > 1.0                     # (what it was before the clip)


def test_sparse_curve_is_smoothed_less_per_point_than_a_dense_one_on_one_reference():
    dense_x = np.arange(0, 1001, 10.0)
    sparse_x = np.arange(0, 1001, 250.0)
    ref = reference_step(dense_x)            # 1000 / 1000 = 1 step
    assert ref == 1.0
    noisy = np.where(np.arange(len(dense_x)) % 2, 1.0, 0.0)
    sparse = np.where(np.arange(len(sparse_x)) % 2, 1.0, 0.0)
    # same weight per step: the sparse curve's points (250 steps apart) barely average
    assert np.ptp(ema(noisy, 0.99, steps=dense_x, reference=ref)[20:-1]) < 0.5
    assert np.ptp(ema(sparse, 0.99, steps=sparse_x, reference=ref)[1:-1]) > 0.8


def test_nan_passes_through_and_bad_input_is_refused():
    out = ema([1.0, np.nan, 3.0], 0.5)
    assert np.isnan(out[1]) and out[0] == 1.0 and 1.0 <= out[2] <= 3.0
    with pytest.raises(AnalysisError) as err:
        ema([1.0], 1.0)
    assert str(err.value) == "smoothing weight must be in [0, 1); got 1.0"
    with pytest.raises(AnalysisError) as err:
        ema([1.0, 2.0], 0.5, steps=[0])
    assert str(err.value) == "ema: 2 values but 1 steps"
    raw = np.array([3.0, 1.0])
    assert ema(raw, 0.0) is not raw


def test_smooth_is_per_run_shares_one_reference_and_leaves_input_alone():
    frame = pd.DataFrame({"run_id": [1, 1, 1, 2, 2], "x": [0.0, 500, 1000, 0, 1000],
                          "value": [0.0, 10.0, 10.0, 4.0, 4.0]})
    out = smooth(frame, 0.5, reference=500)
    assert frame["value"].tolist() == [0.0, 10.0, 10.0, 4.0, 4.0]
    # run 1: (0.5 * 0 + 10) / 1.5 = 6.667, then the last point kept in [10, 10]
    np.testing.assert_allclose(out["value"], [0.0, 10.0 / 1.5, 10.0, 4.0, 4.0])
    assert out.index.tolist() == frame.index.tolist()
