"""The Inspector's cross-layer map (app.layer_maps): the grid's cells, the figure centred on chance,
the best pairs, the sharing schemes and the calculator's link."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from app import charts, layer_maps


def _results(n_layers=4, metric="xlayer_cka_wk", chance=0.2, planted=(1, 3), value=0.9, activations=False):
    rows = []
    for l in range(n_layers):
        for l2 in range(l + 1, n_layers):
            v = value if (l, l2) == planted else chance + 0.01 * ((l + l2) % 3 - 1)
            rows.append({"layer": l, "head": pd.NA, "metric": metric, "value": v, "chance": chance,
                         "chance_low": chance - 0.05, "chance_high": chance + 0.05,
                         "n_tokens": 512 if activations else pd.NA,
                         "ci_low": v - 0.01 if activations else math.nan,
                         "ci_high": v + 0.01 if activations else math.nan,
                         "above_chance": (l, l2) == planted, "degenerate": False, "layer2": l2, "head2": pd.NA})
    # a per-head row of another metric: not a pair, left out
    rows.append({"layer": 0, "head": 1, "metric": "kv_cka", "value": 0.5, "chance": 0.1, "chance_low": 0.0,
                 "chance_high": 0.2, "n_tokens": pd.NA, "ci_low": math.nan, "ci_high": math.nan,
                 "above_chance": False, "degenerate": False, "layer2": pd.NA, "head2": pd.NA})
    frame = pd.DataFrame(rows)
    for col in ("head", "layer2", "head2", "n_tokens"):
        frame[col] = pd.array(frame[col], dtype="Int64")
    frame["above_chance"] = pd.array(frame["above_chance"], dtype="boolean")
    return frame


def test_pair_metrics_in_registry_order():
    both = pd.concat([_results(metric="xlayer_cka_kcache"), _results()], ignore_index=True)
    assert layer_maps.pair_metrics(both) == ["xlayer_cka_wk", "xlayer_cka_kcache"]


def test_grid_symmetric_cells_and_empty_diagonal():
    grid = layer_maps.pair_grid(_results(), "xlayer_cka_wk")
    assert grid["layers"] == [0, 1, 2, 3]
    z = grid["value"]
    assert z[1, 3] == z[3, 1] == 0.9
    assert z[0, 2] == pytest.approx(0.21)            # chance + 0.01 * ((0 + 2) % 3 - 1)
    assert np.isnan(np.diag(z)).all()
    assert grid["above"][3, 1] and not grid["above"][0, 1]
    assert grid["hover"][3][1].startswith("L1 and L3<br>xlayer_cka_wk 0.9 (chance 0.2)")


def test_figure_centred_on_chance_with_values_in_cells():
    fig = layer_maps.layer_map_figure(_results(), "xlayer_cka_wk")
    (hm,) = fig.data
    assert hm.zmid == 0.2
    # the range: symmetric about chance, holding the farthest value (0.9) and the band
    assert hm.zmin == pytest.approx(0.2 - 0.7) and hm.zmax == pytest.approx(0.9)
    assert hm.z[1][3] == 0.9 and hm.z[2][2] is None
    assert hm.text[1][3] == "0.90*" and hm.text[0][1] == "0.20"
    assert list(hm.x) == ["L0", "L1", "L2", "L3"]
    assert "chance 0.2" in hm.colorbar.title.text


def test_random_model_stays_pale():
    """Values all inside the null band: the colour range is the band's, centred on chance."""
    frame = _results(planted=(-1, -1))
    (hm,) = layer_maps.layer_map_figure(frame, "xlayer_cka_wk").data
    assert (hm.zmin, hm.zmax) == pytest.approx((0.15, 0.25))


def test_activation_tooltip_has_tokens_and_interval():
    grid = layer_maps.pair_grid(_results(metric="xlayer_cka_kcache", activations=True), "xlayer_cka_kcache")
    assert "n=512 tokens, 95% CI 0.89–0.91" in grid["hover"][1][3]


def test_32_layers_no_text_in_cells():
    fig = layer_maps.layer_map_figure(_results(n_layers=32), "xlayer_cka_wk")
    (hm,) = fig.data
    assert len(hm.z) == 32 and hm.texttemplate is None


def test_empty_figure_without_pairs():
    fig = layer_maps.layer_map_figure(_results().iloc[-1:], "xlayer_cka_wk")
    assert fig.layout.annotations[0].text == "xlayer_cka_wk: no pairs of layers stored"


def test_best_pairs_by_excess_over_chance():
    best = layer_maps.best_pairs(_results(), "xlayer_cka_wk", k=2)
    # then (0, 2) and (2, 3) tie at 0.21: the lower layers first
    assert best[["layer", "layer2"]].values.tolist() == [[1, 3], [0, 2]]
    assert best["excess"].iloc[0] == pytest.approx(0.7) and bool(best["above_chance"].iloc[0])


def test_sharing_plans_and_link():
    plans = layer_maps.sharing_plans(_results(n_layers=4, planted=(2, 3)), "xlayer_cka_wk", 4)
    cla = plans.set_index("scheme").loc["CLA-2"]
    # CLA-2 on 4 layers shares (0,1) and (2,3): 0.2 and the planted 0.9
    assert (cla["pairs"], cla["stored"], cla["above_chance"], cla["kv_kept"], cla["lpc"]) == (2, 2, 1, 0.5, 2)
    assert cla["mean_value"] == pytest.approx((0.2 + 0.9) / 2)
    yoco = plans.set_index("scheme").loc["YOCO"]
    # YOCO on 4 layers: layer 3 reads the cache of layer 2
    assert (yoco["pairs"], yoco["mean_value"], yoco["kv_kept"], yoco["lpc"]) == (1, 0.9, 0.25, 4)
    assert layer_maps.kv_link(7, 2) == "./kv-cost?src=checkpoint&ckpt=7&lpc=2"


def test_kv_page_reads_the_link_parameters():
    """The link's parameters are the ones the KV calculator reads from its URL."""
    import inspect

    from app.pages import kv_cost

    src = inspect.getsource(kv_cost)
    assert kv_cost.URL_PATH == layer_maps.KV_PAGE
    for name in ('url_choice("src"', 'url_int("ckpt"', 'url_int("lpc"'):
        assert name in src
    assert charts.DIVERGING
