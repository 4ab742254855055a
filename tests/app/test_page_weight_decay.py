"""Weight-decay page in AppTest: loss against wd per variant, best wd, unstable runs, norms; the n behind
each point, bootstrap intervals where seeds repeat a weight decay, and why a statistic is absent."""
from __future__ import annotations

import json
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


def _fill(db, runs, curve=_val_curve, names=None):
    store = Store(db)
    store.migrate()
    rows = []
    for rid, variant, wd in runs:
        for i, v in enumerate(curve(rid, wd)):
            rows.append((rid, i * 100, "val/loss", v))
    frame = pd.DataFrame(rows, columns=["run_id", "step", "metric", "value"])
    with store.transaction() as con:
        for rid, variant, wd in runs:
            con.execute("INSERT INTO runs (id, name, source, format, variant, weight_decay, config) "
                        "VALUES (?, ?, ?, 'csv', ?, ?, ?)",
                        [rid, (names or {}).get(rid, f"{variant}-wd{wd}"), f"/s/{rid}", variant, wd,
                         json.dumps({"n_layer": 2, "seed": rid})])
        con.register("f", frame)
        con.execute("INSERT INTO points (run_id, step, metric, value) SELECT * FROM f")
        refresh_run_stats(con, frame["run_id"].unique())
    return store


@pytest.fixture
def wd_db(tmp_path, monkeypatch):
    db = tmp_path / "wd.duckdb"
    _fill(db, RUNS)
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


def _summary(at) -> pd.DataFrame:
    return at.dataframe[0].value.set_index("variant")


def test_counts_and_why_slope_or_intervals_are_absent(wd_db):
    at = page_test("weight_decay").run()
    assert not at.exception, at.exception
    summary = _summary(at)
    # qkv: 3 weight decays, a slope and a curvature; k_eq_v: 2, so neither, and the reason says so
    assert summary.loc["qkv", ["n_runs", "n_wd", "n_wd_fit"]].tolist() == [3, 3, 3]
    assert not math.isnan(summary.loc["qkv", "slope"]) and not math.isnan(summary.loc["qkv", "curvature"])
    assert math.isnan(summary.loc["k_eq_v", "slope"]) and math.isnan(summary.loc["k_eq_v", "curvature"])
    assert summary.loc["k_eq_v", "why absent"] == (
        "slope, curvature: 2 distinct weight decays > 0 (0.01, 0.1); slope and curvature need >= 3; "
        "intervals: one run per weight decay: an interval needs repeated runs (seeds) at a weight decay")
    assert summary.loc["qkv", "slope 95% CI"] == "" and summary.loc["qkv", "best in"] == ""
    shown = "\n".join(m.value for m in at.markdown)
    assert ("* **slope, curvature** n/a for k_eq_v: 2 distinct weight decays > 0 (0.01, 0.1); slope and curvature "
            "need >= 3\n* **intervals** n/a for k_eq_v, qkv: one run per weight decay") in shown
    # no run repeats a weight decay: no error bar, no n label
    bars = [t for t in figures(at)["wd_curve"]["data"] if "error_y" in t]
    assert len(bars) == 2 and all(set(t["text"]) == {""} for t in bars)


def _seed_curve(rid: int, wd: float) -> list[float]:
    """qkv: 3 + 0.1 log10(wd), seeds at wd 0.1 0.02 apart; the lone wq_identity run ends at 4."""
    final = 4.0 if rid == 30 else 3.0 + 0.1 * math.log10(wd) + {21: 0.02, 22: -0.02}.get(rid, 0.0)
    return [final + 1.0, final + 0.5, final]


@pytest.fixture
def seeds_db(tmp_path, monkeypatch):
    db = tmp_path / "seeds.duckdb"
    runs = [(10, "qkv", 0.001), (11, "qkv", 0.01), (20, "qkv", 0.1), (21, "qkv", 0.1), (22, "qkv", 0.1),
            (30, "wq_identity", 0.1)]
    _fill(db, runs, curve=_seed_curve, names={21: "qkv-wd0.1-seed1", 22: "qkv-wd0.1-seed2"})
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    return db


def test_intervals_and_n_where_seeds_share_a_weight_decay(seeds_db):
    at = page_test("weight_decay").run()
    assert not at.exception, at.exception
    fig = figures(at)["wd_curve"]
    bar = next(t for t in fig["data"] if "error_y" in t and t.get("legendgroup") == "qkv")
    assert arr(bar["x"]) == [0.001, 0.01, 0.1] and list(bar["text"]) == ["", "", "n=3"]
    np.testing.assert_allclose(arr(bar["y"]), [2.7, 2.8, 2.9])
    up, down = arr(bar["error_y"]["array"]), arr(bar["error_y"]["arrayminus"])
    assert up[:2] == [0, 0] and down[:2] == [0, 0]
    assert 0 < up[2] <= 0.02 + 1e-12 and 0 < down[2] <= 0.02 + 1e-12  # inside the seeds' range
    summary = _summary(at)
    q = summary.loc["qkv"]
    lo, hi = (float(v) for v in q["slope 95% CI"].split(" to "))
    assert lo <= q["slope"] <= hi and q["slope"] == pytest.approx(0.1, abs=1e-9)
    assert (q["best_weight_decay"], q["best wd 95% CI"], q["best in"]) == (0.001, "0.001 to 0.001",
                                                                          "100% of resamples")
    lone = summary.loc["wq_identity"]
    assert math.isnan(lone["best_weight_decay"]) and lone["n_runs"] == 1
    assert "best wd: 1 run with a loss; a best weight decay needs >= 2 runs at >= 2 weight decays" in lone["why absent"]
    points = at.dataframe[1].value
    row = points[(points["variant"] == "qkv") & (points["weight_decay"] == 0.1)].iloc[0]
    assert row["n_runs"] == 3 and row["mean"] == pytest.approx(2.9)
    assert 2.88 <= row["ci_low"] < row["mean"] < row["ci_high"] <= 2.92


def test_best_loss_is_a_url_choice(seeds_db):
    at = page_test("weight_decay", {"wl": "best"}).run()
    assert not at.exception, at.exception
    assert at.radio(key="wd_statistic").value == "best"
    fig = figures(at)["wd_curve"]
    assert fig["layout"]["yaxis"]["title"]["text"] == "best val/loss"
    at.radio(key="wd_statistic").set_value("final").run()
    assert qp(at, "wl") is None
