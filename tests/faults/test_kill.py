"""``kill -9`` of an ingest or an analysis at random moments: the database
always opens afterwards and holds every file completely or not at all, and a
clean re-run brings it to exactly what one uninterrupted ingest gives."""
from __future__ import annotations

import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest

from loaders.ingest import ingest_paths
from loaders.store import Store
from tests.faults.data import build_runs, snapshot
from tests.forked_cli import ForkedCli


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """The CLI forked from one process that did its imports (one for the module): the kill delay
    counts from the moment real work starts, not from interpreter start-up (tests/forked_cli.py)."""
    driver = ForkedCli(tmp_path_factory.mktemp("cli"))
    yield driver
    driver.close()


def timed(cli: ForkedCli, *argv: str) -> float:
    proc, secs = cli.timed(*argv, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return secs


def kill_after(cli: ForkedCli, delay: float, *argv: str) -> None:
    pid = cli.start(*argv)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    assert cli.wait().returncode in (0, -signal.SIGKILL)       # (0: it had finished before the kill)


def assert_all_or_nothing(snap: dict, ref: dict) -> None:
    assert snap["duplicate_points"] == 0
    for key, n in snap["runs"].items():
        assert ref["runs"][key] == n, f"run {key} holds {n} points; a complete ingest stores {ref['runs'][key]}"
    for sha, (arch, n_layers, _) in snap["checkpoints"].items():
        assert ref["checkpoints"][sha][:2] == (arch, n_layers)
    assert set(snap["journal"]) <= set(ref["journal"])
    logs_journaled = {p for p, k in snap["journal"].items() if k == "log"}
    assert logs_journaled == {src for src, _ in snap["runs"]}      # a log's run exists iff it is journaled
    assert sum(k == "checkpoint" for k in snap["journal"].values()) == len(snap["checkpoints"])


@pytest.mark.slow
def test_kill_9_during_ingest_at_random_moments(tmp_path, cli):
    runs = build_runs(tmp_path / "runs")
    ref_db = tmp_path / "ref.duckdb"
    clean = timed(cli, "ingest", str(runs), "--db", str(ref_db))
    ref = snapshot(ref_db)
    assert len(ref["runs"]) == 4 and len(ref["checkpoints"]) == 4

    rng = random.Random(8)
    db = tmp_path / "db.duckdb"
    outcomes = []
    for i in range(8):
        if i % 2 == 0 and db.exists():              # half the kills start from an empty database
            db.unlink()
            Path(f"{db}.wal").unlink(missing_ok=True)
        delay = rng.uniform(0.0, clean)
        kill_after(cli, delay, "ingest", str(runs), "--db", str(db))
        snap = snapshot(db)                          # the database opens (WAL replayed)
        assert_all_or_nothing(snap, ref)
        outcomes.append((round(delay, 2), sum(snap["runs"].values()), len(snap["checkpoints"])))
    print(f"clean ingest {clean:.2f} s; kills (delay s, points, checkpoints): {outcomes}")
    full = sum(ref["runs"].values())
    assert any((pts, c) != (full, 4) for _, pts, c in outcomes), "no kill landed before the ingest finished"
    # A clean run afterwards completes the job: exactly the reference, nothing twice.
    report = ingest_paths(Store(db), [runs])
    assert report.count("error") == 0
    assert snapshot(db) == ref


@pytest.mark.slow
def test_kill_9_during_analysis_at_random_moments(tmp_path, cli):
    runs = build_runs(tmp_path / "runs", rows=100)
    base = tmp_path / "base.duckdb"
    ingest_paths(Store(base), [runs])
    ref_db = tmp_path / "ref.duckdb"
    shutil.copy(base, ref_db)
    clean = timed(cli, "analyze", "1", "--db", str(ref_db))
    ref = snapshot(ref_db)
    assert ref["analysis"][1] > 0 and ref["jobs"] == {1}
    rng = random.Random(9)
    seen = []
    for i in range(4):
        db = tmp_path / f"db{i}.duckdb"
        shutil.copy(base, db)
        kill_after(cli, rng.uniform(0.0, clean), "analyze", "1", "--db", str(db))
        snap = snapshot(db)
        n = snap["analysis"].get(1, 0)
        assert n in (0, ref["analysis"][1])
        assert snap["jobs"] == ({1} if n else set())  # the job row and its results go together
        assert snap["runs"] == ref["runs"] and snap["checkpoints"] == ref["checkpoints"]
        seen.append(n)
    print(f"clean analysis {clean:.2f} s; results after each kill: {seen}")
