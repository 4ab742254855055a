"""Weight-decay page in AppTest: loss against wd per variant, best wd, unstable runs, norms."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from loaders.store import Store, refresh_run_stats
from tests.app.apptest import page_test
from tests.app.test_page_experiments import arr, figures, qp

#: (id, variant, wd, final val loss shape); run 5 diverges (inf), run 2 has a spike.
RUNS = [(1, "qkv", 0.01), (2, "qkv", 0.03), (3, "qkv", 0.1), (4, "k_eq_v", 0.01), (5, "k_eq_v", 0.1)]


def _val_curve(rid: int, wd: float) -> list[float]:
    base = 3.0 + (math.log10(wd) + 1.5) ** 2  # best near wd = 0.03
    vals = [base + 1.0 - 0.1 * i for i in range(11)]  # 10 evals going down to base
    if rid == 2:
        vals[5] = vals[4] * 1.5  # one spike
    if rid == 5:
        vals[-1] = float("inf")
    return vals


@pytest.fixture
def wd_db(tmp_path, monkeypatch):
    db = tmp_path / "wd.duckdb"
    store = Store(db)
    store.migrate()
    rows = []
    for rid, variant, wd in RUNS:
        for i, v in enumerate(_val_curve(rid, wd)):
            rows.append((rid, i * 100, "val/loss", v))
    frame = pd.DataFrame(rows, columns=["run_id", "step", "metric", "value"])
    with store.transaction() as con:
        for rid, variant, wd in RUNS:
            con.execute("INSERT INTO runs (id, name, source, format, variant, weight_decay, config) "
                        "VALUES (?, ?, ?, 'csv', ?, ?, '{\"n_layer\": 2}')",
                        [rid, f"{variant}-wd{wd}", f"/s/{rid}", variant, wd])
        con.register("f", frame)
        con.execute("INSERT INTO points (run_id, step, metric, value) SELECT * FROM f")
        refresh_run_stats(con, frame["run_id"].unique())
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    return db


def test_empty_database_says_how_to_get_a_sweep(tmp_path, monkeypatch):
    db = tmp_path / "e.duckdb"
    Store(db).migrate()
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("weight_decay").run()
    assert not at.exception
    assert at.info[0].value.startswith("No runs with a weight decay yet.")


def test_loss_against_weight_decay_with_best_and_unstable_runs(wd_db):
    at = page_test("weight_decay").run()
    assert not at.exception, at.exception
    fig = figures(at)["wd_curve"]
    assert fig["layout"]["xaxis"]["type"] == "log"
    lines = {t["name"]: t for t in fig["data"] if t.get("mode") == "lines"}
    assert sorted(lines) == ["k_eq_v", "qkv"]
    # the diverged run is drawn as a cross and left out of the mean line
    assert arr(lines["k_eq_v"]["x"]) == [0.01]
    markers = [t for t in fig["data"] if t.get("mode") == "markers"]
    symbols = {tuple(arr(t["x"])): list(t["marker"]["symbol"]) for t in markers}
    assert symbols[(0.01, 0.1)] == ["circle", "x"]
    summary = at.dataframe[0].value.set_index("variant")
    assert summary.loc["qkv", "best_weight_decay"] == 0.03
    assert summary.loc["qkv", "spiky runs"] == 1 and summary.loc["k_eq_v", "diverged runs"] == 1
    assert "qkv-wd0.03 (wd 0.03: 1 spikes)" in at.warning[0].value
    assert "k_eq_v-wd0.1 (wd 0.1: diverged)" in at.warning[0].value


def test_variant_filter_and_thresholds_live_in_the_url(wd_db):
    at = page_test("weight_decay", {"variant": "qkv", "spike": "0.6"}).run()
    assert not at.exception
    assert at.dataframe[0].value["variant"].tolist() == ["qkv"]
    assert at.dataframe[0].value["spiky runs"].tolist() == [0]  # a 50% rise is under a 60% threshold
    at.multiselect(key="wd_variants").select("k_eq_v").run()
    assert qp(at, "variant") == "qkv,k_eq_v"


def test_projection_norms_against_weight_decay(wd_db):
    store = Store(wd_db)
    with store.transaction() as con:
        for rid, variant, wd in RUNS[:3]:
            con.execute("INSERT INTO checkpoints (id, path, sha256, architecture, variant, n_layers, n_heads, "
                        "n_kv_heads, d_model, d_head, run_id, step) "
                        "VALUES (?, 'gone', ?, 'gpt2', 'qkv', 2, 2, 2, 8, 4, ?, 1000)", [rid, f"s{rid}", rid])
            con.execute("INSERT INTO analysis_jobs (checkpoint_id, kind, metric_version) VALUES (?, 'weights', 1)",
                        [rid])
            for layer in (0, 1):
                con.execute("INSERT INTO analysis_results (checkpoint_id, layer, head, metric, value, "
                            "metric_version) VALUES (?, ?, NULL, 'norm_k', ?, 1)", [rid, layer, 3.0 / wd ** 0.5])
    at = page_test("weight_decay").run()
    assert not at.exception, at.exception
    trace = figures(at)["wd_norms"]["data"][0]
    assert trace["name"] == "qkv norm_k"
    # root-sum-square over the two layers
    np.testing.assert_allclose(arr(trace["y"]), [math.sqrt(2) * 3.0 / w ** 0.5 for w in (0.01, 0.03, 0.1)])


def test_weight_decay_zero_gets_its_own_tick_on_the_log_axis():
    from app.charts import wd_figure

    pts = pd.DataFrame({"variant": "qkv", "group": "all", "weight_decay": [0.0, 0.01, 0.1],
                        "final_val_loss": [3.0, 2.9, 2.8], "diverged": False, "spikes": 0, "run_id": [1, 2, 3]})
    fig = wd_figure(pts)
    assert list(fig.data[0].x) == pytest.approx([0.01 / 10 ** 0.5, 0.01, 0.1])
    assert list(fig.layout.xaxis.ticktext) == ["0", "0.01", "0.1"]
    assert fig.layout.xaxis.type == "log"
