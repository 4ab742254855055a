"""A full disk is one line and exit 2: ``analyze`` whose results find no room, and an
``ingest`` of several files that stops at the first (not one line per file left);
nothing half-written stays. On a real tmpfs of a few MiB where this process may
mount one (root), else skipped; the mapping itself is tested without a mount."""
from __future__ import annotations

import subprocess

import duckdb
import pytest

from app.cli import main
from loaders.errors import StoreError
from loaders.store import Store
from tests.faults.data import gpt2_folder
from tests.hostile.corpus import errors_only


def full_message(db) -> str:
    return (f"error: {db}: the disk is full (No space left on device); nothing of this step was stored: "
            "free space and run it again")


def test_a_write_without_room_is_one_store_error_and_nothing_is_kept(tmp_path):
    store = Store(tmp_path / "db.duckdb")
    store.migrate()
    with pytest.raises(StoreError) as exc:
        with store.transaction() as con:
            con.execute("INSERT INTO meta VALUES ('x', 'y')")
            raise duckdb.IOException('Could not write file "db.duckdb.wal": No space left on device')
    assert f"error: {exc.value}" == full_message(store.path)
    with store.connect(read_only=True) as con:
        assert con.execute("SELECT count(*) FROM meta WHERE key = 'x'").fetchall() == [(0,)]


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()[:200]}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk) -> None:
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def test_analyze_and_ingest_on_a_full_disk_say_one_line(tmp_path, small_disk, capsys):
    folder = gpt2_folder(tmp_path / "m", seed=1)
    logs = tmp_path / "logs"
    logs.mkdir()
    for i in range(5):
        (logs / f"r{i}.csv").write_text(f"step,loss\n0,{i}\n1,2\n")
    db = small_disk / "db.duckdb"
    assert main(["ingest", str(folder), "--db", str(db)]) == 0
    capsys.readouterr()
    fill(small_disk)
    assert main(["analyze", str(folder), "--db", str(db)]) == 2
    assert errors_only(capsys.readouterr().err) == full_message(db) + "\n"
    assert main(["ingest", str(logs), "--db", str(db)]) == 2
    assert errors_only(capsys.readouterr().err) == full_message(db) + "\n"
    (small_disk / "filler").unlink()
    with Store(db).connect(read_only=True) as con:
        assert con.execute("SELECT count(*) FROM analysis_results").fetchall() == [(0,)]
        assert con.execute("SELECT count(*) FROM runs").fetchall() == [(0,)]
