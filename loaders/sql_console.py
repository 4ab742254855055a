"""Read-only SQL against the store, for users who want their own cut.

Safety, in layers: a query text over its budget is refused at once
(``check_query``); the query runs in its own process, which parses it and
accepts exactly one SELECT (or EXPLAIN) statement
(``loaders/sql_child.py``, a child of the sandbox, ``loaders.sandbox``) on a connection opened ``read_only`` with
``enable_external_access = false`` (no files read or written, no ATTACH, no
extension installs), ``temp_directory = ''`` (nothing spilled to disk) and
its configuration locked; and that process has budgets it cannot exceed:

================================  ==============================  ===========================================
budget (environment variable)     default                         what it bounds
================================  ==============================  ===========================================
``QKVSCOPE_SQL_TIMEOUT_S``        10                              a query's time limit when none is given
                                                                  (the page's default)
``QKVSCOPE_SQL_MAX_TIMEOUT_S``    120                             the largest time limit a query may ask for
``QKVSCOPE_SQL_MAX_ROWS``         10,000                          rows returned when none is given (more are
                                                                  cut off, the result marked truncated)
``QKVSCOPE_SQL_RESULT_MB``        64                              bytes of one result (Arrow size); over it
                                                                  the query fails
``QKVSCOPE_SQL_MAX_VALUES``       2,000,000                       values of one result as the server will
                                                                  hold them (a list or struct cell counts
                                                                  its elements, recursively); over it the
                                                                  query fails
``QKVSCOPE_SQL_MAX_QUERY_KB``     64                              the query text; longer is refused before
                                                                  any parsing
``QKVSCOPE_SQL_CONCURRENT``       2                               query processes one server runs at once;
                                                                  another query meanwhile is told to retry
``QKVSCOPE_SQL_HELD_MB``          256                             the results all of a server's sessions keep
                                                                  (``hold``: pandas size, deep); past it the
                                                                  oldest other session's is dropped
``QKVSCOPE_SQL_MEMORY_MB``        1,024                           DuckDB's ``memory_limit`` in the query process
``QKVSCOPE_SQL_ADDRESS_MB``       ``QKVSCOPE_SQL_MEMORY_MB`` +    the query process's address space
                                  2,048                           (``RLIMIT_AS``)
``QKVSCOPE_SQL_SPILL_MB``         0                               spill files (DuckDB's ``temp_directory``):
                                                                  0 writes none, so a query that needs more
                                                                  than its memory fails; N lets it spill N MB
                                                                  into a fresh temporary folder, removed after
================================  ==============================  ===========================================

The time limit is enforced twice: a timer calls DuckDB's ``interrupt()`` at
the deadline, and the parent kills the process ``KILL_GRACE_S`` later, since
one function call (``repeat('x', 3000000000)``: 18 s, uninterruptible) does
not look at interrupts. Memory that DuckDB does not count against
``memory_limit`` (string heaps: ``SELECT repeat('x', 100000000) FROM
range(10001)`` reached 6 GB with ``memory_limit = 1GB``) is stopped by the
address-space limit. Results travel back as an Arrow IPC stream, never a
pickle (the sandbox's payload after its JSON status line). The database file is never
opened for writing here.

What the server keeps: each browser session keeps its last result (``hold``) to show it on
every rerun. One result is bounded by the budgets above; all of them together by
``QKVSCOPE_SQL_HELD_MB``, counted as the pandas frame's deep size (``held_bytes``), since
``QKVSCOPE_SQL_RESULT_MB`` counts Arrow bytes and a frame of Python objects is larger. A new
result that would pass it drops the oldest results of other sessions until it fits; those
sessions then say so and run their query again on Run (``dropped_message``). A result larger
than the whole budget is refused. A session's query process is one at a time (a Streamlit
session runs one script at a time, and the query runs inside it), and ``_slot`` caps them
server-wide.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np

import pandas as pd
import pyarrow as pa

from loaders.errors import QueryError
from loaders.store import Store

KILL_GRACE_S = 1.0  # after the deadline, the query process is killed

#: name -> default; read from the environment at each query (``sql_budget``).
SQL_BUDGETS: dict[str, int] = {
    "QKVSCOPE_SQL_TIMEOUT_S": 10,
    "QKVSCOPE_SQL_MAX_TIMEOUT_S": 120,
    "QKVSCOPE_SQL_MAX_ROWS": 10_000,
    "QKVSCOPE_SQL_RESULT_MB": 64,
    "QKVSCOPE_SQL_MEMORY_MB": 1024,
    "QKVSCOPE_SQL_ADDRESS_MB": 0,  # 0: QKVSCOPE_SQL_MEMORY_MB + 2048
    "QKVSCOPE_SQL_SPILL_MB": 0,    # 0: no spill files
    "QKVSCOPE_SQL_MAX_VALUES": 2_000_000,
    "QKVSCOPE_SQL_MAX_QUERY_KB": 64,
    "QKVSCOPE_SQL_CONCURRENT": 2,
    "QKVSCOPE_SQL_HELD_MB": 256,
}

#: The query processes running now in this process (a server's sessions share it).
_RUNNING = threading.Lock()
_running = 0


def sql_budget(name: str) -> int:
    """``$name`` if set to a positive integer (or 0 for the spill budget), else
    its default (address space: the memory budget + 2,048 MB)."""
    raw = os.environ.get(name, "").strip().replace("_", "")
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0 or (value == 0 and name != "QKVSCOPE_SQL_SPILL_MB"):
        value = SQL_BUDGETS[name]
    if name == "QKVSCOPE_SQL_ADDRESS_MB" and value <= 0:
        value = sql_budget("QKVSCOPE_SQL_MEMORY_MB") + 2048
    return value


def _raise_hint(name: str) -> str:
    return f"{name}; set it in the environment to raise it"


@dataclass
class QueryResult:
    frame: pd.DataFrame
    truncated: bool
    seconds: float


def check_query(sql: str) -> None:
    """Refuse a query text over ``QKVSCOPE_SQL_MAX_QUERY_KB`` before anything reads it. The
    statement itself (exactly one SELECT or EXPLAIN) is checked in the query process
    (``loaders/sql_child.py``), under its budgets: parsing a few MB of SQL takes GBs."""
    limit_kb = sql_budget("QKVSCOPE_SQL_MAX_QUERY_KB")
    size = len(sql.encode("utf-8", errors="replace"))
    if size > limit_kb << 10:
        raise QueryError(f"query text of {size:,} bytes is over {limit_kb:,} KB "
                         f"({_raise_hint('QKVSCOPE_SQL_MAX_QUERY_KB')})")


def schema(store: Store) -> pd.DataFrame:
    """Tables and columns, for the page's reference panel."""
    with store.connect() as con:
        return con.execute(
            """SELECT table_name AS "table", column_name AS "column", data_type AS type
               FROM information_schema.columns WHERE table_schema = 'main'
               ORDER BY table_name, ordinal_position""").df()


def _timeout_message(timeout_s: float) -> str:
    return f"query stopped after its time limit of {timeout_s:g} s"


def run_readonly_query(store: Store, sql: str, *, timeout_s: float | None = None,
                       max_rows: int | None = None, max_mb: int | None = None) -> QueryResult:
    """Run one SELECT in a sandboxed child process within the budgets above.

    ``timeout_s`` (default ``QKVSCOPE_SQL_TIMEOUT_S``) may not exceed
    ``QKVSCOPE_SQL_MAX_TIMEOUT_S``; ``max_rows`` (default
    ``QKVSCOPE_SQL_MAX_ROWS``) rows are kept and the rest cut off
    (``truncated``); a result over ``max_mb`` MB (default and ceiling
    ``QKVSCOPE_SQL_RESULT_MB``) fails. Every failure is a ``QueryError``
    with one line: refused, failed (DuckDB's first line), over the time
    limit, over the memory budget, or over the result budget.
    """
    check_query(sql)
    ceiling = sql_budget("QKVSCOPE_SQL_MAX_TIMEOUT_S")
    timeout_s = float(sql_budget("QKVSCOPE_SQL_TIMEOUT_S") if timeout_s is None else timeout_s)
    if not 0 < timeout_s <= ceiling:
        raise QueryError(f"time limit {timeout_s:g} s is outside 0-{ceiling:g} s "
                         f"({_raise_hint('QKVSCOPE_SQL_MAX_TIMEOUT_S')})")
    max_rows = sql_budget("QKVSCOPE_SQL_MAX_ROWS") if max_rows is None else int(max_rows)
    result_mb = sql_budget("QKVSCOPE_SQL_RESULT_MB")
    max_mb = result_mb if max_mb is None else min(int(max_mb), result_mb)
    memory_mb = sql_budget("QKVSCOPE_SQL_MEMORY_MB")
    store.migrate()
    spill_mb = sql_budget("QKVSCOPE_SQL_SPILL_MB")
    max_values = sql_budget("QKVSCOPE_SQL_MAX_VALUES")
    with _slot(), tempfile.TemporaryDirectory(prefix="qkvscope-sql-") if spill_mb else nullcontext() as tmp:
        request = {"db": str(store.path), "sql": sql, "timeout_s": timeout_s, "max_rows": max_rows,
                   "max_bytes": max_mb << 20, "max_values": max_values, "memory_mb": memory_mb,
                   "address_mb": sql_budget("QKVSCOPE_SQL_ADDRESS_MB"),
                   "temp_dir": tmp, "spill_mb": spill_mb}
        status, body, err, returncode, seconds = _run_child(request, timeout_s)
    return _result(status, body, err, returncode, seconds, timeout_s=timeout_s, max_mb=max_mb,
                   memory_mb=memory_mb, max_values=max_values)


@contextmanager
def _slot():
    """One of the ``QKVSCOPE_SQL_CONCURRENT`` query processes of this process, or a
    ``QueryError`` when all are taken (N browser sessions would otherwise start N
    processes of ``QKVSCOPE_SQL_MEMORY_MB`` each)."""
    global _running
    limit = sql_budget("QKVSCOPE_SQL_CONCURRENT")
    with _RUNNING:
        if _running >= limit:
            raise QueryError(f"{_running} queries are running already, the most at once "
                             f"({_raise_hint('QKVSCOPE_SQL_CONCURRENT')}); try again when one ends")
        _running += 1
    try:
        yield
    finally:
        with _RUNNING:
            _running -= 1


def _entry():
    """The sandbox entry whose ``sql`` job runs a query (``loaders.sql_child``)."""
    from loaders import sql_child  # here: only when a query runs

    return sql_child


def _run_child(request: dict, timeout_s: float) -> tuple[dict | None, bytes, str, int | None, float]:
    """The query job's status and Arrow stream (``None``, ``b""`` when its process died), the last
    of what the process printed, its exit status (None when it answered) and the wall time;
    killed at the deadline. A fresh sandbox child per query (``loaders.sql_child``)."""
    from loaders import sandbox  # here: only when a query runs

    start = time.monotonic()
    box = sandbox.Sandbox(_entry(), stderr=subprocess.PIPE)
    status, body, err, returncode = None, b"", "", None
    try:
        # the address-space limit is the query's memory bound; RLIMIT_DATA no tighter than it
        job = {k: v for k, v in request.items() if k != "db"}
        reply, payload = box.exchange("sql", request["db"], limit=int(request["address_mb"]) << 20,
                                      seconds=timeout_s + KILL_GRACE_S, **job)
        if reply["ok"]:
            status, body = reply["result"], payload or b""
        else:                           # the job raised: the sandbox's one line
            returncode, err = 1, reply["message"]
    except TimeoutError:
        raise QueryError(_timeout_message(timeout_s)) from None
    except sandbox.Died as exc:
        returncode, err = exc.rc, box.stderr_tail
    finally:
        box.close()                     # one query per process: leave none behind
    return status, body, err, returncode, time.monotonic() - start


def _result(status: dict | None, body: bytes, err: str, returncode: int | None, seconds: float, *,
            timeout_s: float, max_mb: int, memory_mb: int, max_values: int) -> QueryResult:
    """The query job's status and Arrow stream as a result; a ``QueryError`` for each failure."""
    if not isinstance(status, dict):
        # no status: the process died (the kernel's OOM killer, a crash) or the job raised
        last = err.strip().splitlines()[-1:] or [f"exit status {returncode}"]
        if returncode in (-9, 137) or "MemoryError" in last[0] or "bad_alloc" in last[0] \
                or "memory" in last[0].lower():
            raise QueryError(_memory_message(memory_mb))
        if seconds >= timeout_s:
            raise QueryError(_timeout_message(timeout_s))
        raise QueryError(f"query failed: the query process ended: {last[0][:300]}")
    if not status["ok"]:
        kind = status["kind"]
        if kind == "timeout":
            raise QueryError(_timeout_message(timeout_s))
        if kind == "memory":
            raise QueryError(_memory_message(memory_mb))
        if kind == "bytes":
            raise QueryError(f"result over {max_mb:,} MB: add LIMIT or select fewer columns "
                             f"({_raise_hint('QKVSCOPE_SQL_RESULT_MB')})")
        if kind == "values":
            raise QueryError(f"result of over {max_values:,} values (a list or struct cell counts its "
                             f"elements): add LIMIT, unnest less or select fewer columns "
                             f"({_raise_hint('QKVSCOPE_SQL_MAX_VALUES')})")
        if kind == "refused":
            raise QueryError(status["message"])
        raise QueryError(f"query failed: {status['message']}")
    table = pa.ipc.open_stream(body).read_all()
    return QueryResult(frame=table.to_pandas(), truncated=status["truncated"],
                       seconds=status["seconds"])


def _memory_message(memory_mb: int) -> str:
    return (f"query needs more memory than the SQL console's budget of {memory_mb:,} MB "
            f"({_raise_hint('QKVSCOPE_SQL_MEMORY_MB')})")


# -- what the server keeps: each session's last result, all of them under QKVSCOPE_SQL_HELD_MB ---

class Held:
    """One session's last result as the server keeps it (``hold``): ``result`` is ``None`` once
    dropped to make room for other sessions' results; ``nbytes`` is what it held."""

    __slots__ = ("result", "nbytes", "__weakref__")

    def __init__(self, result: QueryResult, nbytes: int) -> None:
        self.result: QueryResult | None = result
        self.nbytes = nbytes


#: The results the server's sessions keep, oldest first. Weak: a closed session's state, once
#: Streamlit lets it go, takes its result along and leaves the count by itself.
_HELD_LOCK = threading.Lock()
_held: list[weakref.ref[Held]] = []


def _object_bytes(value) -> int:
    """``value``'s size with what it contains (a list or struct cell as pandas builds it: an
    array of dicts of arrays), recursively; ``sys.getsizeof`` counts the container only."""
    size = sys.getsizeof(value)
    if isinstance(value, np.ndarray) and value.dtype == object:
        size += sum(_object_bytes(v) for v in value.ravel())
    elif isinstance(value, dict):
        size += sum(_object_bytes(k) + _object_bytes(v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        size += sum(_object_bytes(v) for v in value)
    return size


def held_bytes(frame: pd.DataFrame) -> int:
    """Bytes ``frame`` holds in the server: pandas' deep size (a column of arrays or Arrow
    strings counts its buffers, a column of Python objects each object), with the contents
    of list and struct cells counted too."""
    total = int(frame.memory_usage(index=True, deep=True).sum())
    for column in frame.columns[(frame.dtypes == object).to_numpy()]:
        for value in frame[column].to_numpy():
            if isinstance(value, (np.ndarray, dict, list, tuple)):
                total += _object_bytes(value) - sys.getsizeof(value)
    return total


def _live() -> list[Held]:
    """The results kept now, oldest first (caller holds ``_HELD_LOCK``)."""
    return [h for h in (ref() for ref in _held) if h is not None and h.result is not None]


def held_total() -> int:
    """Bytes of all results the server's sessions keep now."""
    with _HELD_LOCK:
        return sum(h.nbytes for h in _live())


def release(held: Held | None) -> None:
    """Let ``held`` go (a session about to run its next query, or leaving)."""
    if held is not None:
        with _HELD_LOCK:
            held.result = None
            _held[:] = [weakref.ref(h) for h in _live()]


def hold(result: QueryResult, *, previous: Held | None = None) -> Held:
    """``result`` kept for a session, in place of its ``previous`` one. When all results kept
    would pass ``QKVSCOPE_SQL_HELD_MB``, the oldest of other sessions are dropped until it fits
    (they are run again on demand); a result over the whole budget is a ``QueryError``."""
    budget_mb = sql_budget("QKVSCOPE_SQL_HELD_MB")
    nbytes = held_bytes(result.frame)
    release(previous)
    if nbytes > budget_mb << 20:
        raise QueryError(f"result of {nbytes / (1 << 20):,.0f} MB in the server is over the {budget_mb:,} MB "
                         f"it keeps for all sessions' results: add LIMIT or select fewer columns "
                         f"({_raise_hint('QKVSCOPE_SQL_HELD_MB')})")
    held = Held(result, nbytes)
    with _HELD_LOCK:
        live = _live()
        total = sum(h.nbytes for h in live)
        while live and total + nbytes > budget_mb << 20:
            oldest = live.pop(0)
            oldest.result = None
            total -= oldest.nbytes
        _held[:] = [weakref.ref(h) for h in live + [held]]
    return held


def dropped_message(held: Held) -> str:
    """What a session whose result was dropped (``hold``) shows in its place."""
    return (f"this result ({held.nbytes / (1 << 20):,.0f} MB) was dropped to make room for another "
            f"session's: the server keeps {sql_budget('QKVSCOPE_SQL_HELD_MB'):,} MB of results for all "
            f"sessions ({_raise_hint('QKVSCOPE_SQL_HELD_MB')}); press Run to run the query again")
