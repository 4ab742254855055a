"""Two writers on one database: both finish (each waits for the other's short
transactions) or one says plainly that the database is busy; nothing is lost
and nothing is stored twice."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from loaders.ingest import ingest_paths
from loaders.store import Store
from tests.faults.data import build_runs, snapshot

ROOT = Path(__file__).resolve().parents[2]
BUSY = "database is busy"


def cli_ingest(db: Path, *paths: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "app", "ingest", *map(str, paths), "--db", str(db)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(*procs: subprocess.Popen) -> list[tuple[int, str]]:
    out = []
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0 or (p.returncode == 2 and BUSY in err), err
        assert "Traceback" not in err, err
        out.append((p.returncode, err))
    return out


@pytest.fixture(scope="module")
def runs_and_ref(tmp_path_factory):
    root = build_runs(tmp_path_factory.mktemp("conc") / "runs")
    ref_db = root.parent / "ref.duckdb"
    ingest_paths(Store(ref_db), [root])
    return root, snapshot(ref_db)


def complete(db: Path, results, paths) -> None:
    """A writer that gave up on a busy database is simply run again."""
    if any(rc == 2 for rc, _ in results):
        ingest_paths(Store(db), paths)


@pytest.mark.slow
def test_two_ingests_of_different_folders_at_once(runs_and_ref, tmp_path):
    root, ref = runs_and_ref
    db = tmp_path / "db.duckdb"
    a = cli_ingest(db, root / "run_a", root / "run_b")
    b = cli_ingest(db, root / "run_c", root / "run_d")
    results = finish(a, b)
    complete(db, results, [root])
    assert snapshot(db) == ref
    print(f"exit codes {[rc for rc, _ in results]}")


@pytest.mark.slow
def test_two_ingests_of_the_same_folder_at_once(runs_and_ref, tmp_path):
    root, ref = runs_and_ref
    db = tmp_path / "db.duckdb"
    results = finish(cli_ingest(db, root), cli_ingest(db, root))
    complete(db, results, [root])
    assert snapshot(db) == ref                       # no run, point or checkpoint twice
    print(f"exit codes {[rc for rc, _ in results]}")


def test_a_writer_that_cannot_get_in_says_the_database_is_busy(tmp_path):
    """The message, exactly, through the CLI (the lock held by this process)."""
    import duckdb

    db = tmp_path / "db.duckdb"
    Store(db).migrate()
    log = tmp_path / "m.csv"
    log.write_text("step,metric,value\n0,train_loss,1.0\n")
    holder = duckdb.connect(str(db))
    try:
        proc = subprocess.run([sys.executable, "-c", (
            "import sys; sys.path.insert(0, %r)\n"
            "import loaders.store as s\n"
            "orig = s.Store.__init__\n"
            "s.Store.__init__ = lambda self, path=None, busy_timeout=30.0: orig(self, path, busy_timeout=1.0)\n"
            "from app.cli import main\n"
            "sys.exit(main(['ingest', %r, '--db', %r]))") % (str(ROOT), str(log), str(db))],
            cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        holder.close()
    assert proc.returncode == 2
    *progress, last = proc.stderr.splitlines()
    assert last == (f"error: {db}: database is busy (another qkvscope process is writing); "
                    f"gave up after 1 s, try again when it finishes")
    # on a slow machine the ingest's progress line (every few seconds) may come first
    assert all(re.fullmatch(r"ingest: \d+/\d+ files, \d+ s", line) for line in progress), progress


def _racing_parse(monkeypatch, store_path: Path, times: int):
    """Make the csv_long reader's read store the same file from 'another
    process' (a second Store, its own connections) while this one reads."""
    from loaders.logs import READERS, ingest_log

    reader = READERS["csv_long"]
    real = reader.read
    calls = {"n": 0}

    def read(path, **kw):
        calls["n"] += 1
        if calls["n"] <= times:
            if times > 1:                            # a live log: it grows under both writers
                with open(path, "a") as f:
                    f.write(f"{100 + 2 * calls['n']},train_loss,0.5\n")
            monkeypatch.setattr(reader, "read", real)
            ingest_log(Store(store_path), path)
            monkeypatch.setattr(reader, "read", read)
            if times > 1:
                with open(path, "a") as f:
                    f.write(f"{101 + 2 * calls['n']},train_loss,0.5\n")
        return real(path, **kw)

    monkeypatch.setattr(reader, "read", read)
    return calls


def test_a_log_stored_by_another_writer_meanwhile_is_not_stored_twice(tmp_path, monkeypatch):
    """Before: both writers inserted the file's points (two concurrent
    `ingest` of one folder doubled every point). The journal row is now
    checked again inside the write transaction."""
    from loaders.logs import ingest_log

    log = tmp_path / "m.csv"
    log.write_text("step,metric,value\n" + "".join(f"{i},train_loss,{i}\n" for i in range(50)))
    db = tmp_path / "db.duckdb"
    calls = _racing_parse(monkeypatch, db, times=1)
    [rep] = ingest_log(Store(db), log)
    assert calls["n"] == 1 and rep.status == "unchanged"
    snap = snapshot(db)
    assert (snap["runs"], snap["duplicate_points"]) == ({(str(log.resolve()), "m"): 50}, 0)


def test_a_log_that_keeps_being_stored_by_others_says_so(tmp_path, monkeypatch):
    from loaders.errors import DatabaseBusyError
    from loaders.logs import ingest_log

    log = tmp_path / "m.csv"
    log.write_text("step,metric,value\n0,train_loss,1.0\n")
    db = tmp_path / "db.duckdb"
    _racing_parse(monkeypatch, db, times=3)
    with pytest.raises(DatabaseBusyError) as exc:
        ingest_log(Store(db), log)
    assert str(exc.value) == (f"{db}: {log} is being stored by another process at the same time; "
                              f"try again when it finishes")
    snap = snapshot(db)
    # the other writer stored the first line and 5 of the 6 appended ones; ours rolled back
    assert (snap["runs"], snap["duplicate_points"]) == ({(str(log.resolve()), "m"): 6}, 0)
