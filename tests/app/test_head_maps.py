"""The Inspector's cross-head map (``app.head_maps``): the head x head figure from stored pair rows,
the groupings table, and the reading child's groupings of a demo checkpoint's layer."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import head_grouping
from analysis.registry import RESULT_COLUMNS
from app import head_maps
from app.inspect_child import head_groupings

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"


def results(n=3, layer=1):
    """Pair rows of xhead_sim_k_aligned in ``layer`` (value 0.1 h + 0.01 h2, chance 0.4, band 0.35-0.45; the
    pair (0, 2) above chance), one gqa_pool_residual row and one per-head row of another metric."""
    rows = []
    for h in range(n):
        for h2 in range(n):
            if h != h2:
                rows.append(dict(layer=layer, head=h, head_label=f"L{layer}KV{h}-KV{h2}", metric="xhead_sim_k_aligned",
                                 value=0.1 * h + 0.01 * h2, chance=0.4, chance_low=0.35, chance_high=0.45,
                                 above_chance=(h, h2) == (0, 2), head2=h2))
    rows.append(dict(layer=layer, head=None, head_label=f"L{layer}", metric="gqa_pool_residual", value=0.6,
                     chance=0.7, chance_low=0.69, chance_high=0.71))
    rows.append(dict(layer=layer, head=0, head_label=f"L{layer}KV0", metric="kv_cka", value=0.2, chance=0.1))
    frame = pd.DataFrame(rows).reindex(columns=RESULT_COLUMNS)
    for col in ("head", "head2", "layer2"):
        frame[col] = frame[col].astype("Int64")
    return frame


def test_pair_metrics_and_layers_are_the_stored_head_pair_metrics():
    r = results()
    assert head_maps.pair_metrics(r) == ["xhead_sim_k_aligned"]
    assert head_maps.pair_layers(r, "xhead_sim_k_aligned") == [1]
    assert head_maps.pair_layers(r, "kv_cka") == []


def test_head_map_figure_is_the_layers_matrix_with_a_blank_diagonal_diverging_from_chance():
    fig = head_maps.head_map_figure(results(), "xhead_sim_k_aligned", 1)
    hm = fig.data[0]
    z = np.array([[np.nan if v is None else v for v in row] for row in hm.z], dtype=float)
    want = np.array([[np.nan, 0.01, 0.02], [0.10, np.nan, 0.12], [0.20, 0.21, np.nan]])
    np.testing.assert_allclose(z, want, equal_nan=True)
    assert list(hm.x) == list(hm.y) == ["KV0", "KV1", "KV2"]
    assert hm.zmid == 0.4 and (hm.zmin, hm.zmax) == pytest.approx((0.01, 0.79))   # centred on chance, every value inside
    assert hm.text[0][2] == "0.02*" and hm.text[1][0] == "0.10" and hm.text[1][1] == ""
    assert hm.customdata[2][2] == "" and hm.hoverongaps is False        # the diagonal: no pair, no tooltip
    assert "L1 KV0-KV2" in hm.customdata[0][2] and "above chance" in hm.customdata[0][2]
    assert fig.layout.title.text == "Layer 1: xhead_sim_k_aligned"


def test_head_map_figure_without_rows_says_so():
    fig = head_maps.head_map_figure(results(), "xhead_sim_k_aligned", 5)
    assert fig.layout.annotations[0].text == "xhead_sim_k_aligned: no head pairs stored for layer 5"


def test_grouping_frame_of_the_reading_childs_groupings_of_a_demo_layer():
    """The child's job reads one layer of a real demo checkpoint (4 kv heads): G = 2 and 1, contiguous and free."""
    rows = head_groupings(str(DEMO / "qkv-mha-wd0.1" / "checkpoints" / "final_step_004000.safetensors"), layer=0)
    frame = head_maps.grouping_frame(rows)
    assert frame.columns.tolist() == ["G", "kind", "mean residual", "max residual", "groups", "search"]
    assert frame[["G", "kind"]].values.tolist() == [[2, "contiguous"], [2, "free"], [1, "contiguous"], [1, "free"]]
    assert frame["groups"].iloc[0] == "{0,1} {2,3}" and frame["search"].eq("exhaustive").all()
    assert frame["mean residual"].iloc[1] <= frame["mean residual"].iloc[0]
    assert frame["mean residual"].iloc[2] == frame["mean residual"].iloc[3]
    synthetic = head_maps.grouping_frame(head_grouping.table(head_grouping.groupings(np.eye(4))))
    assert synthetic["mean residual"].iloc[2] == np.sqrt(0.75)         # 4 orthogonal unit heads pooled into one
