"""The SQL page's sandbox: reads work, anything else is refused, the file is unchanged."""
from __future__ import annotations

import os

import hashlib
from pathlib import Path

import pandas as pd
import pytest

from loaders.errors import QueryError
from loaders.sql_console import SQL_BUDGETS, check_query, run_readonly_query, sql_budget
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


def test_unparseable_query(store):
    """Parsed in the query process, under its budgets, never in the server."""
    with pytest.raises(QueryError) as err:
        run_readonly_query(store, "SELEC nothing")
    assert str(err.value).startswith("query does not parse: ")


def test_a_query_text_over_its_budget_is_refused_before_parsing(monkeypatch):
    monkeypatch.setenv("QKVSCOPE_SQL_MAX_QUERY_KB", "1")
    text = "SELECT 1 WHERE 1 IN (" + ",".join(["1"] * 600) + ")"
    with pytest.raises(QueryError) as err:
        check_query(text)
    assert str(err.value) == (f"query text of {len(text):,} bytes is over 1 KB "
                              "(QKVSCOPE_SQL_MAX_QUERY_KB; set it in the environment to raise it)")
    check_query("SELECT 1")


def test_nested_values_count_against_the_result_budget(store, monkeypatch):
    """A list of null structs is almost no Arrow bytes but one Python object per element in
    the server: the values budget counts them (one row: 1 list + 2 x 50,000 elements)."""
    monkeypatch.setenv("QKVSCOPE_SQL_MAX_VALUES", "100000")
    with pytest.raises(QueryError) as err:
        run_readonly_query(store, "SELECT array_agg({'a': NULL}) AS l FROM range(50000)")
    assert str(err.value) == ("result of over 100,000 values (a list or struct cell counts its elements): "
                              "add LIMIT, unnest less or select fewer columns "
                              "(QKVSCOPE_SQL_MAX_VALUES; set it in the environment to raise it)")
    small = run_readonly_query(store, "SELECT array_agg({'a': NULL}) AS l FROM range(40000)")
    assert len(small.frame["l"][0]) == 40000


def test_query_processes_at_once_are_capped(store, monkeypatch):
    import threading

    from loaders import sql_console

    monkeypatch.setenv("QKVSCOPE_SQL_CONCURRENT", "1")
    started, release = threading.Event(), threading.Event()
    real = sql_console._run_child

    def slow(request, timeout_s):
        started.set()
        release.wait(30)
        return real(request, timeout_s)

    monkeypatch.setattr(sql_console, "_run_child", slow)
    first = threading.Thread(target=run_readonly_query, args=(store, "SELECT 1"))
    first.start()
    try:
        assert started.wait(30)
        with pytest.raises(QueryError) as err:
            run_readonly_query(store, "SELECT 2")
        assert str(err.value) == ("1 queries are running already, the most at once "
                                  "(QKVSCOPE_SQL_CONCURRENT; set it in the environment to raise it); "
                                  "try again when one ends")
    finally:
        release.set()
        first.join()
    assert run_readonly_query(store, "SELECT 3").frame.iloc[0, 0] == 3


def test_result_bytes_are_capped_with_the_exact_message(store):
    # 2,000 rows of 1,000 bytes: about 2 MB of Arrow data against a 1 MB cap
    with pytest.raises(QueryError) as err:
        run_readonly_query(store, "SELECT repeat('x', 1000) AS s FROM range(2000)", max_mb=1)
    assert str(err.value) == ("result over 1 MB: add LIMIT or select fewer columns "
                              "(QKVSCOPE_SQL_RESULT_MB; set it in the environment to raise it)")
    res = run_readonly_query(store, "SELECT repeat('x', 1000) AS s FROM range(500)", max_mb=1)
    assert len(res.frame) == 500 and set(res.frame["s"].str.len()) == {1000}


def test_the_row_cut_comes_before_the_byte_count(store):
    """Rows past max_rows are not counted: 10 kept rows of 1,000 bytes fit in 1 MB."""
    res = run_readonly_query(store, "SELECT repeat('x', 1000) AS s FROM range(100000)",
                             max_rows=10, max_mb=1)
    assert len(res.frame) == 10 and res.truncated


def test_budgets_come_from_the_environment(store, monkeypatch):
    monkeypatch.setenv("QKVSCOPE_SQL_RESULT_MB", "1")
    assert sql_budget("QKVSCOPE_SQL_RESULT_MB") == 1
    with pytest.raises(QueryError) as err:  # a caller cannot raise it past the budget
        run_readonly_query(store, "SELECT repeat('x', 1000) FROM range(2000)", max_mb=500)
    assert str(err.value).startswith("result over 1 MB: ")
    monkeypatch.setenv("QKVSCOPE_SQL_MEMORY_MB", "512")
    assert sql_budget("QKVSCOPE_SQL_ADDRESS_MB") == 512 + 2048
    monkeypatch.setenv("QKVSCOPE_SQL_ADDRESS_MB", "not a number")
    assert sql_budget("QKVSCOPE_SQL_ADDRESS_MB") == 512 + 2048
    assert sql_budget("QKVSCOPE_SQL_SPILL_MB") == 0
    monkeypatch.setenv("QKVSCOPE_SQL_MAX_TIMEOUT_S", "5")
    with pytest.raises(QueryError) as err:
        run_readonly_query(store, "SELECT 1", timeout_s=6)
    assert str(err.value) == ("time limit 6 s is outside 0-5 s (QKVSCOPE_SQL_MAX_TIMEOUT_S; "
                              "set it in the environment to raise it)")


def test_the_query_process_has_no_spill_directory_and_a_locked_config(store):
    res = run_readonly_query(store, "SELECT current_setting('temp_directory') AS t, "
                                    "current_setting('memory_limit') AS m, "
                                    "current_setting('lock_configuration') AS l")
    assert res.frame.to_dict("records") == [{"t": "", "m": "1.0 GiB", "l": True}]


def test_types_survive_the_arrow_stream(store):
    res = run_readonly_query(store, "SELECT 42 AS i, 0.5::DOUBLE AS f, 'a' AS s, NULL::INT AS n, "
                                    "true AS b, [1, 2] AS l")
    row = res.frame.iloc[0]
    assert (row["i"], row["f"], row["s"], row["b"], list(row["l"])) == (42, 0.5, "a", True, [1, 2])
    assert pd.isna(row["n"])


@pytest.mark.parametrize("body, message", [
    # the kernel's OOM killer ends a process with SIGKILL and no word
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
     "query needs more memory than the SQL console's budget of 1,024 MB "
     "(QKVSCOPE_SQL_MEMORY_MB; set it in the environment to raise it)"),
    ("raise SystemExit('broken pipe somewhere')",
     "query failed: the query process ended: broken pipe somewhere"),
])
def test_a_query_process_that_dies_is_one_line(store, tmp_path, monkeypatch, body, message):
    """A sandbox entry whose ``sql`` job ends its process the way ``body`` does."""
    import importlib
    import sys

    (tmp_path / "dying_sql.py").write_text(
        "import sys\nfrom loaders.sandbox import serve\nJOBS = {'sql': ('dying_sql', 'query')}\n"
        f"def query(db, **req):\n    {body}\n"
        "if __name__ == '__main__':\n    sys.exit(serve(JOBS))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setattr("loaders.sql_console._entry", lambda: importlib.import_module("dying_sql"))
    monkeypatch.delitem(sys.modules, "dying_sql", raising=False)
    with pytest.raises(QueryError) as err:
        run_readonly_query(store, "SELECT 1")
    assert str(err.value) == message


def test_every_budget_is_in_the_security_doc():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    section = doc[doc.index("## The SQL page"):]
    missing = [name for name in SQL_BUDGETS if f"| `{name}` |" not in section]
    assert missing == []
