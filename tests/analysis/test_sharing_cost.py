import math

import pandas as pd
import pytest

from analysis.sharing_cost import curve, paper_points, trained_points


def test_curve_starts_at_the_baseline_and_measures_savings():
    r = {"baseline": {"ppl": 10.0, "ci_low": 9.0, "ci_high": 11.0, "kv_bytes_per_token": 2048},
         "steps": [{"layers": [2], "kv_bytes_per_token": 1536, "delta_ppl_pct": 1.5, "ppl": 10.15,
                    "ci_low": 9.1, "ci_high": 11.2}]}
    c = curve(r)
    assert c["kv_saved_pct"].tolist() == [0.0, 25.0]
    assert c["layers"].tolist() == ["", "2"]


def test_paper_points_are_the_claims():
    p = paper_points().set_index("label")
    assert p.loc["Q-MQA, trained (paper B, 300M)"].tolist() == [96.9, 4.8]
    assert p.loc["Q-K=V, trained (paper B, 300M)"].tolist() == [50.0, 3.1]


def test_trained_points_against_the_baseline_run():
    runs = pd.DataFrame({"name": ["qkv", "kv", "mqa", "none"], "final": [1.4, 1.5, 1.45, None],
                         "kv_bytes_per_token": [2048, 1024, 512, 256]})
    t = trained_points(runs, "qkv", ["kv", "mqa", "none", "absent"])
    assert t["label"].tolist() == ["kv, trained", "mqa, trained"]
    assert t["delta_ppl_pct"].tolist() == pytest.approx([100 * (math.exp(0.1) - 1), 100 * (math.exp(0.05) - 1)])
    assert t["kv_saved_pct"].tolist() == [50.0, 75.0]
    assert trained_points(runs, "missing", ["kv"]).empty
