"""The SQL page's sandbox: reads work, anything else is refused, the file is unchanged."""
from __future__ import annotations

import hashlib

import pytest

from loaders.errors import QueryError
from loaders.sql_console import check_query, run_readonly_query
from loaders.store import Store


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "q.duckdb")
    with s.transaction() as con:
        con.execute("INSERT INTO runs (name, source, format) VALUES ('a', 's', 'csv'), ('b', 's', 'csv')")
    return s


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_select_works(store):
    res = run_readonly_query(store, "SELECT name FROM runs ORDER BY name")
    assert res.frame["name"].tolist() == ["a", "b"]
    assert not res.truncated


def test_row_limit(store):
    res = run_readonly_query(store, "SELECT * FROM range(100)", max_rows=10)
    assert len(res.frame) == 10 and res.truncated


@pytest.mark.parametrize("sql, message", [
    ("DELETE FROM runs", "only SELECT queries are allowed here (got DELETE); "
                         "the SQL page never changes the database"),
    ("INSERT INTO runs (name, source, format) VALUES ('x', 'y', 'z')",
     "only SELECT queries are allowed here (got INSERT); the SQL page never changes the database"),
    ("ATTACH '/tmp/other.duckdb' AS o", "only SELECT queries are allowed here (got ATTACH); "
                                         "the SQL page never changes the database"),
    ("COPY runs TO '/tmp/x.csv'", "only SELECT queries are allowed here (got COPY); "
                                   "the SQL page never changes the database"),
    ("SELECT 1; DROP TABLE runs", "one statement at a time, please (found 2)"),
])
def test_refused_statements(store, sql, message):
    before = digest(store.path)
    with pytest.raises(QueryError) as err:
        run_readonly_query(store, sql)
    assert str(err.value) == message
    assert digest(store.path) == before


@pytest.mark.parametrize("sql", [
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('/etc/hostname')",
    "SELECT * FROM read_parquet('/tmp/anything.parquet')",
])
def test_table_functions_cannot_read_local_files(store, sql):
    with pytest.raises(QueryError) as err:
        run_readonly_query(store, sql)
    assert str(err.value).startswith("query failed: Permission Error")


def test_a_query_that_runs_forever_is_stopped(store):
    before = digest(store.path)
    with pytest.raises(QueryError) as err:
        run_readonly_query(store, "SELECT count(*) FROM range(1000000000000) a", timeout_s=0.5)
    assert str(err.value) == "query stopped after its time limit of 0.5 s"
    assert digest(store.path) == before


def test_unparseable_query():
    with pytest.raises(QueryError) as err:
        check_query("SELEC nothing")
    assert str(err.value).startswith("query does not parse: ")
