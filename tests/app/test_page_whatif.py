"""The What if page on the demo database: reference points at once, then the greedy curves of K=V
and MQA on one chart on Run."""
from __future__ import annotations

import json
import math

from tests.app.apptest import page_test
from tests.app.test_page_experiments import arr
from tests.demo_db import demo_db


def _traces(at) -> dict[str, dict]:
    return {t.get("name"): t for t in json.loads(at.get("plotly_chart")[0].proto.spec)["data"]}


def test_reference_points_then_the_greedy_curves_of_k_eq_v_and_mqa(tmp_path, tmp_path_factory, monkeypatch):
    db = demo_db(tmp_path_factory, tmp_path / "demo.duckdb")
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("whatif", timeout=300).run()
    assert not at.exception
    by_label = {m.label: m for m in at.multiselect}
    assert by_label["Convert to"].value == ["k_eq_v", "mqa"]
    assert by_label["Runs trained with the tie"].value == ["k_eq_v-mha-wd0.1", "qkv-mqa-wd0.1", "k_eq_v-mqa-wd0.1"]
    assert [s.value for s in at.selectbox if s.label.startswith("Method for")] == ["lstsq", "mean"]
    assert any("Press Run" in i.value for i in at.info)
    traces = _traces(at)
    assert list(traces) == ["trained with the tie (stored runs)", "trained with the tie (paper B, 300M)"]
    trained = traces["trained with the tie (stored runs)"]
    ys = arr(trained["y"])
    # the demo's tie-trained runs stand at their stored final validation loss against the Q-K-V run's
    assert len(ys) == 3 and all(isinstance(y, (int, float)) and math.isfinite(y) for y in ys), trained["y"]

    at.number_input[0].set_value(128)
    next(b for b in at.button if b.label == "Run").click().run()
    assert not at.exception
    traces = _traces(at)
    assert list(traces) == ["k_eq_v by lstsq, converted (greedy)", "mqa by mean, converted (greedy)",
                            "trained with the tie (stored runs)", "trained with the tie (paper B, 300M)"]
    assert arr(traces["k_eq_v by lstsq, converted (greedy)"]["x"]) == [0.0, 12.5, 25.0, 37.5, 50.0]
    assert arr(traces["mqa by mean, converted (greedy)"]["x"]) == [0.0, 18.75, 37.5, 56.25, 75.0]
    assert len(arr(traces["trained with the tie (stored runs)"]["y"])) == 3
    assert len(arr(traces["trained with the tie (paper B, 300M)"]["y"])) == 3
    table = at.dataframe[0].value
    assert table["target"].tolist() == ["k_eq_v"] * 5 + ["mqa"] * 5
    assert table["layers"].str.count(",").tolist() == [0, 0, 1, 2, 3] * 2
    assert any("128 evaluation tokens in 1 window, the same for every target" in c.value for c in at.caption)
