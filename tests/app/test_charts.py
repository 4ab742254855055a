"""Chart builders: what the figures encode, independent of a page."""
from __future__ import annotations

import pandas as pd

from app import charts


def _results(values):
    return pd.DataFrame([{"layer": l, "head": h, "metric": "kv_cka", "value": v}
                         for l, row in enumerate(values) for h, v in enumerate(row)])


def test_heatmap_of_equal_values_is_one_colour_not_stretched_noise():
    fig = charts.heatmap_figure(_results([[1.0, 1 - 3e-8], [1 + 2e-8, 1.0]]), "kv_cka")
    trace = fig.data[0]
    assert trace.zmin < 1 - 0.4 and trace.zmax > 1 + 0.4


def test_heatmap_of_varied_values_uses_their_range():
    fig = charts.heatmap_figure(_results([[0.1, 0.9], [0.5, 0.3]]), "kv_cka")
    assert fig.data[0].zmin is None and fig.data[0].zmax is None
    assert fig.data[0].x == ("H0", "H1") and fig.data[0].y == ("L0", "L1")


def _trajectory(values):
    return pd.DataFrame([{"step": 500 * (i + 1), "layer": l, "metric": "kv_cka", "value": v}
                         for l, row in enumerate(values) for i, v in enumerate(row)])


def test_trajectory_of_equal_values_is_flat_not_stretched_noise():
    # kv_cka of a K=V run: 1 up to float32 rounding at every checkpoint
    fig = charts.trajectory_figure(_trajectory([[1.0, 1 - 6e-8, 1.0], [1.0, 1.0, 1 + 1e-7]]), "kv_cka")
    lo, hi = fig.layout.yaxis.range
    assert abs(lo - 0.5) < 1e-6 and abs(hi - 1.5) < 1e-6
    assert [t.name for t in fig.data] == ["L0", "L1"]


def test_trajectory_of_varied_values_uses_autorange():
    fig = charts.trajectory_figure(_trajectory([[0.2, 0.5, 0.9]]), "kv_cka")
    assert fig.layout.yaxis.range is None
