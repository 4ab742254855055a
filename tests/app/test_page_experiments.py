"""Experiments page in AppTest: runs table, filters, curves, bands, final metric view, metadata edit."""
from __future__ import annotations

import base64
import json

import numpy as np
import pandas as pd
import pytest

from loaders.store import Store, refresh_run_stats
from tests.app.apptest import page_test, shown

#: (id, name, variant, weight decay); four runs, two variants.
RUNS = [(1, "qkv-wd0.01", "qkv", 0.01), (2, "qkv-wd0.1", "qkv", 0.1),
        (3, "kv-wd0.01", "k_eq_v", 0.01), (4, "kv-wd0.1", "k_eq_v", 0.1)]


def figures(at) -> dict[str, dict]:
    """Every plotly chart on the page by key, as its JSON spec."""
    return {e.key: json.loads(e.proto.spec) for e in at.get("plotly_chart")}


def arr(v) -> list:
    """A trace's data as a list; plotly sends numpy arrays as base64 ``{dtype, bdata, shape}``."""
    if isinstance(v, dict) and "bdata" in v:
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        if "shape" in v:
            a = a.reshape([int(n) for n in str(v["shape"]).split(",")])
        return a.tolist()
    return list(v)


def qp(at, key: str) -> str | None:
    """A query parameter as one string (AppTest keeps either a string or a list of them)."""
    v = at.query_params.get(key)
    return v[-1] if isinstance(v, list) else v


def fill_runs(db, runs=RUNS, steps: int = 300) -> Store:
    """Runs and their train/val loss written straight into the schema (no log reader involved)."""
    store = Store(db)
    store.migrate()
    rows = []
    for rid, _, variant, wd in runs:
        s = np.arange(steps)
        train = 4.0 - s / steps - (0.2 if variant == "qkv" else 0.0) + rid * 0.01
        rows.append(pd.DataFrame({"run_id": rid, "step": s, "metric": "train/loss", "value": train,
                                  "wall_time": 1000.0 + s, "tokens": s * 512}))
        v = np.arange(0, steps, 50)
        rows.append(pd.DataFrame({"run_id": rid, "step": v, "metric": "val/loss",
                                  "value": 4.2 - v / steps + wd + (0.05 if variant == "k_eq_v" else 0.0), "wall_time": 1000.0 + v, "tokens": v * 512}))
    frame = pd.concat(rows, ignore_index=True)
    with store.transaction() as con:
        for rid, name, variant, wd in runs:
            con.execute("INSERT INTO runs (id, name, source, format, variant, weight_decay, lr) "
                        "VALUES (?, ?, ?, 'csv', ?, ?, 6e-4)", [rid, name, f"/exp/{name}", variant, wd])
        con.register("f", frame)
        con.execute("INSERT INTO points SELECT run_id, step, metric, value, wall_time, tokens FROM f")
        refresh_run_stats(con, frame["run_id"].unique())
    return store


@pytest.fixture
def runs_db(tmp_path, monkeypatch):
    db = tmp_path / "runs.duckdb"
    fill_runs(db)
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    return db


def test_empty_database_says_how_to_get_data_in(tmp_path, monkeypatch):
    db = tmp_path / "e.duckdb"
    Store(db).migrate()
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("experiments").run()
    assert not at.exception
    assert at.info[0].value.startswith("No training runs stored yet. Ingest a folder of logs")


def test_opens_with_the_best_run_of_each_group_then_selecting_adds_traces(runs_db):
    at = page_test("experiments").run()
    assert not at.exception
    # final val/loss = 4.2 - 250/300 + wd (+0.05 for k_eq_v): runs 1 (qkv) and 3 (k_eq_v) are best
    assert at.multiselect(key="exp_runs").value == [1, 3]
    names = [t["name"] for t in figures(at)["exp_curves"]["data"]]
    assert names == ["qkv-wd0.01 (Q-K-V)", "kv-wd0.01 (Q-K=V)"]
    assert qp(at, "runs") == "1,3" and qp(at, "m") == "val/loss"
    assert len(at.dataframe[0].value) == 4
    at.multiselect(key="exp_runs").unselect(3).run()
    assert [t["name"] for t in figures(at)["exp_curves"]["data"]] == ["qkv-wd0.01 (Q-K-V)"]
    at.multiselect(key="exp_runs").select(4).run()
    assert [t["name"] for t in figures(at)["exp_curves"]["data"]] == ["qkv-wd0.01 (Q-K-V)", "kv-wd0.1 (Q-K=V)"]
    assert qp(at, "runs") == "1,4"
    at.multiselect(key="exp_runs").unselect(1).unselect(4).run()
    assert "exp_curves" not in figures(at)
    assert at.info[0].value == "Pick runs above to overlay their curves."


#: The page as the navigation runs it, with a second "page" to leave to: the navigation clears
#: the URL and Streamlit forgets the widgets of a page that is not drawn.
_TWO_PAGES = """
import sys
sys.path.insert(0, {root!r})
import streamlit as st
from app.state import show_errors
import app.pages.experiments as page
if st.session_state.get("elsewhere"):
    st.write("another page")
else:
    show_errors(page.render)
"""


def test_leaving_the_page_and_coming_back_keeps_the_selection(runs_db):
    from streamlit.testing.v1 import AppTest

    from tests.app.apptest import ROOT

    at = AppTest.from_string(_TWO_PAGES.format(root=str(ROOT)), default_timeout=60).run()
    at.multiselect(key="exp_runs").unselect(1).select(2).run()
    at.selectbox(key="exp_metric").select("train/loss").run()
    assert at.multiselect(key="exp_runs").value == [3, 2]
    at.session_state["elsewhere"] = True
    at.query_params.clear()
    at.run()
    assert not at.get("multiselect")
    at.session_state["elsewhere"] = False
    at.run()
    assert not at.exception
    assert at.multiselect(key="exp_runs").value == [3, 2]
    assert at.selectbox(key="exp_metric").value == "train/loss"
    assert qp(at, "runs") == "3,2" and qp(at, "m") == "train/loss"
    # a selection emptied on purpose stays empty (no default selection on the way back)
    at.multiselect(key="exp_runs").unselect(3).unselect(2).run()
    at.session_state["elsewhere"] = True
    at.query_params.clear()
    at.run()
    at.session_state["elsewhere"] = False
    at.run()
    assert at.multiselect(key="exp_runs").value == []


def test_filters_narrow_the_curves_already_plotted(runs_db):
    at = page_test("experiments", {"runs": "1,2,3,4"}).run()
    assert len(figures(at)["exp_curves"]["data"]) == 4
    at.multiselect(key="exp_variant").select("k_eq_v").run()
    names = [t["name"] for t in figures(at)["exp_curves"]["data"]]
    assert names == ["kv-wd0.01 (Q-K=V)", "kv-wd0.1 (Q-K=V)"]
    assert shown(at.caption[1].value).startswith("2 selected run(s) hidden by the search and filters: qkv-wd0.01")
    at.text_input(key="exp_q").input("wd0.1").run()
    assert [t["name"] for t in figures(at)["exp_curves"]["data"]] == ["kv-wd0.1 (Q-K=V)"]
    assert at.multiselect(key="exp_runs").value == [1, 2, 3, 4]  # kept for when the filters are cleared
    at.multiselect(key="exp_variant").unselect("k_eq_v").run()
    at.text_input(key="exp_q").input("").run()
    assert len(figures(at)["exp_curves"]["data"]) == 4


def test_url_reopens_the_same_view(runs_db):
    at = page_test("experiments", {"runs": "2,4", "m": "train/loss", "x": "tokens", "logy": "1"}).run()
    assert not at.exception
    fig = figures(at)["exp_curves"]
    assert len(fig["data"]) == 2
    assert fig["layout"]["yaxis"]["type"] == "log"
    assert fig["layout"]["xaxis"]["title"]["text"] == "tokens seen"
    assert arr(fig["data"][0]["x"])[:3] == [0, 512, 1024]


def test_url_values_it_cannot_use_are_named_in_one_line(runs_db):
    at = page_test("experiments", {"runs": "2,x,99", "s": "abc", "x": "epochs", "variant": "qkv,mqa"}).run()
    assert not at.exception
    notes = [shown(c.value) for c in at.caption if c.value.startswith("Ignored in the URL")]
    assert notes == ["Ignored in the URL: variant='mqa' (no run shown has it).",
                     "Ignored in the URL: runs='x' (expected an integer); runs=99 (no such run); "
                     "x='epochs' (one of step, tokens, wall_time); s='abc' (expected a number)."]
    assert len(figures(at)["exp_curves"]["data"]) == 1 and at.slider(key="exp_s").value == 0.0


def test_metric_picker_and_smoothing_change_the_curves(runs_db):
    at = page_test("experiments", {"runs": "1"}).run()
    ys_val = arr(figures(at)["exp_curves"]["data"][0]["y"])
    at.selectbox(key="exp_metric").select("train/loss").run()
    trace = figures(at)["exp_curves"]["data"][0]
    assert arr(trace["y"]) != ys_val and len(arr(trace["x"])) == 300
    at.slider(key="exp_s").set_value(0.9).run()
    data = figures(at)["exp_curves"]["data"]
    assert len(data) == 2  # faint raw line and the smoothed one
    assert qp(at, "s") == "0.9"


def test_group_by_variant_draws_mean_and_band(runs_db):
    at = page_test("experiments", {"runs": "1,2,3,4", "m": "train/loss"}).run()
    at.toggle(key="exp_group").set_value(True).run()
    names = [t.get("name") for t in figures(at)["exp_curves"]["data"] if t.get("showlegend", True)]
    assert names == ["Q-K-V (n=2)", "Q-K=V (n=2)"]
    assert qp(at, "group") == "1"


def _set_heads(db, heads: dict[int, tuple[int, int, str | None]]):
    """Give runs a config with n_head (and a task) and their n_kv_heads."""
    with Store(db).transaction() as con:
        for rid, (h, kv, task) in heads.items():
            cfg = {"n_head": h} | ({"task": task} if task else {})
            con.execute("UPDATE runs SET n_kv_heads = ?, config = ? WHERE id = ?", [kv, json.dumps(cfg), rid])


def test_by_variant_keeps_mha_mqa_and_tasks_apart(runs_db):
    # runs 1 and 2 are both qkv: one MHA, one MQA; run 4 a vision k_eq_v run
    _set_heads(runs_db, {1: (4, 4, None), 2: (4, 1, None), 3: (4, 4, None), 4: (4, 4, "vision")})
    at = page_test("experiments", {"runs": "1,2,3,4", "m": "train/loss", "group": "1"}).run()
    assert not at.exception
    lines = [t for t in figures(at)["exp_curves"]["data"] if t.get("showlegend", True)]
    # in table order: task, then head sharing (MHA before MQA), then variant; runs of two tasks
    # are plotted, so every name says its task, language too
    assert [t["name"] for t in lines] == ["Q-K-V · MHA · language (n=1)", "Q-K=V · MHA · language (n=1)",
                                          "Q-K-V · MQA · language (n=1)", "Q-K=V · MHA · vision (n=1)"]
    styles = {t["name"]: (t["line"]["color"], t["line"]["dash"]) for t in lines}
    from analysis.variants import COLORS

    assert styles["Q-K-V · MHA · language (n=1)"] == (COLORS["qkv"], "solid")
    assert styles["Q-K-V · MQA · language (n=1)"] == (COLORS["qkv"], "dot")     # one hue, another dash


def test_curves_take_the_variant_colour_and_the_sharing_dash(runs_db):
    from analysis.variants import COLORS

    _set_heads(runs_db, {1: (4, 4, None), 2: (4, 1, None), 3: (4, 2, None), 4: (4, 4, None)})
    at = page_test("experiments", {"runs": "1,2,3,4", "m": "train/loss"}).run()
    by = {t["name"]: t["line"] for t in figures(at)["exp_curves"]["data"]}
    assert by["qkv-wd0.01 (Q-K-V · MHA)"]["color"] == COLORS["qkv"]
    assert by["qkv-wd0.1 (Q-K-V · MQA)"]["dash"] == "dot"
    assert by["kv-wd0.01 (Q-K=V · GQA-2)"] == {"color": COLORS["k_eq_v"], "width": 1, "dash": "dash"}


def test_smoothed_validation_curve_ends_within_its_data(tmp_path, monkeypatch):
    # 17 validation points, falling fast: per logged point, an EMA at 0.9 ended ~0.3 above them
    db = tmp_path / "val17.duckdb"
    store = Store(db)
    store.migrate()
    steps = np.arange(0, 4001, 250)
    loss = 1.3 + 4.1 * np.exp(-steps / 600)
    frame = pd.DataFrame({"run_id": 1, "step": steps, "metric": "val/loss", "value": loss,
                          "wall_time": steps.astype(float), "tokens": steps})
    with store.transaction() as con:
        con.execute("INSERT INTO runs (id, name, source, format, variant) VALUES (1, 'r', '/r', 'csv', 'qkv')")
        con.register("f", frame)
        con.execute("INSERT INTO points SELECT run_id, step, metric, value, wall_time, tokens FROM f")
        refresh_run_stats(con, [1])
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("experiments", {"runs": "1", "s": "0.9"}).run()
    raw, smoothed = figures(at)["exp_curves"]["data"]
    y = arr(smoothed["y"])
    assert len(y) == 17 and y[0] == pytest.approx(loss[0])
    assert min(loss[-2:]) <= y[-1] <= max(loss[-2:])


def test_accuracy_metrics_are_picked_like_the_loss_and_best_is_their_highest(runs_db):
    frame = pd.DataFrame({"run_id": [1, 1, 1, 2, 2], "step": [0, 100, 200, 0, 200],
                          "metric": ["val/accuracy"] * 3 + ["val_top1"] * 2, "value": [0.2, 0.8, 0.7, 10.0, 30.0],
                          "wall_time": 0.0, "tokens": 0})
    with Store(runs_db).transaction() as con:
        con.register("f", frame)
        con.execute("INSERT INTO points SELECT run_id, step, metric, value, wall_time, tokens FROM f")
        refresh_run_stats(con, [1, 2])
    at = page_test("experiments", {"runs": "1,2"}).run()
    options = at.selectbox(key="exp_metric").options
    assert options[:3] == ["val/loss", "val/accuracy", "val_top1"]
    at.selectbox(key="exp_fm").select("val/accuracy").run()
    at.radio(key="exp_fv").set_value("best").run()
    fig = figures(at)["exp_final"]
    assert [arr(t["y"]) for t in fig["data"]] == [[0.8]]          # the highest accuracy, not the lowest
    assert fig["layout"]["yaxis"]["title"]["text"] == "best val/accuracy"
    # the user says lower is better for it: stored, and the best value follows (editable)
    at.selectbox(key="exp_better_val/accuracy").select("min").run()
    assert not at.exception, at.exception
    from loaders.curves import metric_directions
    assert metric_directions(Store(runs_db)) == {"val/accuracy": "min"}
    assert [arr(t["y"]) for t in figures(at)["exp_final"]["data"]] == [[0.2]]
    at.selectbox(key="exp_better_val/accuracy").select("auto").run()
    assert metric_directions(Store(runs_db)) == {}


def test_filters_narrow_the_table(runs_db):
    at = page_test("experiments", {"variant": "k_eq_v"}).run()
    assert at.dataframe[0].value["name"].tolist() == ["kv-wd0.01", "kv-wd0.1"]
    at.text_input(key="exp_q").input("wd0.1").run()
    assert at.dataframe[0].value["name"].tolist() == ["kv-wd0.1"]
    assert qp(at, "q") == "wd0.1"


def test_final_metric_against_weight_decay(runs_db):
    at = page_test("experiments").run()
    fig = figures(at)["exp_final"]
    by_variant = {t["name"]: t for t in fig["data"]}
    assert list(by_variant) == ["Q-K-V", "Q-K=V"]   # paper labels, variants in their order
    assert fig["layout"]["xaxis"]["type"] == "log"
    assert fig["layout"]["xaxis"]["title"]["text"] == "weight decay"  # in words, not the column name
    from analysis.variants import COLORS

    assert by_variant["Q-K-V"]["marker"]["color"] == COLORS["qkv"]   # the colour it has in the curves
    # final val/loss at step 250 = 4.2 - 250/300 + wd
    assert arr(by_variant["Q-K-V"]["y"]) == pytest.approx([4.2 - 250 / 300 + 0.01, 4.2 - 250 / 300 + 0.1])
    at.radio(key="exp_view").set_value("Parallel coordinates").run()
    par = figures(at)["exp_final"]
    assert par["data"][0]["type"] == "parcoords"
    labels = [d["label"] for d in par["data"][0]["dimensions"]]
    assert labels == ["weight decay", "learning rate", "variant", "final val/loss"]
    assert par["layout"]["margin"]["t"] >= 80       # room above the axes for their names


def open_editor(at) -> None:
    """Open the "Edit a run's metadata" expander, as a click on it does (its content is drawn only
    while it is open)."""
    assert not at.get("form") and "exp_edit_run" not in [s.key for s in at.selectbox]   # closed: not drawn
    at.session_state["exp_edit"] = True
    at.run()


def test_edit_metadata_is_stored(runs_db):
    at = page_test("experiments").run()
    open_editor(at)
    at.selectbox(key="exp_edit_run").select(2)
    at.run()
    form = at.get("form")[0]
    assert form is not None
    at.text_input[1].input("0.3")  # weight decay field of the form (search box is text_input[0])
    at.button[0].click().run()
    assert not at.exception
    assert shown(at.success[0].value) == "Saved weight_decay for qkv-wd0.1 (id 2)."
    from loaders.logs import list_runs

    run = next(r for r in list_runs(Store(runs_db)) if r["id"] == 2)
    assert run["weight_decay"] == 0.3


@pytest.fixture(scope="module")
def served(tmp_path_factory, chromium_browser):
    """One server on ``fill_runs``'s database for this file's browser tests, in the shared
    Chromium; each test is a session of its own (its own browser context), and none writes."""
    from tests.app.browser import dashboard

    db = tmp_path_factory.mktemp("browser") / "browser.duckdb"
    fill_runs(db)
    with dashboard(db, "--no-demo") as url:
        yield url, chromium_browser


@pytest.mark.browser
def test_experiments_and_weight_decay_in_a_real_browser(served):
    from tests.app.browser import screenshot, session, wait_idle

    with session(served, 1400, 2000) as (url, page):
        page.goto(f"{url}/experiments?runs=")    # a link with no runs: none plotted (no default selection)
        wait_idle(page, timeout=60_000)
        page.locator("[data-testid='stDataFrame']").first.wait_for(timeout=60_000)
        page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
        wait_idle(page, timeout=60_000)
        assert page.locator(".js-plotly-plot").count() == 1  # only the final-metric view
        # select two runs in the picker: the curve chart appears with two lines
        page.locator("[data-testid='stMultiSelect']").filter(has_text="Runs to plot").click()
        page.get_by_role("option", name="qkv-wd0.01 (Q-K-V)").click()
        wait_idle(page, timeout=60_000)
        page.locator("[data-testid='stMultiSelect']").filter(has_text="Runs to plot").click()
        page.get_by_role("option", name="kv-wd0.1 (Q-K=V)").click()
        page.keyboard.press("Escape")
        wait_idle(page, timeout=60_000)
        page.locator(".js-plotly-plot").nth(1).wait_for(timeout=60_000)
        page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .scatterlayer .trace, "
                               ".js-plotly-plot canvas').length > 0", timeout=60_000)
        assert "runs=1%2C4" in page.url or "runs=1,4" in page.url
        # change an input: log y; the URL and the axis follow
        page.get_by_text("log y").click()
        wait_idle(page, timeout=60_000)
        assert "logy=1" in page.url
        screenshot(page, "experiments")
        page.goto(f"{url}/weight-decay")
        wait_idle(page, timeout=60_000)
        page.locator(".js-plotly-plot .scatterlayer .trace").first.wait_for(timeout=60_000)
        wait_idle(page, timeout=60_000)
        screenshot(page, "weight_decay")


@pytest.mark.browser
@pytest.mark.slow
def test_selection_survives_sidebar_navigation_in_a_real_browser(served):
    from tests.app.browser import screenshot, session, wait_idle

    with session(served, 1400, 1600) as (url, page):
        page.goto(f"{url}/experiments")
        wait_idle(page, timeout=180_000)
        page.locator(".js-plotly-plot").nth(1).wait_for(timeout=120_000)  # curves of the default runs
        assert "runs=1%2C3" in page.url or "runs=1,3" in page.url
        page.locator("[data-testid='stMultiSelect']").filter(has_text="Runs to plot").click()
        page.get_by_role("option", name="kv-wd0.1 (Q-K=V)").click()
        page.keyboard.press("Escape")
        wait_idle(page, timeout=120_000)
        page.get_by_role("link", name="Results").first.click()
        wait_idle(page, timeout=120_000)
        page.locator("[data-testid='stDataFrame']").first.wait_for(timeout=120_000)
        screenshot(page, "results")
        page.get_by_role("link", name="Experiments").first.click()
        wait_idle(page, timeout=120_000)
        page.locator(".js-plotly-plot").nth(1).wait_for(timeout=120_000)
        assert "runs=1%2C3%2C4" in page.url or "runs=1,3,4" in page.url
        chips = page.locator("[data-testid='stMultiSelect']").filter(has_text="Runs to plot").inner_text()
        assert "kv-wd0.1 (Q-K=V)" in chips and "qkv-wd0.01 (Q-K-V)" in chips
        screenshot(page, "experiments_after_navigation")


def test_edit_form_has_one_input_per_editable_field(runs_db):
    from app.pages.experiments import EDITABLE
    from loaders.logs.metadata import FIELDS

    assert sorted(EDITABLE) == sorted(FIELDS)        # the form sets what ingest reads, nothing else
    at = page_test("experiments").run()
    open_editor(at)
    at.selectbox(key="exp_edit_run").select(2)
    at.run()
    assert not at.exception, at.exception
    labels = [t.label for t in at.text_input][1:]     # text_input[0] is the search box
    assert labels == ["Weight decay", "Learning rate", "KV heads", "Seed", "Model size (parameters)"]
    assert at.text_input[1].value == "0.1"


def test_a_filter_change_reuses_the_selections_curves(runs_db, monkeypatch):
    from loaders import curves as curves_mod

    calls = []
    query = curves_mod.curves
    def counted(store, ids, *args, **kwargs):
        calls.append(sorted(ids))
        return query(store, ids, *args, **kwargs)

    monkeypatch.setattr(curves_mod, "curves", counted)
    at = page_test("experiments", {"runs": "1,2,3,4", "m": "train/loss"}).run()
    assert calls == [[1, 2, 3, 4]]
    at.multiselect(key="exp_variant").select("k_eq_v").run()
    at.text_input(key="exp_q").input("wd0.1").run()
    assert calls == [[1, 2, 3, 4]]                      # narrowed from the cached curves
    [trace] = figures(at)["exp_curves"]["data"]
    direct = query(Store(runs_db), [4], "train/loss")  # what a query of the shown run alone gives
    assert trace["name"] == "kv-wd0.1 (Q-K=V)"
    assert arr(trace["x"]) == direct["x"].tolist() and arr(trace["y"]) == direct["value"].tolist()


# -- the final-metric scatter: every run, or a mean and 95% interval per group and x --------

def many_runs(db, n: int) -> Store:
    """``n`` runs of two variants at two weight decays, 10 steps each (val/loss at step 0 only)."""
    return fill_runs(db, [(i, f"run{i}", ("qkv", "k_eq_v")[i % 2], (0.01, 0.1)[(i // 2) % 2])
                          for i in range(1, n + 1)], steps=10)


def test_final_scatter_opens_with_every_run_up_to_200_runs_and_with_the_means_above(tmp_path, monkeypatch):
    from app.pages.experiments import EVERY_RUN_MAX

    assert EVERY_RUN_MAX == 200
    for n, drawing, markers in ((200, "runs", 200), (201, "mean", 4)):
        db = tmp_path / f"runs{n}.duckdb"
        many_runs(db, n)
        monkeypatch.setenv("QKVSCOPE_DB", str(db))
        at = page_test("experiments", {"runs": "1"}).run()
        assert not at.exception, at.exception
        assert at.radio(key="exp_fd").value == drawing and qp(at, "fd") is None   # a default, not a choice
        fig = figures(at)["exp_final"]
        assert sum(len(arr(t["x"])) for t in fig["data"]) == markers
        caption = next(c.value for c in at.caption if c.value.startswith(("Every run", "Mean of")))
        assert f"{n:,} runs in the table" in caption
    # 201 runs: per group and weight decay the mean of its runs, its t interval as the error bar
    by = {t["name"]: t for t in fig["data"]}
    assert list(by) == ["Q-K-V (n=100)", "Q-K=V (n=101)"]
    trace = by["Q-K-V (n=100)"]
    assert arr(trace["x"]) == [0.01, 0.1] and trace["error_y"]["visible"]
    # final val/loss at step 0 = 4.2 + wd for qkv: 50 equal runs at each, so no width
    assert arr(trace["y"]) == pytest.approx([4.21, 4.3]) and arr(trace["error_y"]["array"]) == pytest.approx([0, 0])
    assert "n = 50 runs" in trace["text"][0]
    assert fig["layout"]["yaxis"]["title"]["text"] == "final val/loss (mean, 95% interval)"


def test_the_default_follows_the_table_until_the_control_is_changed(tmp_path, monkeypatch):
    db = tmp_path / "runs201.duckdb"
    many_runs(db, 201)
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("experiments", {"runs": "1"}).run()
    assert at.radio(key="exp_fd").value == "mean"
    at.multiselect(key="exp_variant").select("qkv").run()           # 100 runs in the table
    assert at.radio(key="exp_fd").value == "runs" and qp(at, "fd") is None
    assert sum(len(arr(t["x"])) for t in figures(at)["exp_final"]["data"]) == 100
    at.radio(key="exp_fd").set_value("mean").run()                  # a choice: kept whatever the table
    assert not at.exception, at.exception
    assert qp(at, "fd") == "mean" and at.radio(key="exp_fd").value == "mean"
    assert [t["name"] for t in figures(at)["exp_final"]["data"]] == ["Q-K-V (n=100)"]
    assert any(c.value.startswith("Mean of") and "as picked" in c.value for c in at.caption)
    at.multiselect(key="exp_variant").unselect("qkv").run()
    assert at.radio(key="exp_fd").value == "mean"
    at.radio(key="exp_fd").set_value("runs").run()                  # every run of 201, as asked
    assert qp(at, "fd") == "runs"
    assert sum(len(arr(t["x"])) for t in figures(at)["exp_final"]["data"]) == 201
    at.radio(key="exp_view").set_value("Parallel coordinates").run()   # the control has no say there
    assert at.radio(key="exp_fd").disabled and figures(at)["exp_final"]["data"][0]["type"] == "parcoords"


def test_the_drawing_round_trips_through_the_url_and_the_navigation(runs_db):
    at = page_test("experiments", {"fd": "mean"}).run()             # 4 runs, but the link asks for means
    assert not at.exception, at.exception
    assert at.radio(key="exp_fd").value == "mean"
    assert [t["name"] for t in figures(at)["exp_final"]["data"]] == ["Q-K-V (n=2)", "Q-K=V (n=2)"]
    trace = figures(at)["exp_final"]["data"][0]
    assert trace["error_y"]["array"] == [None, None]
    assert "n = 1 (no interval)" in trace["text"][0]                  # one run per group and weight decay

    from streamlit.testing.v1 import AppTest

    from tests.app.apptest import ROOT

    at = AppTest.from_string(_TWO_PAGES.format(root=str(ROOT)), default_timeout=60).run()
    assert at.radio(key="exp_fd").value == "runs"
    at.radio(key="exp_fd").set_value("mean").run()
    at.session_state["elsewhere"] = True
    at.query_params.clear()
    at.run()
    at.session_state["elsewhere"] = False
    at.run()
    assert not at.exception, at.exception
    assert at.radio(key="exp_fd").value == "mean" and qp(at, "fd") == "mean"
