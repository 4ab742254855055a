"""A database on a read-only mount (or without write permission) opens read-only: the
pages and ``runs`` browse it, a write is refused with one line (exit 2)."""
from __future__ import annotations

import os
import subprocess

import pytest

from app.cli import main
from loaders.store import Store
from tests.app.apptest import page_test
from tests.hostile.corpus import errors_only


@pytest.fixture
def read_only_db(tmp_path):
    """A database with two runs that this process cannot write: a tmpfs remounted read-only
    (root), else a folder and file without write permission (anyone else)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = os.geteuid() == 0
    if mounted:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"root, and cannot mount a tmpfs to make read-only: {done.stderr.strip()[:200]}")
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("alpha", "beta"):
        (logs / f"{name}.csv").write_text("step,loss\n0,3\n1,2\n")
    db = disk / "db.duckdb"
    assert main(["ingest", str(logs), "--db", str(db)]) == 0
    if mounted:
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    else:
        db.chmod(0o444)
        disk.chmod(0o555)
    try:
        yield db, logs
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(disk)], check=False)
        else:
            disk.chmod(0o755)


def test_a_read_only_database_is_browsed_and_refuses_writes_in_one_line(read_only_db, capsys, monkeypatch):
    db, logs = read_only_db
    assert not Store(db).writable()
    capsys.readouterr()
    assert main(["runs", "--db", str(db)]) == 0
    out = capsys.readouterr()
    assert "alpha" in out.out and "beta" in out.out and out.err == ""
    (logs / "gamma.csv").write_text("step,loss\n0,1\n")
    assert main(["ingest", str(logs), "--db", str(db)]) == 2
    assert errors_only(capsys.readouterr().err) == (
        f"error: {db}: the database is read-only here (a read-only mount or no write permission on it or "
        "its folder): it can be browsed, not written; copy it to a writable place to store into it\n")
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    for page in ("overview", "experiments"):
        at = page_test(page).run()
        assert not at.exception and not at.error, (page, at.exception, [e.value for e in at.error])
