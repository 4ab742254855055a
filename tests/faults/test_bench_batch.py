"""``bench/batch_speed.py``: its rates, checkpoint choice, command lines and failure lines, and
one tiny run over two demo runs, in-process and on a local Ray, whose ``BENCH_ROW`` lines
``bench/run_all.py`` reads (no timing is asserted)."""
from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

import pytest

from app.commands.bench import _runner

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))          # bench/ is a folder of scripts, not a package

import batch_speed as B  # noqa: E402

R = _runner()


def test_rates_per_minute_and_after_the_first_checkpoint():
    assert B.per_minute(55, 110.0) == pytest.approx(30.0)
    assert math.isnan(B.per_minute(3, 0.0))
    first, rate = B.start_and_rate([9.0, 5.0, 6.0, 7.0, 10.0])   # the later 2 in 10 - 7 = 3 s
    assert (first, rate) == (5.0, pytest.approx(40.0))
    assert B.start_and_rate([6.0, 4.0]) == (4.0, pytest.approx(30.0))
    assert B.start_and_rate([4.0])[0] == 4.0 and math.isnan(B.start_and_rate([4.0])[1])
    assert all(math.isnan(x) for x in B.start_and_rate([]))


def test_spread_picks_evenly_and_all_without_a_limit():
    ids = list(range(1, 56))
    assert B.spread(ids, 6) == [1, 10, 19, 28, 37, 46]
    assert B.spread(ids, None) == ids == B.spread(ids, 99)
    assert B.PROGRESS.match("[3/55] checkpoint 17 computed: /x.safetensors").groups() == ("3", "55", "17", "computed")


def test_commands_stay_in_batch_mode():
    db = Path("/t/in-process/demo.duckdb")
    assert B.analyze_command(db, None, ray=False, device=None)[2:] == [
        "app", "analyze", "--all", "--db", str(db), "--results", "/t/in-process/demo.results", "--json"]
    assert B.analyze_command(db, [1, 10], ray=True, device="cpu")[4:] == [
        "1", "10", "--db", str(db), "--results", "/t/in-process/demo.results", "--json", "--ray", "local",
        "--device", "cpu"]


def test_a_failed_checkpoint_or_exit_status_is_a_failure_line():
    ok = B.ModeRun("ray", [], exit_status=0, report={"computed": 2, "checkpoints": [], "errors": []})
    assert ok.failures() == []
    bad = B.ModeRun("ray", [], exit_status=1, report={
        "computed": 1, "failed": 1, "errors": [{"target": "a.pt", "reason": "not a checkpoint"}],
        "checkpoints": [{"id": 4, "status": "failed", "error": "MemoryError: over 512 MiB"}]})
    assert bad.failures() == ["ray: exit status 1", "ray: checkpoint 4 failed: MemoryError: over 512 MiB",
                              "ray: a.pt: not a checkpoint"]
    empty = B.ModeRun("in-process", [], exit_status=2, stderr_tail=["x", "error: boom"])
    assert empty.failures() == ["in-process: exit status 2",
                                "in-process: no batch JSON on stdout; stderr ended: x | error: boom"]


@pytest.mark.slow
def test_two_demo_runs_in_process_and_on_ray_print_rows_run_all_reads(tmp_path, capsys):
    pytest.importorskip("ray")
    demo = tmp_path / "demo"
    for run in ("qkv-mha-wd0", "k_eq_v-mqa-wd0.1"):        # one checkpoint each
        shutil.copytree(ROOT / "data" / "demo" / run, demo / run)
    assert B.main(["--demo", str(demo), "--dir", str(tmp_path / "work")]) == 0
    out = capsys.readouterr().out
    assert f"demo {demo}: 2 checkpoints" in out
    assert "in-process exit 0, 2 computed, 0 skipped, 0 failed (in-process" in out
    assert "ray        exit 0, 2 computed, 0 skipped, 0 failed (ray local" in out
    rows = R.printed_rows(out)
    assert [r.measured for r in rows] == [
        "analyze --all, 2 demo checkpoints, in-process", "analyze --all, 2 demo checkpoints, --ray local with 2 workers",
        "speed-up of --ray local (2 workers) over in-process, --all, 2 demo checkpoints"]
    assert all(r.bench == "batch_speed" and (r.target, r.result) == ("-", "-") for r in rows)
    assert rows[0].figure.endswith(" s)") and " checkpoints/min (" in rows[0].figure
    assert "x wall; " in rows[2].figure and rows[2].figure.endswith("x over the later half")
