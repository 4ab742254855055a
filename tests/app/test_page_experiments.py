"""Experiments page in AppTest: runs table, filters, curves, bands, final metric view, metadata edit."""
from __future__ import annotations

import base64
import json

import numpy as np
import pandas as pd
import pytest

from loaders.store import Store, refresh_run_stats
from tests.app.apptest import page_test

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


def test_selecting_runs_adds_traces_and_writes_the_url(runs_db):
    at = page_test("experiments").run()
    assert not at.exception
    assert "exp_curves" not in figures(at)
    assert len(at.dataframe[0].value) == 4
    at.multiselect(key="exp_runs").select(1).run()
    one = figures(at)["exp_curves"]["data"]
    assert [t["name"] for t in one] == ["qkv-wd0.01 [qkv]"]
    at.multiselect(key="exp_runs").select(3).run()
    two = figures(at)["exp_curves"]["data"]
    assert [t["name"] for t in two] == ["qkv-wd0.01 [qkv]", "kv-wd0.01 [k_eq_v]"]
    assert qp(at, "runs") == "1,3"
    assert qp(at, "m") == "val/loss"


def test_url_reopens_the_same_view(runs_db):
    at = page_test("experiments", {"runs": "2,4", "m": "train/loss", "x": "tokens", "logy": "1"}).run()
    assert not at.exception
    fig = figures(at)["exp_curves"]
    assert len(fig["data"]) == 2
    assert fig["layout"]["yaxis"]["type"] == "log"
    assert fig["layout"]["xaxis"]["title"]["text"] == "tokens seen"
    assert arr(fig["data"][0]["x"])[:3] == [0, 512, 1024]


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
    assert names == ["k_eq_v (n=2)", "qkv (n=2)"]
    assert qp(at, "group") == "1"


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
    assert sorted(by_variant) == ["k_eq_v", "qkv"]
    assert fig["layout"]["xaxis"]["type"] == "log"
    # final val/loss at step 250 = 4.2 - 250/300 + wd
    assert arr(by_variant["qkv"]["y"]) == pytest.approx([4.2 - 250 / 300 + 0.01, 4.2 - 250 / 300 + 0.1])
    at.radio(key="exp_view").set_value("Parallel coordinates").run()
    assert figures(at)["exp_final"]["data"][0]["type"] == "parcoords"


def test_edit_metadata_is_stored(runs_db):
    at = page_test("experiments").run()
    at.selectbox(key="exp_edit_run").select(2)
    at.run()
    form = at.get("form")[0]
    assert form is not None
    at.text_input[1].input("0.3")  # weight decay field of the form (search box is text_input[0])
    at.button[0].click().run()
    assert not at.exception
    assert at.success[0].value == "Saved weight_decay for qkv-wd0.1 (id 2)."
    from loaders.logs import list_runs

    run = next(r for r in list_runs(Store(runs_db)) if r["id"] == 2)
    assert run["weight_decay"] == 0.3


@pytest.mark.browser
def test_experiments_and_weight_decay_in_a_real_browser(tmp_path):
    from tests.app.browser import browser_page, dashboard, screenshot, wait_idle

    db = tmp_path / "browser-exp.duckdb"
    fill_runs(db)
    with dashboard(db, "--no-demo") as url, browser_page(viewport=(1400, 2000)) as page:
        page.goto(f"{url}/experiments")
        wait_idle(page, timeout=60_000)
        page.locator("[data-testid='stDataFrame']").first.wait_for(timeout=60_000)
        page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
        wait_idle(page, timeout=60_000)
        assert page.locator(".js-plotly-plot").count() == 1  # only the final-metric view
        # select two runs in the picker: the curve chart appears with two lines
        page.locator("[data-testid='stMultiSelect']").filter(has_text="Runs to plot").click()
        page.get_by_role("option", name="qkv-wd0.01 [qkv]").click()
        wait_idle(page, timeout=60_000)
        page.locator("[data-testid='stMultiSelect']").filter(has_text="Runs to plot").click()
        page.get_by_role("option", name="kv-wd0.1 [k_eq_v]").click()
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
