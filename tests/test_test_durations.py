"""scripts/test_durations.py: per-file seconds from a pytest --durations log; the ordering it feeds."""
from __future__ import annotations

import importlib.util
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("test_durations", ROOT / "scripts" / "test_durations.py")
D = importlib.util.module_from_spec(spec)
spec.loader.exec_module(D)

LOG = """..... [100%]
============================= slowest 5 durations =============================
182.04s call     tests/faults/test_server.py::test_ten_browser_sessions_at_once
48.91s setup    tests/faults/test_server.py::test_ten_browser_sessions_at_once
81.69s call     tests/app/test_batch_ray.py::test_ray_results_identical_to_in_process[a-b]
1.46s teardown tests/app/test_batch_ray.py::test_ray_results_identical_to_in_process[a-b]
0.50s call     tests/test_x.py::test_y
=========== 5 passed in 300.00s ==========="""          # no trailing newline


def test_seconds_are_summed_per_file_longest_first():
    assert D.per_file(LOG) == {"tests/faults/test_server.py": 231, "tests/app/test_batch_ray.py": 83,
                               "tests/test_x.py": 0}


def test_a_log_without_durations_is_refused(tmp_path, capsys):
    log = tmp_path / "log.txt"
    log.write_text("..... [100%]\n5 passed")
    assert D.main([str(log)]) == 2
    assert capsys.readouterr().err == f"{log}: no test times (run pytest with --junitxml=FILE or --durations=60)\n"


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.test_tiers" name="test_tier_rule[a]" time="0.400" />
<testcase classname="tests.test_tiers" name="test_tier_rule[b]" time="0.700" />
<testcase classname="tests.app.test_bench" name="test_one_table_and_exit_status" time="12.600">
<skipped message="x" /></testcase>
<testcase classname="tests.conftest.Nested" name="test_x" time="3.0" />
<testcase classname="tests.gone" name="test_y" time="9.0" />
</testsuite></testsuites>"""


def test_junit_xml_every_test_summed_per_existing_file(tmp_path, monkeypatch):
    # a class in the file adds its name to classname; a file that is no longer there is left out
    assert D.per_file_junit(JUNIT) == {"tests/app/test_bench.py": 13, "tests/conftest.py": 3,
                                       "tests/test_tiers.py": 1}


def test_the_checked_in_durations_name_existing_files():
    import json

    measured = json.loads((ROOT / "tests" / "durations.json").read_text())
    assert measured and all((ROOT / path).is_file() for path in measured)
    assert all(isinstance(s, int) and s >= 0 for s in measured.values())


def test_measured_files_go_first_then_by_slow_count(monkeypatch, tmp_path):
    import tests.conftest as C

    durations = tmp_path / "d.json"
    durations.write_text('{"tests/b.py": 5}')
    monkeypatch.setattr(C, "DURATIONS", durations)

    class Item:
        def __init__(self, nodeid, slow=False):
            self.nodeid, self.slow = nodeid, slow

        def get_closest_marker(self, name):
            return object() if self.slow and name == "slow" else None

    items = [Item("tests/a.py::t1", True), Item("tests/a.py::t2", True), Item("tests/c.py::t", True),
             Item("tests/b.py::t"), Item("tests/d.py::t")]
    C._slow_files_first(items)
    assert [i.nodeid for i in items] == ["tests/b.py::t", "tests/a.py::t1", "tests/a.py::t2", "tests/c.py::t",
                                         "tests/d.py::t"]


def test_the_test_command_keeps_that_order():
    # pytest-xdist reorders files by their count of tests unless told not to: a long file with a
    # few tests then starts last and runs alone at the end
    assert "--dist loadfile --no-loadscope-reorder" in (ROOT / "scripts" / "test.sh").read_text()
