"""Read-only SQL against the store, for users who want their own cut.

Safety, in layers: the connection is opened ``read_only`` with
``enable_external_access = false`` (no files read or written, no ATTACH, no
extension installs) and its configuration locked; only single SELECT-like
statements are accepted; a timer interrupts a query that outlives its time
limit; results are capped at ``max_rows``. The database file is never opened
for writing here.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import duckdb
import pandas as pd

from loaders.errors import QueryError
from loaders.store import Store

_ALLOWED = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}


@dataclass
class QueryResult:
    frame: pd.DataFrame
    truncated: bool
    seconds: float


def check_query(sql: str) -> None:
    """Refuse anything but exactly one SELECT (or EXPLAIN) statement."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(f"query does not parse: {exc}") from exc
    if len(statements) != 1:
        raise QueryError(f"one statement at a time, please (found {len(statements)})")
    kind = statements[0].type
    if kind not in _ALLOWED:
        name = str(kind).rsplit(".", 1)[-1]
        raise QueryError(f"only SELECT queries are allowed here (got {name}); "
                         "the SQL page never changes the database")


def schema(store: Store) -> pd.DataFrame:
    """Tables and columns, for the page's reference panel."""
    with store.connect() as con:
        return con.execute(
            """SELECT table_name AS "table", column_name AS "column", data_type AS type
               FROM information_schema.columns WHERE table_schema = 'main'
               ORDER BY table_name, ordinal_position""").df()


def run_readonly_query(store: Store, sql: str, *, timeout_s: float = 10.0,
                       max_rows: int = 10_000) -> QueryResult:
    """Run one SELECT on a read-only, sandboxed connection with a time limit."""
    check_query(sql)
    store.migrate()
    con = duckdb.connect(str(store.path), read_only=True,
                         config={"enable_external_access": False, "threads": 1,
                                 "memory_limit": "1GB"})
    try:
        con.execute("SET lock_configuration = true")
        timer = threading.Timer(timeout_s, con.interrupt)
        start = time.monotonic()
        timer.start()
        try:
            cur = con.execute(sql)
            rows = cur.fetchmany(max_rows + 1)
            cols = [d[0] for d in cur.description] if cur.description else []
        except duckdb.InterruptException as exc:
            raise QueryError(f"query stopped after its time limit of {timeout_s:g} s") from exc
        except duckdb.Error as exc:
            msg = str(exc).splitlines()[0]
            raise QueryError(f"query failed: {msg}") from exc
        finally:
            timer.cancel()
        seconds = time.monotonic() - start
    finally:
        con.close()
    truncated = len(rows) > max_rows
    frame = pd.DataFrame(rows[:max_rows], columns=cols)
    return QueryResult(frame=frame, truncated=truncated, seconds=seconds)
