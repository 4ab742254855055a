"""The What if page on the demo database: reference points at once, the greedy curve on Run."""
from __future__ import annotations

from tests.app.apptest import page_test
from tests.app.test_page_experiments import arr
from tests.demo_db import demo_db


def test_reference_points_then_the_greedy_curve(tmp_path, tmp_path_factory, monkeypatch):
    db = demo_db(tmp_path_factory, tmp_path / "demo.duckdb")
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("whatif", timeout=300).run()
    assert not at.exception
    assert at.multiselect[0].value == ["k_eq_v-mha-wd0.1", "qkv-mqa-wd0.1", "k_eq_v-mqa-wd0.1"]
    assert any("Press Run" in i.value for i in at.info)
    fig = at.get("plotly_chart")[0].proto.spec
    assert "trained with the tie (stored runs)" in fig and "paper B, 300M" in fig
    import json
    import math
    trained = next(t for t in json.loads(fig)["data"] if t.get("name") == "trained with the tie (stored runs)")
    ys = arr(trained["y"])
    # the demo's tie-trained runs stand at their stored final validation loss against the Q-K-V run's
    assert len(ys) == 3 and all(isinstance(y, (int, float)) and math.isfinite(y) for y in ys), trained["y"]
    at.number_input[0].set_value(256)
    next(b for b in at.button if b.label == "Run").click().run()
    assert not at.exception
    table = at.dataframe[0].value
    assert table["layers"].str.count(",").tolist() == [0, 0, 1, 2, 3]
    assert table["kv_saved_pct"].tolist() == [0.0, 12.5, 25.0, 37.5, 50.0]
