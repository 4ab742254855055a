"""The SQL page's sandbox against what tests/loaders/test_sql_console.py does
not already try: every other statement type, file access through each table
function family, EXPLAIN ANALYZE (which executes), sequences, runaway
recursion and memory. Every case: refused or stopped, file byte-identical,
nothing written outside."""
from __future__ import annotations

import hashlib

import pytest

from loaders.errors import QueryError
from loaders.sql_console import run_readonly_query
from loaders.store import Store

REFUSED = "only SELECT queries are allowed here (got {}); the SQL page never changes the database"
NO_FILES = 'query failed: Permission Error: Cannot access file "{}" - file system operations are disabled by configuration'


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "q.duckdb")
    with s.transaction() as con:
        con.execute("INSERT INTO runs (name, source, format) VALUES ('a', 's', 'csv')")
        con.execute("INSERT INTO points VALUES (1, 0, 'train/loss', 1.0, NULL, NULL)")
    return s


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refuse(store, sql, *, timeout_s: float = 10.0) -> str:
    before = digest(store.path)
    with pytest.raises(QueryError) as err:
        run_readonly_query(store, sql, timeout_s=timeout_s)
    assert digest(store.path) == before
    return str(err.value)


@pytest.mark.parametrize("sql, kind", [
    ("COPY (SELECT * FROM runs) TO '{out}/x.csv'", "COPY"),
    ("EXPORT DATABASE '{out}/export'", "EXPORT"),
    ("INSTALL httpfs", "LOAD"),
    ("LOAD httpfs", "LOAD"),
    ("SET enable_external_access = true", "SET"),
    ("RESET lock_configuration", "SET"),
    ("USE main", "SET"),
    ("PRAGMA enable_profiling", "PRAGMA"),
    ("CALL pragma_version()", "CALL"),
    ("CHECKPOINT", "CALL"),
    ("CREATE TABLE x AS SELECT 1", "CREATE"),
    ("CREATE SECRET s (TYPE s3, KEY_ID 'a', SECRET 'b')", "CREATE"),
    ("UPDATE runs SET name = 'x'", "UPDATE"),
    ("DROP TABLE points", "DROP"),
    ("ALTER TABLE runs ADD COLUMN z INT", "ALTER"),
    ("DETACH main", "DETACH"),
    ("VACUUM", "VACUUM"),
])
def test_statements_that_are_not_select_are_refused(store, tmp_path, sql, kind):
    out = tmp_path / "out"
    out.mkdir()
    assert refuse(store, sql.format(out=out)) == REFUSED.format(kind)
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("sql, path", [
    ("SELECT * FROM glob('/etc/*')", "/etc/*"),
    ("SELECT * FROM read_blob('/etc/hostname')", "/etc/hostname"),
    ("SELECT * FROM read_json('/etc/os-release')", "/etc/os-release"),
    ("SELECT * FROM sniff_csv('/etc/passwd')", "/etc/passwd"),
    ("SELECT * FROM read_text('file:///etc/hostname')", "file:///etc/hostname"),
    ("SELECT * FROM read_csv(['/etc/passwd', '/etc/group'])", "/etc/passwd"),
])
def test_every_file_reading_function_is_denied(store, sql, path):
    assert refuse(store, sql) == NO_FILES.format(path)


def test_explain_analyze_executes_nothing(store, tmp_path):
    """EXPLAIN is allowed, and EXPLAIN ANALYZE runs its statement: the
    read-only connection and the disabled file system still stop it."""
    out = tmp_path / "y.csv"
    assert refuse(store, "EXPLAIN ANALYZE DELETE FROM runs").startswith(
        'query failed: Invalid Input Error: Cannot execute statement of type "EXPLAIN"')
    assert refuse(store, f"EXPLAIN ANALYZE COPY (SELECT 1) TO '{out}'") == NO_FILES.format(out)
    assert not out.exists()
    assert run_readonly_query(store, "SELECT count(*) AS n FROM runs").frame["n"].tolist() == [1]


def test_a_sequence_is_not_advanced(store):
    assert refuse(store, "SELECT nextval('run_ids')").startswith(
        'query failed: Invalid Input Error: Cannot execute statement of type "SELECT"')
    with store.transaction() as con:
        con.execute("INSERT INTO runs (name, source, format) VALUES ('b', 's', 'csv')")
        assert con.execute("SELECT max(id) FROM runs").fetchone()[0] == 2


def test_settings_cannot_be_changed_from_a_select(store):
    assert refuse(store, "SELECT * FROM duckdb_extensions() WHERE loaded").startswith(
        "query failed: Permission Error: Cannot access directory")
    res = run_readonly_query(store, "SELECT current_setting('enable_external_access') AS v")
    assert res.frame["v"].tolist() == [False]


@pytest.mark.parametrize("sql", [
    "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) SELECT count(*) FROM t",
    "SELECT count(*) FROM range(100000) a, range(100000) b, range(100000) c",
])
def test_runaway_queries_are_stopped(store, sql):
    assert refuse(store, sql, timeout_s=0.5) == "query stopped after its time limit of 0.5 s"


def test_a_query_that_wants_all_memory_fails_cleanly(store):
    msg = refuse(store, "SELECT string_agg(repeat('x', 1000), '') FROM range(10000000)", timeout_s=20)
    assert msg.startswith("query failed: Out of Memory Error") or msg == "query stopped after its time limit of 20 s"
