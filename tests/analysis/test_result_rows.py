"""analysis.result_rows: result rows through JSON and back keep their values and dtypes."""
from __future__ import annotations

import json
import math

import pandas as pd

from analysis.registry import RESULT_COLUMNS
from analysis.result_rows import json_rows, rows_frame


def test_round_trip_through_json():
    frame = pd.DataFrame({
        "layer": [0, 1], "head": pd.array([2, None], dtype="Int64"), "head_label": ["L0H2", "L1"],
        "metric": ["kv_cka_act", "erank_o"], "value": [0.25, float("nan")], "chance": [0.5, None],
        "n_tokens": pd.array([4096, None], dtype="Int64"), "ci_low": [0.2, None], "ci_high": [0.3, None],
        "chance_low": [0.4, None], "chance_high": [0.6, None], "above_chance": pd.array([True, None], dtype="boolean"),
        "degenerate": [False, True]})
    rows = json.loads(json.dumps(json_rows(frame)))                      # what a child sends
    assert rows[1] == [1, None, "L1", "erank_o", None, None, None, None, None, None, None, None, True, None, None]
    back = rows_frame(rows)
    assert list(back.columns) == RESULT_COLUMNS
    assert back["above_chance"].dtype == "boolean" and back["above_chance"].tolist()[0] is True
    assert back["above_chance"].isna().tolist() == [False, True] and back["degenerate"].tolist() == [False, True]
    assert back["chance_low"].dtype == "float64" and back.loc[0, "chance_high"] == 0.6
    numeric = ["layer", "head", "value", "chance", "n_tokens", "ci_low", "ci_high"]
    assert back[numeric].dtypes.astype(str).tolist() == ["int64", "Int64", "float64", "float64", "Int64",
                                                         "float64", "float64"]
    assert back.loc[0, "value"] == 0.25 and back.loc[0, "head"] == 2 and back.loc[0, "n_tokens"] == 4096
    assert math.isnan(back.loc[1, "value"]) and back["head"].isna().tolist() == [False, True]


def test_a_pair_row_keeps_its_second_layer_or_head():
    frame = pd.DataFrame({"layer": [3, 2], "head": pd.array([1, None], dtype="Int64"),
                          "head_label": ["L3H1-H0", "L2-L0"], "metric": ["xhead_sim_k", "xlayer_cka_wk"],
                          "value": [0.5, 0.75], "degenerate": [False, False],
                          "layer2": pd.array([None, 0], dtype="Int64"), "head2": pd.array([0, None], dtype="Int64")})
    for col in RESULT_COLUMNS:
        if col not in frame.columns:
            frame[col] = None
    rows = json.loads(json.dumps(json_rows(frame)))
    assert [r[-2:] for r in rows] == [[None, 0], [0, None]]
    back = rows_frame(rows)
    assert back["head2"].dtype == "Int64" and back["head2"].tolist()[0] == 0 and back["layer2"].tolist()[1] == 0
