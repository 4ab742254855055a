"""No DuckDB connection of the project reaches the network: every one opens through
``loaders.duck.connect`` (extension autoinstall and autoload off), except the SQL page's
standalone child, which spells the same settings out."""
from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from loaders import duck
from loaders.errors import StoreError
from loaders.store import Store

ROOT = Path(__file__).resolve().parents[1]
CHILD = ROOT / "loaders" / "sql_child.py"


def test_every_connection_opens_through_loaders_duck():
    offenders = []
    for folder in ("app", "analysis", "loaders", "experiments", "bench", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path in (ROOT / "loaders" / "duck.py", CHILD):
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"\bduckdb\.connect\(", line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}")
    assert offenders == []
    child = CHILD.read_text()
    assert '"autoinstall_known_extensions": False' in child and '"autoload_known_extensions": False' in child


def test_connections_have_extension_autoloading_off():
    con = duck.connect()
    got = con.execute("SELECT current_setting('autoinstall_known_extensions'), "
                      "current_setting('autoload_known_extensions')").fetchone()
    assert got == (False, False)


def test_a_sqlite_file_as_the_database_is_one_error_and_fetches_nothing(tmp_path, monkeypatch):
    """DuckDB would install sqlite_scanner from the internet (and create ~/.duckdb) to open it."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    db = tmp_path / "mlflow.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE runs (id INTEGER)")
    con.commit()
    con.close()
    with pytest.raises(StoreError) as exc:
        with Store(db).connect():
            pass
    assert str(exc.value) == (f"{db}: not a DuckDB database (an SQLite file); give --db a DuckDB file, "
                              "or a new path to create one")
    assert not (tmp_path / "home" / ".duckdb").exists()


def test_a_fifo_as_the_database_is_one_error_not_a_hang(tmp_path):
    import os

    fifo = tmp_path / "db.fifo"
    os.mkfifo(fifo)
    with pytest.raises(StoreError) as exc:
        with Store(fifo).connect():
            pass
    assert str(exc.value) == f"{fifo}: not a regular file; give --db a DuckDB file, or a new path to create one"
