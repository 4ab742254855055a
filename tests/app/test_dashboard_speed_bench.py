"""bench/dashboard_speed.py's browser table: one line per step, median against its target, pass/FAIL.

The browser itself is exercised by running the bench (``python -m app bench --only dashboard_speed``);
here the table's form and verdicts, which ``bench/run_all.py`` reads, are pinned on made-up timings.
"""
from __future__ import annotations

import importlib.util
import re

from tests.app.apptest import ROOT

spec = importlib.util.spec_from_file_location("dashboard_speed", ROOT / "bench" / "dashboard_speed.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

#: What a parser in bench/run_all.py would match (one line per step).
LINE = re.compile(r"^\s+(demo|big)\s+(sidebar -> .+?|control: .+?)\s+([\d.]+)s\s+([\d.]+)s\s+(\d*)\s+"
                  r"([\d.]+|nan)s\s+< ([\d.]+) s\s+(pass|FAIL)$", re.M)


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
