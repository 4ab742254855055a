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
