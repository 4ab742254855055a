"""bench/dashboard_speed.py's browser table: one line per step, median against its target, pass/FAIL.

The browser itself is exercised by running the bench (``python -m app bench --only dashboard_speed``);
here the table's form and verdicts, which ``bench/run_all.py`` reads, are pinned on made-up timings.
"""
from __future__ import annotations

import importlib.util
import re
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


def test_table_lines_give_median_max_charts_apptest_target_and_verdict(capsys):
    timings = {"first_load": 2.5, "nav": {"Overview": [0.3, 0.9, 0.4], "Compare": [1.2, 0.8, 1.1]},
               "charts": {"Overview": 0, "Compare": 3}, "control": [0.2, 0.7, 0.3]}
    bench.print_browser_table("demo", timings, {"Overview": 0.05, "Compare": 0.31, "Checkpoint inspector": 0.2})
    out = capsys.readouterr().out
    assert out.splitlines()[0] == ("browser (demo): first load 2.50 s; click to the last chart drawn, "
                                   "median (max) of 3 rounds")
    got = LINE.findall(out)
    assert got == [("demo", "sidebar -> Overview", "0.40", "0.90", "0", "0.05", "1", "pass"),
                   ("demo", "sidebar -> Compare", "1.10", "1.20", "3", "0.31", "1", "FAIL"),
                   ("demo", "control: Inspector metric", "0.30", "0.70", "", "0.20", "0.5", "pass")]


def test_targets_are_the_issues():
    assert (bench.NAV_TARGET, bench.CONTROL_TARGET) == (1.0, 0.5)


def test_run_all_reads_the_browser_rows(capsys):
    timings = {"first_load": 2.5, "nav": {"Overview": [0.3, 0.9, 0.4]}, "charts": {"Overview": 0},
               "control": [0.2, 0.7, 0.3]}
    bench.print_browser_table("demo", timings, {"Overview": 0.05, "Checkpoint inspector": 0.2})
    rows = run_all.parse_dashboard_speed(capsys.readouterr().out)
    assert [(r.measured, r.figure, r.result) for r in rows] == [
        ("browser, sidebar -> Overview (demo)", "0.40 s (max 0.90)", "pass"),
        ("browser, control: Inspector metric (demo)", "0.30 s (max 0.70)", "pass")]
