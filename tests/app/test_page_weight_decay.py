"""Weight-decay page in AppTest: loss against wd per variant, best wd, unstable runs, norms; the n behind
each point, t intervals where seeds repeat a weight decay, and why a statistic is absent."""
from __future__ import annotations

import json
import math
import os
import time

import numpy as np
import pandas as pd
import pytest

from analysis import variants as V
from analysis.registry import METRIC_VERSION, names
from app.plain import md
from loaders.store import Store, refresh_run_stats
from tests.app.apptest import page_test, shown
from tests.app.test_page_experiments import arr, figures, qp

#: The notes of a stored weights job that holds norm_k rows alone: every other weight metric is
#: explained, so the job is current (app.state.current_notes, the rule analyze applies).
ABSENT = json.dumps({m: "not in this fixture" for m in names("weights") if m != "norm_k"})

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
    assert sorted(lines) == sorted([V.label("k_eq_v"), V.label("qkv")])
    # the diverged run is drawn as a cross and left out of the mean line
    assert arr(lines[V.label("k_eq_v")]["x"]) == [0.01]
    # every run a marker of its group: (x, symbol, ring colour 0 white / 1 black, ring width)
    runs: dict[str, list] = {}
    for t in fig["data"]:
        if t.get("mode") == "markers":
            m = t["marker"]
            runs.setdefault(t["legendgroup"], []).extend(
                zip(arr(t["x"]), [m["symbol"]] * len(arr(t["x"])), arr(m["line"]["color"]), arr(m["line"]["width"])))
    assert sorted(runs[V.label("k_eq_v")]) == [(0.01, "circle", 0, 1), (0.1, "x", 0, 1)]
    # the spiky run (wd 0.03) is ringed black and thicker
    assert sorted(runs[V.label("qkv")]) == [(0.01, "circle", 0, 1), (0.03, "circle", 1, 3), (0.1, "circle", 0, 1)]
    summary = at.dataframe[0].value.set_index("variant")
    assert summary.loc["qkv", "best_weight_decay"] == "0.03"
    assert summary.loc["qkv", "spiky runs"] == 1 and summary.loc["k_eq_v", "diverged runs"] == 1
    assert md("qkv-wd0.03") + " (wd 0.03: 1 spikes)" in at.warning[0].value      # run names shown as text
    assert md("k_eq_v-wd0.1") + " (wd 0.1: diverged)" in at.warning[0].value


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
            # a current job (app.state.current_notes): every other weight metric explained by a note
            con.execute("INSERT INTO analysis_jobs (checkpoint_id, kind, metric_version, notes) "
                        "VALUES (?, 'weights', ?, ?)", [rid, METRIC_VERSION, ABSENT])
            for layer in (0, 1):
                con.execute("INSERT INTO analysis_results (checkpoint_id, layer, head, metric, value, "
                            "metric_version) VALUES (?, ?, NULL, 'norm_k', ?, ?)",
                            [rid, layer, 3.0 / wd ** 0.5, METRIC_VERSION])
    at = page_test("weight_decay").run()
    assert not at.exception, at.exception
    trace = figures(at)["wd_norms"]["data"][0]
    assert V.label("qkv") in trace["name"]
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
    # loss = 3 + (log10 wd + 1.5)^2 at 0.01, 0.03, 0.1: a bowl, nearly flat across it
    assert abs(float(summary.loc["qkv", "slope"])) < 0.05 and float(summary.loc["qkv", "curvature"]) > 1
    # an absent statistic is an em dash, never "None" or "nan"; the reason is beside it
    assert summary.loc["k_eq_v", ["slope", "curvature", "best wd 95% CI", "slope 95% CI"]].tolist() == ["\u2014"] * 4
    assert summary.loc["k_eq_v", "why absent"] == (
        "slope, curvature: 2 distinct weight decays > 0 (0.01, 0.1); slope and curvature need >= 3; "
        "intervals: one run per weight decay: an interval needs repeated runs (seeds) at a weight decay")
    assert summary.loc["qkv", "slope 95% CI"] == "\u2014" and summary.loc["qkv", "best in"] == "\u2014"
    assert not summary.astype(str).isin(["None", "nan", "NaN", "<NA>"]).any().any()
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
    bar = next(t for t in fig["data"] if "error_y" in t and t.get("legendgroup") == V.label("qkv"))
    assert arr(bar["x"]) == [0.001, 0.01, 0.1] and list(bar["text"]) == ["", "", "n=3"]
    np.testing.assert_allclose(arr(bar["y"]), [2.7, 2.8, 2.9])
    up, down = arr(bar["error_y"]["array"]), arr(bar["error_y"]["arrayminus"])
    assert up[:2] == [0, 0] and down[:2] == [0, 0]
    # seeds 2.88, 2.90, 2.92: the t interval's half-width t_{2, 0.975} s / sqrt(3), s = 0.02
    half = 4.30265272975 * 0.02 / np.sqrt(3)
    np.testing.assert_allclose([up[2], down[2]], [half, half], rtol=1e-6)
    summary = _summary(at)
    q = summary.loc["qkv"]
    lo, hi = (float(v) for v in q["slope 95% CI"].split(" to "))
    assert q["slope"] == "+0.1000" and lo <= 0.1 <= hi
    # 0.001 beats 0.01 by 0.1, five seed sds; with the seeds' 2 degrees of freedom (t tails) about
    # one posterior draw in twenty picks 0.01
    assert (q["best_weight_decay"], q["best wd 95% CI"]) == ("0.001", "0.001 to 0.01")
    assert q["best in"].endswith("%" + " of draws") and 90 <= int(q["best in"].split("%")[0]) <= 99
    lone = summary.loc["wq_identity"]
    assert lone["best_weight_decay"] == "\u2014" and lone["n_runs"] == 1
    assert "best wd: 1 run with a loss; a best weight decay needs >= 2 runs at >= 2 weight decays" in lone["why absent"]
    points = at.dataframe[1].value
    row = points[(points["variant"] == "qkv") & (points["weight_decay"] == 0.1)].iloc[0]
    assert row["n_runs"] == 3 and row["mean"] == pytest.approx(2.9)
    lo, hi = (float(v) for v in row["95% CI"].split(" to "))
    assert (lo, hi) == pytest.approx((2.9 - half, 2.9 + half), abs=6e-4)      # as the table rounds
    # a weight decay with one run: no interval, and the cell says why instead of "None"
    lone_wd = points[(points["variant"] == "qkv") & (points["weight_decay"] == 0.001)].iloc[0]
    assert lone_wd["95% CI"] == "\u2014 (one run)"


def test_best_loss_is_a_url_choice(seeds_db):
    at = page_test("weight_decay", {"wl": "best"}).run()
    assert not at.exception, at.exception
    assert at.radio(key="wd_statistic").value == "best"
    fig = figures(at)["wd_curve"]
    assert fig["layout"]["yaxis"]["title"]["text"] == "best val/loss"
    at.radio(key="wd_statistic").set_value("final").run()
    assert qp(at, "wl") is None


# ---- random sweeps: the regression beside the grouped view -------------------------------------

SWEEP_A = 0.08  # d final val/loss / d log10(wd) in the sweep below


@pytest.fixture
def sweep_db(tmp_path, monkeypatch):
    """A 40-trial Optuna-like sweep of qkv (lr, wd log-uniform, dropout uniform; trial 0 at wd 0):
    final val loss 3 + 0.08 log10(wd) - 0.3 log10(lr) + 0.5 dropout + noise (sd 0.02)."""
    db = tmp_path / "sweep.duckdb"
    rng = np.random.default_rng(0)
    n = 40
    lr, wd, dropout = 10 ** rng.uniform(-4, -2, n), 10 ** rng.uniform(-3, 0, n), rng.uniform(0, 0.3, n)
    wd[0] = 0.0
    final = (3 + SWEEP_A * np.log10(np.where(wd > 0, wd, 1.0)) - 0.3 * np.log10(lr) + 0.5 * dropout
             + rng.normal(0, 0.02, n))
    store = Store(db)
    store.migrate()
    with store.transaction() as con:
        for i in range(n):
            con.execute("INSERT INTO runs (id, name, source, format, variant, weight_decay, lr, config) "
                        "VALUES (?, ?, ?, 'csv', 'qkv', ?, ?, ?)",
                        [i + 1, f"trial_{i}", f"/s/{i}", float(wd[i]), float(lr[i]),
                         json.dumps({"lr": float(lr[i]), "dropout": float(dropout[i]), "weight_decay": float(wd[i])})])
            for step, val in ((0, final[i] + 1), (100, final[i] + 0.5), (200, final[i])):
                con.execute("INSERT INTO points (run_id, step, metric, value) VALUES (?, ?, 'val/loss', ?)",
                            [i + 1, step, float(val)])
        refresh_run_stats(con, list(range(1, n + 1)))
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    return db


@pytest.mark.slow
def test_random_sweep_shows_the_regression_beside_the_grouped_view(sweep_db):
    at = page_test("weight_decay").run()
    assert not at.exception, at.exception
    figs = figures(at)
    assert {"wd_regression", "wd_coef"} <= set(figs)
    # its 40 one-run groups are not drawn as 40 lines of the grouped chart (the only variant: no chart)
    assert "wd_curve" not in figs
    summary = next(d.value for d in at.dataframe if "slope 95% CI" in d.value.columns)
    assert len(summary) == 40 and set(summary["method"]) == {"regression"}
    shown = "\n".join(m.value for m in at.markdown)
    # one line for the 40 one-run groups, not 40 lines of reasons
    assert ("* **grouped statistics** n/a for 40 of the 40 groups of qkv: each holds runs at one weight decay "
            "(a random sweep); the regression under *Random sweeps* is used instead") in shown
    assert "**slope, curvature** n/a" not in shown
    assert ("* **qkv**: regression (0 of 40 runs are in groups with runs at >= 2 weight decays (under half): "
            "regression over the variant's runs)") in shown
    # partial dependence line, linear line and the 39 runs with wd > 0 as points
    traces = {t["name"]: t for t in figs["wd_regression"]["data"]}
    label = V.label("qkv")
    assert len(arr(traces[f"{label}: runs"]["x"])) == 39 and min(arr(traces[f"{label}: runs"]["x"])) > 0
    assert len(arr(traces[f"{label}: partial dependence (trees)"]["y"])) == 25
    assert figs["wd_regression"]["layout"]["xaxis"]["type"] == "log"
    # the coefficient with its interval and n, against the zero line
    coef = figs["wd_coef"]
    point = coef["data"][0]
    b = arr(point["x"])[0]
    lo, hi = b - arr(point["error_x"]["arrayminus"])[0], b + arr(point["error_x"]["array"])[0]
    assert lo < SWEEP_A < hi and list(point["text"]) == ["n=39"]
    assert [(s["x0"], s["x1"]) for s in coef["layout"]["shapes"]] == [(0, 0)]
    table = next(d.value for d in at.dataframe if "wd coefficient" in d.value.columns).iloc[0]
    assert table["runs"] == 39 and float(table["wd coefficient"]) == pytest.approx(b, abs=1e-4)
    assert table["covariates"] == "dropout, log10(lr)" and table["why absent"] == ""
    assert table["left out"] == "1 run at wd 0 left out (log10 0 is undefined)"
    ci_lo, ci_hi = (float(v) for v in table["95% CI"].split(" to "))
    assert ci_lo == pytest.approx(lo, abs=1e-4) and ci_hi == pytest.approx(hi, abs=1e-4)


def test_the_estimator_is_a_url_choice(wd_db):
    at = page_test("weight_decay", {"we": "grouped"}).run()
    assert not at.exception, at.exception
    assert at.radio(key="wd_method").value == "grouped"
    assert "wd_regression" not in figures(at)
    assert any(c.value.startswith("No variant uses the regression") for c in at.caption)
    at.radio(key="wd_method").set_value("regression").run()
    assert qp(at, "we") == "regression"
    # 3 qkv runs are too few: the regression says why instead of drawing a number
    table = next(d.value for d in at.dataframe if "wd coefficient" in d.value.columns).set_index("variant")
    assert table.loc["qkv", "wd coefficient"] == "\u2014"
    assert table.loc["qkv", "why absent"] == ("3 runs at 3 distinct weight decays > 0 with a value; a regression "
                                              "needs >= 8 runs at >= 3 weight decays > 0")


def _checkpoints_of_three_runs(store: Store) -> None:
    """Checkpoints at step 4,000 of the first three runs, each at ``/gone/ckptN`` (no file)."""
    with store.transaction() as con:
        for rid, variant, wd in RUNS[:3]:
            con.execute("INSERT INTO checkpoints (id, path, sha256, architecture, variant, n_layers, n_heads, "
                        "n_kv_heads, d_model, d_head, run_id, step) "
                        "VALUES (?, ?, ?, 'gpt2', 'qkv', 2, 2, 2, 8, 4, ?, 4000)",
                        [rid, f"/gone/ckpt{rid}", f"s{rid}", rid])


def _store_as_analysed(store: Store, checkpoint_id: int) -> None:
    """What the weights analysis would store for the norms chart: one current job and a norm."""
    with store.transaction() as con:
        con.execute("INSERT INTO analysis_jobs (checkpoint_id, kind, metric_version, notes) "
                    "VALUES (?, 'weights', ?, ?)", [checkpoint_id, METRIC_VERSION, ABSENT])
        con.execute("INSERT INTO analysis_results (checkpoint_id, layer, head, metric, value, metric_version) "
                    "VALUES (?, 0, NULL, 'norm_k', 2.0, ?)", [checkpoint_id, METRIC_VERSION])


def test_analysing_checkpoints_names_them_and_redraws_without_the_stale_notice(wd_db, monkeypatch):
    store = Store(wd_db)
    _checkpoints_of_three_runs(store)
    done = []

    def fake_analyze(store, checkpoint_id, **kw):
        done.append(checkpoint_id)
        _store_as_analysed(store, checkpoint_id)
        return []

    monkeypatch.setattr("app.jobs.analyze", fake_analyze)
    at = page_test("weight_decay").run()
    assert not at.exception, at.exception
    notice = next(c.value for c in at.caption if "not analysed yet" in c.value)
    # named by run and step as every picker names them (app.pickers.checkpoint_label)
    assert notice == ("3 of 3 runs' latest checkpoints are not analysed yet: qkv-wd0.01 · step 4,000 (#1), "
                      "qkv-wd0.03 · step 4,000 (#2), qkv-wd0.1 · step 4,000 (#3).")
    assert "wd_norms" not in figures(at)
    at.button(key="wd_analyse").click().run()
    assert not at.exception, at.exception
    assert done == [1, 2, 3]
    assert not any("not analysed yet" in c.value for c in at.caption)
    assert not [b for b in at.button if b.key == "wd_analyse"]
    assert shown(at.success[0].value) == ("Analysed qkv-wd0.01 · step 4,000 (#1), qkv-wd0.03 · step 4,000 (#2), "
                                          "qkv-wd0.1 · step 4,000 (#3).")
    assert "wd_norms" in figures(at)
    # the next run of the page (any widget change) drops the one-off notice
    at.run()
    assert not at.success and "wd_norms" in figures(at)


def test_a_checkpoint_that_fails_to_analyse_does_not_stop_the_others(wd_db, monkeypatch):
    """The button analyses every listed checkpoint: one whose file is gone is one error line,
    the others are analysed and drawn, and the button stays for the one left."""
    from app.jobs import analyze as real_analyze

    store = Store(wd_db)
    _checkpoints_of_three_runs(store)
    done = []

    def analyze_but_2(store, checkpoint_id, **kw):
        if checkpoint_id == 2:
            return real_analyze(store, checkpoint_id, **kw)     # its file is gone: StoreError
        done.append(checkpoint_id)
        _store_as_analysed(store, checkpoint_id)
        return []

    monkeypatch.setattr("app.jobs.analyze", analyze_but_2)
    at = page_test("weight_decay").run()
    at.button(key="wd_analyse").click().run()
    assert not at.exception, at.exception
    assert done == [1, 3]
    assert shown(at.success[0].value) == "Analysed qkv-wd0.01 · step 4,000 (#1), qkv-wd0.1 · step 4,000 (#3)."
    assert [shown(e.value) for e in at.error] == [
        "qkv-wd0.03 · step 4,000 (#2): /gone/ckpt2: checkpoint 2 is stored but its file is gone; "
        "re-ingest it from its new place"]
    assert at.button(key="wd_analyse").label == "Analyse 1 checkpoints"
    assert "wd_norms" in figures(at)


def test_a_grid_and_a_sweep_side_by_side(wd_db):
    """qkv and k_eq_v from a grid keep the grouped chart; a 12-run random sweep of wq_identity is drawn
    only under Random sweeps."""
    store = Store(wd_db)
    rng = np.random.default_rng(5)
    with store.transaction() as con:
        for i in range(12):
            rid, lr, wd = 100 + i, float(10 ** rng.uniform(-4, -2)), float(10 ** rng.uniform(-3, 0))
            con.execute("INSERT INTO runs (id, name, source, format, variant, weight_decay, config) "
                        "VALUES (?, ?, ?, 'csv', 'wq_identity', ?, ?)",
                        [rid, f"trial_{i}", f"/t/{i}", wd, json.dumps({"lr": lr})])
            con.execute("INSERT INTO points (run_id, step, metric, value) VALUES (?, 100, 'val/loss', ?)",
                        [rid, 3 + 0.1 * math.log10(wd) - 0.2 * math.log10(lr)])
        refresh_run_stats(con, list(range(100, 112)))
    at = page_test("weight_decay").run()
    assert not at.exception, at.exception
    figs = figures(at)
    lines = sorted(t["name"] for t in figs["wd_curve"]["data"] if t.get("mode") == "lines")
    assert lines == sorted([V.label("k_eq_v"), V.label("qkv")])
    assert any("Not drawn here: wq_identity (a group per run; see *Random sweeps*)." in c.value for c in at.caption)
    names = {t["name"] for t in figs["wd_regression"]["data"]}
    assert f"{V.label('wq_identity')}: runs" in names and not any(V.label("qkv") in n for n in names)
    # exact data: the coefficient is the truth, its interval collapses onto it
    point = figs["wd_coef"]["data"][0]
    assert arr(point["x"])[0] == pytest.approx(0.1, abs=1e-9) and list(point["text"]) == ["n=12"]


def test_the_page_says_which_parameter_group_the_weight_decay_is():
    import pandas as pd

    from app.pages.weight_decay import applies_to_line

    runs = pd.DataFrame({"name": ["rec1", "rec2", "plain"],
                         "config": [{"weight_decay_applies_to": "Muon(hidden_matrix_params)"},
                                    {"weight_decay_applies_to": "Muon(hidden_matrix_params)"}, {}]})
    assert applies_to_line(runs) == (
        "Weight decay here is the one applied to the attention and MLP matrices, read from the optimizer call "
        "of the run's code: Muon(hidden_matrix_params) (2 runs). Every parameter group's value is in the run's "
        "config (`optimizer_groups`).")
    assert applies_to_line(runs.iloc[2:]) is None


# -- vision and language runs by task ------------------------------------------------
def test_vision_and_language_runs_are_grouped_by_task_and_legends_name_it(tmp_path, monkeypatch):
    # qkv at three weight decays in each task; (Q=K-V)+ only as vision runs; QVV(3) (stored k_eq_v) in vision
    runs = [(1, "qkv", 0.01), (2, "qkv", 0.03), (3, "qkv", 0.1), (4, "qkv", 0.01), (5, "qkv", 0.03), (6, "qkv", 0.1),
            (7, "q_eq_k_plus", 0.01), (8, "q_eq_k_plus", 0.1), (9, "k_eq_v", 0.01), (10, "k_eq_v", 0.1)]
    db = tmp_path / "tasks.duckdb"
    store = _fill(db, runs, curve=lambda rid, wd: [4.0 - rid / 100 - 0.1 * i for i in range(5)])
    with store.transaction() as con:
        for rid in range(4, 11):
            cfg = {"n_layer": 2, "seed": rid, "task": "image"} | ({"paper_condition": "QVV(3)"} if rid >= 9 else {})
            con.execute("UPDATE runs SET config = ? WHERE id = ?", [json.dumps(cfg), rid])
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("weight_decay").run()
    assert not at.exception, at.exception
    figs = figures(at)
    # one figure, and one y axis, per task (language first); the QVV(3) runs by their condition
    assert [k for k in figs if k and k.startswith("wd_curve")] == ["wd_curve_language", "wd_curve_image"]
    assert sorted(t["name"] for t in figs["wd_curve_language"]["data"] if t["mode"] == "lines") == ["Q-K-V"]
    assert sorted(t["name"] for t in figs["wd_curve_image"]["data"] if t["mode"] == "lines") == [
        "(Q=K-V)+ [image]", "Q-K-V [image]", "QVV(3) [image]"]
    summary = at.dataframe[0].value
    # language first (as Results), then by stored variant: QVV(3) is stored as k_eq_v
    assert list(zip(summary["task"], summary["variant"])) == [
        ("language", "qkv"), ("image", "QVV(3)"), ("image", "q_eq_k_plus"), ("image", "qkv")]
    # each task's qkv runs are fitted on their own: 3 runs at 3 weight decays each
    qkv = summary[summary["variant"] == "qkv"].set_index("task")
    assert qkv.loc["language", "n_runs"] == 3 and qkv.loc["image", "n_runs"] == 3
    assert at.dataframe[0].proto.placeholder == "\u2014"


def test_a_run_whose_loss_went_nan_is_diverged_on_the_page_as_in_the_command(tmp_path, monkeypatch, capsys):
    """Lightning ``version_N`` folders ingested from disk, one run's last validation loss ``nan`` (stored
    as NULL), every file finished without a trailing newline: the page and ``wd-sensitivity`` both
    call that run diverged (the page dropped the NULL and called it finished)."""
    from app.cli import main

    wds = [0.01, 0.01, 0.1, 0.1, 1.0, 1.0]
    for i, wd in enumerate(wds):
        run = tmp_path / "sweep" / "lightning_logs" / f"version_{i}"
        run.mkdir(parents=True)
        (run / "hparams.yaml").write_text(f"weight_decay: {wd}\nn_layer: 4\nseed: {i}\n")
        vals = [f"{3.5 - 0.1 * e + 0.01 * i:.4f}" for e in range(3)] + (["nan"] if i == 3 else [])
        (run / "metrics.csv").write_text("epoch,step,val_loss\n" + "\n".join(
            f"{e},{100 * (e + 1) - 1},{v}" for e, v in enumerate(vals)))      # no trailing newline
        os.utime(run / "metrics.csv", (time.time() - 3600, time.time() - 3600))   # finished an hour ago
    db = tmp_path / "sweep.duckdb"
    assert main(["ingest", str(tmp_path / "sweep"), "--db", str(db)]) == 0
    with Store(db).connect() as con:
        assert con.execute("SELECT count(*), count(value) FROM points WHERE metric = 'val/loss'").fetchone() == (19, 18)
    capsys.readouterr()
    assert main(["wd-sensitivity", "--db", str(db), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert sum(row["diverged"]) == 1 and row["diverged"][row["weight_decays"].index(0.1) + 1] is True
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("weight_decay").run()
    assert not at.exception, at.exception
    summary = at.dataframe[0].value
    assert summary["diverged runs"].tolist() == [1] and summary["n_runs"].tolist() == [6]
    assert {p["weight_decay"]: p["n_diverged"] for p in row["per_wd"]} == {0.01: 0, 0.1: 1, 1.0: 0}
    # the chart draws it as a cross and leaves it out of the mean line at wd 0.1
    crosses = [t for t in figures(at)["wd_curve"]["data"]
               if t.get("mode") == "markers" and t["marker"]["symbol"] == "x"]
    assert [arr(t["x"]) for t in crosses] == [[0.1]]


@pytest.mark.slow
def test_random_sweeps_of_two_tasks_get_a_figure_and_y_axis_each(sweep_db):
    """The 40-trial language sweep beside a 12-trial ViT sweep (losses near 1, not 3): two regression
    figure pairs, each with its own task's runs only; the table names both."""
    rng = np.random.default_rng(1)
    with Store(sweep_db).transaction() as con:
        for i in range(12):
            rid, lr, wd = 200 + i, float(10 ** rng.uniform(-4, -2)), float(10 ** rng.uniform(-3, 0))
            con.execute("INSERT INTO runs (id, name, source, format, variant, weight_decay, lr, config) "
                        "VALUES (?, ?, ?, 'csv', 'qkv', ?, ?, ?)",
                        [rid, f"vit_trial_{i}", f"/v/{i}", wd, lr, json.dumps({"lr": lr, "task": "image"})])
            con.execute("INSERT INTO points (run_id, step, metric, value) VALUES (?, 100, 'val/loss', ?)",
                        [rid, 1 + 0.2 * math.log10(wd) - 0.1 * math.log10(lr)])
        refresh_run_stats(con, list(range(200, 212)))
    at = page_test("weight_decay").run()
    assert not at.exception, at.exception
    figs = figures(at)
    assert {"wd_regression_language", "wd_coef_language", "wd_regression_image", "wd_coef_image"} <= set(figs)
    assert "wd_regression" not in figs
    lang = [t for t in figs["wd_regression_language"]["data"] if t["name"].endswith(": runs")]
    vit = [t for t in figs["wd_regression_image"]["data"] if t["name"].endswith(": runs")]
    assert [len(arr(t["y"])) for t in lang] == [39] and [len(arr(t["y"])) for t in vit] == [12]
    assert min(arr(lang[0]["y"])) > 2 and max(arr(vit[0]["y"])) < 2      # each on its own axis
    coef = figs["wd_coef_image"]["data"][0]
    assert arr(coef["x"])[0] == pytest.approx(0.2, abs=1e-9) and list(coef["text"]) == ["n=12"]
    table = next(d.value for d in at.dataframe if "wd coefficient" in d.value.columns)
    assert table["runs"].tolist() == [12, 39]
