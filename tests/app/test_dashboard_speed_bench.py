"""bench/dashboard_speed.py's browser table: one line per step, median against its target, pass/FAIL.

The browser itself is exercised by running the bench (``python -m app bench --only dashboard_speed``);
here the table's form and verdicts, which ``bench/run_all.py`` reads, are pinned on made-up timings.
"""
from __future__ import annotations

import importlib.util
import math
import sys

from tests.app.apptest import ROOT

spec = importlib.util.spec_from_file_location("dashboard_speed", ROOT / "bench" / "dashboard_speed.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

run_spec = importlib.util.spec_from_file_location("run_all", ROOT / "bench" / "run_all.py")
run_all = importlib.util.module_from_spec(run_spec)
sys.modules["run_all"] = run_all          # its dataclasses look their module up there
run_spec.loader.exec_module(run_all)
#: The line bench/run_all.py parses (one per step).
LINE = run_all.BROWSER_LINE


def test_table_lines_give_median_max_any_charts_apptest_target_and_verdict(capsys):
    timings = {"first_load": 2.5, "nav": {"Overview": [0.3, 0.9, 0.4], "Compare": [1.2, 0.8, 1.1]},
               "nav_any": {"Overview": [0.6, 1.2, 0.7], "Compare": [1.2, 0.8, 1.4]},
               "charts": {"Overview": 0, "Compare": 3}, "control": [0.2, 0.7, 0.3], "control_any": [0.2, 0.9, 0.5]}
    bench.print_browser_table("demo", timings, {"Overview": 0.05, "Compare": 0.31, "Checkpoint inspector": 0.2})
    out = capsys.readouterr().out
    assert out.splitlines()[0] == ("browser (demo): first load 2.50 s; click to the last painted change (the last "
                                   "chart drawn), median (max) of 3 rounds; 'any': median to the last change of "
                                   "any kind, the grids' unpainted accessibility tables included")
    got = LINE.findall(out)
    # the verdict is the painted median's, whatever the 'any' column says
    assert got == [("demo", "sidebar -> Overview", "0.40", "0.90", "0.70", "0", "0.05", "1", "pass"),
                   ("demo", "sidebar -> Compare", "1.10", "1.20", "1.20", "3", "0.31", "1", "FAIL"),
                   ("demo", "control: Inspector metric", "0.30", "0.70", "0.50", "", "0.20", "0.5", "pass")]


def test_run_all_reads_browser_lines_written_before_the_any_column():
    out = ("  demo   sidebar -> Overview                    0.40s   0.90s      0    0.05s  < 1 s  pass\n"
           "  demo   control: Inspector metric              0.30s   0.70s           0.20s  < 0.5 s  pass\n")
    assert LINE.findall(out) == [("demo", "sidebar -> Overview", "0.40", "0.90", "", "0", "0.05", "1", "pass"),
                                 ("demo", "control: Inspector metric", "0.30", "0.70", "", "", "0.20", "0.5", "pass")]
    rows = run_all.parse_dashboard_speed(out)
    assert [(r.figure, r.against) for r in rows] == [("0.40 s (max 0.90)", "AppTest script 0.05 s"),
                                                     ("0.30 s (max 0.70)", "AppTest script 0.20 s")]


def test_targets_are_the_issues():
    assert (bench.NAV_TARGET, bench.CONTROL_TARGET) == (1.0, 0.5)


def test_run_all_reads_the_browser_rows(capsys):
    timings = {"first_load": 2.5, "nav": {"Overview": [0.3, 0.9, 0.4]}, "nav_any": {"Overview": [0.6, 1.2, 0.7]},
               "charts": {"Overview": 0}, "control": [0.2, 0.7, 0.3], "control_any": [0.2, 0.9, 0.5]}
    bench.print_browser_table("demo", timings, {"Overview": 0.05, "Checkpoint inspector": 0.2})
    rows = run_all.parse_dashboard_speed(capsys.readouterr().out)
    assert [(r.measured, r.figure, r.against, r.result) for r in rows] == [
        ("browser, sidebar -> Overview (demo)", "0.40 s (max 0.90)",
         "AppTest script 0.05 s; to any change, unpainted ones included, 0.70 s", "pass"),
        ("browser, control: Inspector metric (demo)", "0.30 s (max 0.70)",
         "AppTest script 0.20 s; to any change, unpainted ones included, 0.50 s", "pass")]


def test_browser_table_has_the_filter_line_and_the_runs_plotted(capsys):
    timings = {"first_load": 2.5, "nav": {"Experiments": [0.6, 0.7, 0.5]}, "nav_any": {"Experiments": [0.9, 1.0, 0.8]},
               "charts": {"Experiments": 2}, "legend": 20, "control": [0.2, 0.7, 0.3], "control_any": [0.2, 0.7, 0.3],
               "filter": [0.3, 0.6, 0.4, 0.5], "filter_any": [0.6, 0.9, 0.7, 0.8]}
    bench.print_browser_table("big", timings, {"Experiments": 0.3, "Checkpoint inspector": 0.2,
                                               "Experiments run filter": 0.25})
    out = capsys.readouterr().out
    assert LINE.findall(out) == [
        ("big", "sidebar -> Experiments (20 runs plotted)", "0.60", "0.70", "0.90", "2", "0.30", "1", "pass"),
        ("big", "control: Inspector metric", "0.30", "0.70", "0.30", "", "0.20", "0.5", "pass"),
        ("big", "control: Experiments run filter", "0.45", "0.60", "0.75", "", "0.25", "0.5", "pass")]
    rows = run_all.parse_dashboard_speed(out)
    assert [(r.measured, r.target, r.result) for r in rows][-1] == (
        "browser, control: Experiments run filter (the benchmark database)", "< 0.5 s", "pass")


def test_logs_ingest_after_the_sql_build_into_new_run_ids(tmp_path):
    db = tmp_path / "bench.duckdb"
    bench.build(db, 3, 5)
    assert bench.write_logs(tmp_path / "logs", 2, 7) == 2 * 7 * 3
    secs, n = bench.ingest_logs(db, tmp_path / "logs")          # failed on run id 1 before the sequence moved
    assert n == 42 and secs > 0
    with bench.Store(db).connect() as con:
        got = con.execute("SELECT r.id, r.name, count(*), count(DISTINCT p.metric), min(p.step), max(p.step) "
                          "FROM runs r JOIN points p ON p.run_id = r.id GROUP BY ALL ORDER BY r.id").fetchall()
        lr = con.execute("SELECT value FROM points WHERE run_id = 4 AND metric = 'lr' ORDER BY step").fetchall()
    assert got == [(1, "run-1", 15, 3, 0, 4), (2, "run-2", 15, 3, 0, 4), (3, "run-3", 15, 3, 0, 4),
                   (4, "log1", 21, 3, 0, 6), (5, "log2", 21, 3, 0, 6)]
    # the same cosine schedule as the SQL build: 6e-4 at step 0, 6e-4 (1 + cos(pi s / 7)) / 2 after
    assert lr[0][0] == 6e-4 and abs(lr[3][0] - 6e-4 * (1 + math.cos(math.pi * 3 / 7)) / 2) < 1e-9


def test_the_filter_timing_narrows_the_run_list(tmp_path, monkeypatch):
    db = tmp_path / "bench.duckdb"
    bench.build(db, 12, 4)
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    assert bench.query_runs([1, 2, 3]) == "runs=1,2,3&m=train/loss"     # the browser's start URL
    *_, at = bench.timed_page("experiments", {"runs": "1,2,3", "m": "train/loss"})
    first, later, caption = bench.timed_filter(at, ("run-1", ""), rounds=2)
    assert caption == "4 of 12 runs"                  # run-1, run-10, run-11, run-12
    assert len(later) == 3 and min([first, *later]) > 0
    assert at.text_input(key="exp_q").value == "" and at.caption[0].value == "12 of 12 runs"


def test_the_bench_says_what_the_final_metric_chart_drew(tmp_path, monkeypatch):
    db = tmp_path / "bench.duckdb"
    bench.build(db, 30, 4)
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    *_, at = bench.timed_page("experiments", {"runs": "1,2,3", "m": "train/loss"})
    assert bench.final_drawing(at) == "every run, 30 markers for 30 runs"
    at.radio(key="exp_fd").set_value("mean").run()
    # build's grid: 5 variants x 5 weight decays, the 26th to 30th runs at weight decay 0 again
    assert bench.final_drawing(at) == "mean and 95% interval, 25 markers for 30 runs"


def test_run_all_reads_the_page_rows_with_and_without_a_target():
    out = "\n".join(bench.verdict_line(*a) for a in (("inspector cold", 2.84, 1.0), ("weight decay cold", 4.98, None),
                                                      ("weight decay warm", 0.09, 1.0), ("papers cold", 5.02, None),
                                                      ("inspector unstarted", 3.06, None)))
    assert out.splitlines()[1] == "  weight decay cold  script   4.98 s  (measured, no target)"
    rows = run_all.parse_dashboard_speed(out)
    assert [(r.measured, r.figure, r.target, r.result) for r in rows] == [
        ("inspector page script run, cold (the reading child prestarted, as the dashboard does) "
         "(the benchmark database)", "2.84 s", "< 1 s", "FAIL"),
        ("weight decay page script run, cold (reads every val/loss point) (the benchmark database)", "4.98 s",
         "-", "-"),
        ("weight decay page script run, warm (the benchmark database)", "0.09 s", "< 1 s", "pass"),
        ("papers page script run, cold (reads every val/loss point) (the benchmark database)", "5.02 s", "-", "-"),
        ("inspector page script run, cold, before any reading child has started (the benchmark database)",
         "3.06 s", "-", "-")]


def test_the_first_visit_to_the_inspector_is_a_row_without_a_target_beside_the_later_visits(capsys):
    timings = {"first_load": 2.5, "nav": {"Checkpoint inspector": [0.7, 0.9, 0.8]},
               "nav_any": {"Checkpoint inspector": [0.7, 0.9, 0.8]}, "charts": {"Checkpoint inspector": 5},
               "control": [0.2, 0.3, 0.3], "control_any": [0.2, 0.3, 0.3], "first_visit": (1.87, 5, 2.1)}
    bench.print_browser_table("demo", timings, {"Checkpoint inspector": 0.2})
    out = capsys.readouterr().out
    assert (f"  demo   first visit: Checkpoint inspector   1.87s      5  ({bench.FIRST_VISIT_AFTER_S} s after the "
            "first page; later visits: median 0.80s)") in out.splitlines()
    rows = run_all.parse_dashboard_speed(out)
    assert [(r.measured, r.figure, r.against, r.target, r.result) for r in rows][-1] == (
        f"browser, first visit: Checkpoint inspector, {bench.FIRST_VISIT_AFTER_S} s after the first page, "
        "the reading child prestarted (demo)", "1.87 s", "later visits (median 0.80 s)", "-", "-")
    assert len(LINE.findall(out)) == 2                      # the table's own lines are unchanged


def test_the_observer_stamps_a_canvas_fallback_change_apart_in_a_real_chromium():
    """A change to a ``<canvas>``'s children (a grid's accessibility table: never painted) moves the
    'any' time and not the painted one; a step settles only once both have been still. A change to
    the canvas element itself (its size) is painted."""
    from tests.app.browser import browser_page

    with browser_page() as page:
        page.set_content("<div data-testid='stMain'><div id='seen'></div><canvas id='grid'></canvas></div>"
                         "<div id='outside'></div>")
        page.add_script_tag(content=bench._OBSERVER)
        # Each change returns the page clock just after it (the observer stamps it a microtask
        # later): the assertions order the stamps against these, not against wall-clock bounds,
        # which a loaded CI machine stretches.
        t0 = page.evaluate("performance.now()")
        page.evaluate("document.getElementById('outside').textContent = 'not in the main area'")
        seen = page.evaluate("document.getElementById('seen').textContent = 'drawn'; performance.now()")
        page.wait_for_timeout(400)
        added = page.evaluate("document.getElementById('grid').appendChild(document.createElement('table'));"
                              " performance.now()")
        page.wait_for_timeout(100)
        texted = page.evaluate("document.getElementById('grid').querySelector('table').textContent = 'cells';"
                               " performance.now()")
        painted, charts, anything = bench._settle(page, t0, 30)
        waited = (page.evaluate("performance.now()") - t0) / 1000
        assert charts == 0
        assert (seen - t0) / 1000 <= painted < (added - t0) / 1000      # the canvas child did not move it
        assert anything >= (texted - t0) / 1000 >= 0.5
        assert waited >= anything + bench.QUIET_MS / 1000        # quiet counted from the canvas change too

        t0 = page.evaluate("performance.now()")
        page.wait_for_timeout(300)
        resized = page.evaluate("document.getElementById('grid').setAttribute('width', '640'); performance.now()")
        painted, _, anything = bench._settle(page, t0, 30)
    assert painted >= (resized - t0) / 1000 >= 0.3 and anything == painted     # the grid resized: painted
