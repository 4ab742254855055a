"""The SQL console's query job: one query in a sandbox child, its own budgets, then exit.

A sandbox entry (``loaders.sandbox``) whose table holds one job, ``sql``
(``query``), and preloads nothing: ``loaders.sql_console.run_readonly_query``
starts a child of it for each query (``python -P -m loaders.sql_child``: of
this project only the sandbox's plumbing is imported, then duckdb and pyarrow
under the limit) and sends the job the database path and::

    {"sql": TEXT, "timeout_s": S, "max_rows": N, "max_bytes": B,
     "max_values": V, "memory_mb": M, "address_mb": A, "temp_dir": DIR | null, "spill_mb": T}

It lowers its own address-space limit to ``A`` MB (``RLIMIT_AS``) before
importing duckdb, opens ``db`` read-only with external access off,
``memory_limit = M MB``, ``temp_directory = ''`` (no spill files; or ``DIR``
with ``max_temp_directory_size = T MB`` when the parent made one), one thread
and the configuration locked, and streams the result as Arrow record batches,
counting rows and bytes as they arrive: at ``N + 1`` rows it stops (the
result is truncated to ``N``), past ``B`` bytes it stops with an error, and
past ``V`` values it stops with an error too. Values count what the server
will build from the result, not what Arrow holds: a cell of a flat column is
one, a list or struct cell is one plus its elements, recursively
(``SELECT array_agg({'a': NULL}) FROM range(1e7)`` is a few hundred bytes of
Arrow, since a null child costs nothing, but 2e7 Python objects in pandas).
The query text is parsed here too, under these budgets, never in the server:
exactly one SELECT or EXPLAIN statement is accepted. A
timer calls ``interrupt()`` at ``S`` seconds; a single function call that
does not check for interrupts (``repeat('x', 3e9)``) is ended by the parent,
which kills this process shortly after the deadline, or by the address-space
limit, which makes its allocation fail.

Its result is a status, ``{"ok": true, "truncated": bool, "seconds": float}`` or
``{"ok": false, "kind": "timeout"|"memory"|"bytes"|"values"|"refused"|"failed", "message": str}``,
and, on success, the rows as an Arrow IPC stream sent after it (the sandbox's payload).
"""
from __future__ import annotations

import resource
import sys
import threading
import time

from loaders.sandbox import WithPayload, serve

JOBS = {"sql": ("loaders.sql_child", "query")}
PRELOAD: tuple[str, ...] = ()   # duckdb is imported by the job, under its address-space limit

BATCH_ROWS = 1024  # rows per Arrow record batch read from DuckDB


def _values(array) -> int:
    """How many values ``array`` (an Arrow array) becomes in pandas: one per slot, plus, for a
    list, map or struct, the values of its children, recursively (nulls count: each is an
    object the server holds)."""
    import pyarrow as pa  # here: imported by query under the address-space limit, never at module load

    n = len(array)
    t = array.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_map(t):
        return n + _values(array.flatten())
    if pa.types.is_struct(t):
        return n + sum(_values(array.field(i)) for i in range(t.num_fields))
    return n


def _refusal(duckdb, sql: str) -> str | None:
    """Why ``sql`` is refused (anything but exactly one SELECT or EXPLAIN), or None."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        return f"query does not parse: {(str(exc).splitlines() or [type(exc).__name__])[0]}"
    if len(statements) != 1:
        return f"one statement at a time, please (found {len(statements)})"
    kind = statements[0].type
    if kind not in (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN):
        name = str(kind).rsplit(".", 1)[-1]
        return f"only SELECT queries are allowed here (got {name}); the SQL page never changes the database"
    return None


def _status(**fields) -> WithPayload:
    return WithPayload(fields, b"")


def query(db: str, **req) -> WithPayload:
    """Run ``req["sql"]`` on the database ``db`` within the budgets of ``req`` (module docstring)."""
    cap = int(req["address_mb"]) << 20
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))

    # imported under the address-space limit set above, so what DuckDB maps counts toward it
    import duckdb
    import pyarrow as pa

    # loaders.duck.NO_NETWORK spelt out: that module would import duckdb at its own load
    config = {"enable_external_access": False, "threads": 1,
              "autoinstall_known_extensions": False, "autoload_known_extensions": False,
              "memory_limit": f"{int(req['memory_mb'])}MiB", "temp_directory": req.get("temp_dir") or ""}
    if req.get("temp_dir"):
        config["max_temp_directory_size"] = f"{int(req['spill_mb'])}MiB"
    con = duckdb.connect(db, read_only=True, config=config)
    con.execute("SET enable_progress_bar = false")
    con.execute("SET lock_configuration = true")
    max_rows, max_bytes, max_values = int(req["max_rows"]), int(req["max_bytes"]), int(req["max_values"])
    timer = threading.Timer(float(req["timeout_s"]), con.interrupt)
    start = time.monotonic()
    timer.start()
    batches, rows, nbytes, nvalues = [], 0, 0, 0
    try:
        refused = _refusal(duckdb, req["sql"])
        if refused:
            return _status(ok=False, kind="refused", message=refused)
        reader = con.sql(req["sql"]).to_arrow_reader(BATCH_ROWS)
        schema = reader.schema
        for batch in reader:
            keep = batch.slice(0, max(0, max_rows + 1 - rows))
            rows += keep.num_rows
            nbytes += keep.nbytes
            if nbytes > max_bytes:
                return _status(ok=False, kind="bytes", message="")
            nvalues += sum(_values(column) for column in keep.columns)
            if nvalues > max_values:
                return _status(ok=False, kind="values", message=f"{nvalues:,}")
            batches.append(keep)
            if rows > max_rows:
                break
        reader.close()
    except (duckdb.Error, MemoryError, pa.ArrowException, OSError) as exc:
        # errors met while streaming arrive through Arrow's C stream as
        # OSError/ArrowException carrying DuckDB's message
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        if isinstance(exc, duckdb.InterruptException) or first.startswith("INTERRUPT"):
            return _status(ok=False, kind="timeout", message=first)
        if (isinstance(exc, (duckdb.OutOfMemoryException, MemoryError, pa.ArrowMemoryError))
                or first.startswith("Out of Memory Error")):
            return _status(ok=False, kind="memory", message=first)
        return _status(ok=False, kind="failed", message=first)
    finally:
        timer.cancel()
    seconds = time.monotonic() - start
    table = pa.Table.from_batches(batches, schema=schema).slice(0, max_rows)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return WithPayload({"ok": True, "truncated": rows > max_rows, "seconds": seconds},
                       sink.getvalue().to_pybytes())


if __name__ == "__main__":
    sys.exit(serve(JOBS, PRELOAD))
