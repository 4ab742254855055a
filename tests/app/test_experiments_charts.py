"""What the Experiments page sends the browser for its two charts (2,000 runs).

Curves are sent at ``CURVE_POINTS`` per run (min-max buckets: a spike stays), both charts
without Streamlit's theme (with it, plotly.js draws each chart a third time once mounted), and
in Chromium each chart is drawn twice at most: the first draw and Streamlit's redraw on mount.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from loaders.store import Store, refresh_run_stats
from tests.app.apptest import page_test
from tests.app.test_page_experiments import arr


def long_runs(db, n_runs: int = 3, steps: int = 5000, spike_at: int = 3217, project: str | None = None) -> Store:
    """``n_runs`` runs of ``steps`` train/val loss points, one spike of +2 at ``spike_at`` each."""
    store = Store(db)
    store.migrate()
    s = np.arange(steps)
    frames = []
    for rid in range(1, n_runs + 1):
        loss = 4.0 - 0.25 * np.log1p(s) + 0.01 * rid + np.where(s == spike_at, 2.0, 0.0)
        for metric, value in (("train/loss", loss), ("val/loss", loss + 0.1)):
            frames.append(pd.DataFrame({"run_id": rid, "step": s, "metric": metric, "value": value,
                                        "wall_time": 1000.0 + s, "tokens": s * 512}))
    rows = [[rid, f"run-{rid}", f"/exp/run-{rid}", ["qkv", "k_eq_v"][rid % 2], 0.1 * rid, project]
            for rid in range(1, n_runs + 1)]
    return _stored(store, rows, pd.concat(frames, ignore_index=True))


def _stored(store: Store, rows: list[list], points: pd.DataFrame) -> Store:
    """``rows`` (id, name, source, variant, weight decay, project; lr 6e-4, CSV) and their
    ``points`` in one transaction, with the runs' stats."""
    with store.transaction() as con:
        con.executemany("INSERT INTO runs (id, name, source, format, variant, weight_decay, project, lr) "
                        "VALUES (?, ?, ?, 'csv', ?, ?, ?, 6e-4)", rows)
        con.register("f", points)
        con.execute("INSERT INTO points SELECT run_id, step, metric, value, wall_time, tokens FROM f")
        refresh_run_stats(con, points["run_id"].unique())
    return store


def test_curves_are_sent_at_curve_points_per_run_with_the_spike_kept(tmp_path, monkeypatch):
    from app.pages.experiments import CURVE_POINTS

    db = tmp_path / "long.duckdb"
    long_runs(db)
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("experiments", {"runs": "1,2,3", "m": "train/loss"}).run()
    assert not at.exception, at.exception
    charts = {e.key: e for e in at.get("plotly_chart")}
    traces = json.loads(charts["exp_curves"].proto.spec)["data"]
    assert [t["name"].split(" ")[0] for t in traces] == ["run-1", "run-2", "run-3"]
    for rid, trace in enumerate(traces, start=1):
        x, y = arr(trace["x"]), arr(trace["y"])
        assert CURVE_POINTS - 2 <= len(x) <= CURVE_POINTS < 5000
        spike = dict(zip(x, y))[3217.0]                 # its bucket's maximum: the spike itself
        assert spike == pytest.approx(4.0 - 0.25 * np.log1p(3217) + 0.01 * rid + 2.0)
    caption = next(c.value for c in at.caption if "points drawn" in c.value)
    assert caption.startswith(f"{sum(len(arr(t['x'])) for t in traces):,} points drawn (30,000 logged points")


def test_both_charts_are_sent_without_streamlits_theme(tmp_path, monkeypatch):
    db = tmp_path / "long.duckdb"
    long_runs(db, steps=300)
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("experiments", {"runs": "1,2", "m": "train/loss"}).run()
    assert not at.exception, at.exception
    charts = {e.key: e.proto for e in at.get("plotly_chart")}
    assert set(charts) == {"exp_curves", "exp_final"}
    assert {k: p.theme for k, p in charts.items()} == {"exp_curves": "", "exp_final": ""}
    for proto in charts.values():                  # their own look: the white template, light
        layout = json.loads(proto.spec)["layout"]
        assert layout["template"]["layout"]["plot_bgcolor"] == "white"


#: Counts, per chart, the times plotly.js sets the shape of a marker (``path.point``'s ``d``:
#: twice a draw) and the points of each curve's path, installed before the page's scripts.
_COUNT_DRAWS = """
window.__pointShapes = new Map();
new MutationObserver((records) => {
  for (const r of records) {
    const el = r.target;
    if (r.attributeName !== 'd' || !el.classList || !el.classList.contains('point')) continue;
    // by the chart's element, not its place: the final chart may be drawn before the curves mount
    const chart = el.closest("[data-testid='stPlotlyChart']");
    if (chart) window.__pointShapes.set(chart, (window.__pointShapes.get(chart) || 0) + 1);
  }
}).observe(document, {subtree: true, attributes: true, attributeFilter: ['d']});
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory, chromium_browser):
    """One server for this file's browser tests, each on a project of its own: ``draws`` (6 of
    ``long_runs``, ids 1-6) and ``seeds`` (240 of ``seeded_runs``, ids 7-246); none writes."""
    from tests.app.browser import dashboard

    db = tmp_path_factory.mktemp("browser") / "charts.duckdb"
    long_runs(db, n_runs=6, project="draws")
    seeded_runs(db, first_id=7, project="seeds")
    with dashboard(db, "--no-demo") as url:
        yield url, chromium_browser


@pytest.mark.browser
@pytest.mark.slow
def test_charts_are_drawn_twice_at_most_in_a_real_browser(served):
    from app.pages.experiments import CURVE_POINTS
    from tests.app.browser import screenshot, session, wait_idle

    with session(served, 1400, 2000) as (url, page):
        page.add_init_script(_COUNT_DRAWS)
        # counted on the second load: the first, on a cold server under load, can draw the final
        # chart a third time with the theme off (36: once in five full runs on 2026-12-02, and in 1
        # of 8 loads beside three busy processes, always the first); the theme's extra draw comes
        # on every mount, warm or cold (36 on the reload with CHART_THEME = "streamlit")
        page.goto(f"{url}/experiments?project=draws&runs=1,2,3,4,5,6&m=train/loss&fm=val/loss")
        wait_idle(page, timeout=120_000)
        page.locator(".js-plotly-plot").nth(1).wait_for(timeout=60_000)
        page.reload()                                  # the init script starts a fresh count
        wait_idle(page, timeout=120_000)
        page.locator(".js-plotly-plot").nth(1).wait_for(timeout=60_000)
        wait_idle(page, timeout=60_000)
        curves, final = page.locator(".js-plotly-plot").nth(0), page.locator(".js-plotly-plot").nth(1)
        lengths = curves.evaluate("gd => gd._fullData.map(t => t._length)")   # the points plotly.js holds
        assert len(lengths) == 6 and all(CURVE_POINTS - 2 <= n <= CURVE_POINTS for n in lengths), lengths
        markers = final.locator(".scatterlayer .point").count()
        assert markers == 6                                            # one per run in the table
        shapes = final.evaluate("gd => window.__pointShapes.get(gd.closest(\"[data-testid='stPlotlyChart']\")) || 0")
        # a draw sets each marker's shape twice; Streamlit's theme made it three draws (36)
        assert 2 * markers <= shapes <= 4 * markers, shapes
        screenshot(page, "experiments_charts")


def seeded_runs(db, n_runs: int = 240, first_id: int = 1, project: str | None = None) -> Store:
    """``n_runs`` runs of 3 variants x 4 weight decays (20 seeds each at 240), 20 steps of val/loss
    each, ending at ``3 + wd + 0.05 * variant + noise(0.02)``: groups whose intervals have a width;
    ids from ``first_id``."""
    store = Store(db)
    store.migrate()
    rng = np.random.default_rng(0)
    variants, wds = ["qkv", "k_eq_v", "q_eq_k"], [0.0, 0.01, 0.1, 0.3]
    s = np.arange(20)
    frames, rows = [], []
    for rid in range(1, n_runs + 1):
        v, wd = (rid - 1) % 3, wds[((rid - 1) // 3) % 4]
        end = 3.0 + wd + 0.05 * v + rng.normal(0, 0.02)
        frames.append(pd.DataFrame({"run_id": first_id - 1 + rid, "step": s, "metric": "val/loss",
                                    "value": end + (19 - s) * 0.1, "wall_time": 1000.0 + s, "tokens": s * 512}))
        rows.append([first_id - 1 + rid, f"seed-{rid}", f"/exp/seed-{rid}", variants[v], wd, project])
    return _stored(store, rows, pd.concat(frames, ignore_index=True))


def test_over_200_runs_the_final_chart_sends_one_point_per_group_and_x(tmp_path, monkeypatch):
    db = tmp_path / "seeds.duckdb"
    seeded_runs(db)
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("experiments", {"runs": "1,2"}).run()
    assert not at.exception, at.exception
    final = next(e for e in at.get("plotly_chart") if e.key == "exp_final")
    traces = json.loads(final.proto.spec)["data"]
    assert [t["name"] for t in traces] == ["Q-K-V (n=80)", "Q=K-V (n=80)", "Q-K=V (n=80)"]
    assert [len(arr(t["x"])) for t in traces] == [4, 4, 4]            # 12 markers for 240 runs
    for t in traces:
        plus, minus = arr(t["error_y"]["array"]), arr(t["error_y"]["arrayminus"])
        # 20 seeds, noise 0.02: the t interval of the mean is about +-2.09 * 0.02 / sqrt(20)
        assert len(plus) == len(minus) == 4 and all(0 < h < 0.05 for h in plus + minus)
    at.radio(key="exp_fd").set_value("runs").run()
    traces = json.loads(next(e for e in at.get("plotly_chart") if e.key == "exp_final").proto.spec)["data"]
    assert sum(len(arr(t["x"])) for t in traces) == 240


@pytest.mark.browser
@pytest.mark.slow
def test_the_final_chart_over_200_runs_in_a_real_browser(served):
    from tests.app.browser import screenshot, session, wait_idle

    with session(served, 1400, 2000) as (url, page):
        page.goto(f"{url}/experiments?project=seeds&runs=7,8,9&m=val/loss")
        wait_idle(page, timeout=120_000)
        page.locator(".js-plotly-plot").nth(1).wait_for(timeout=60_000)
        wait_idle(page, timeout=60_000)
        final = page.locator(".js-plotly-plot").nth(1)
        assert final.locator(".scatterlayer .point").count() == 12       # a marker per group and x
        assert final.locator(".errorbars .errorbar").count() == 12       # each with its interval
        assert final.locator(".legend .legendtext").all_text_contents() == ["Q-K-V (n=80)", "Q=K-V (n=80)", "Q-K=V (n=80)"]
        assert page.get_by_text("Mean of each group's runs", exact=False).count() == 1
        screenshot(page, "experiments_final_summary")
        # the metadata form is drawn once its expander is opened (closed, the page skips it)
        assert page.locator("[data-testid='stForm']").count() == 0
        page.get_by_text("Edit a run's metadata").click()
        page.locator("[data-testid='stForm']").wait_for(timeout=60_000)
        wait_idle(page, timeout=60_000)
        assert page.locator("[data-testid='stSelectbox']").filter(has_text="Run").count() >= 1
