"""The SQL console's query process: one query, its own budgets, then exit.

Started by ``loaders.sql_console.run_readonly_query`` as ``python -I
loaders/sql_child.py`` (isolated: nothing of this project is imported, only
duckdb and pyarrow). It reads one JSON request on stdin::

    {"db": PATH, "sql": TEXT, "timeout_s": S, "max_rows": N, "max_bytes": B,
     "max_values": V, "memory_mb": M, "address_mb": A, "temp_dir": DIR | null, "spill_mb": T}

lowers its own address-space limit to ``A`` MB (``RLIMIT_AS``) before
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

It writes one JSON status line to stdout, then, on success, the result as an
Arrow IPC stream: ``{"ok": true, "truncated": bool, "seconds": float}`` or
``{"ok": false, "kind": "timeout"|"memory"|"bytes"|"values"|"refused"|"failed", "message": str}``.
"""
from __future__ import annotations

import json
import resource
import sys
import threading
import time

BATCH_ROWS = 1024  # rows per Arrow record batch read from DuckDB


def _values(array) -> int:
    """How many values ``array`` (an Arrow array) becomes in pandas: one per slot, plus, for a
    list, map or struct, the values of its children, recursively (nulls count: each is an
    object the server holds)."""
    import pyarrow as pa  # here: imported by main under the address-space limit, never at module load

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


def _status(out, **fields) -> None:
    out.write(json.dumps(fields).encode() + b"\n")
    out.flush()


def main() -> int:
    req = json.loads(sys.stdin.read())
    out = sys.stdout.buffer
    cap = int(req["address_mb"]) << 20
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))

    # imported under the address-space limit set above, so what DuckDB maps counts toward it
    import duckdb
    import pyarrow as pa

    # a standalone script (run with -I, no project on the path): loaders.duck.NO_NETWORK spelt out
    config = {"enable_external_access": False, "threads": 1,
              "autoinstall_known_extensions": False, "autoload_known_extensions": False,
              "memory_limit": f"{int(req['memory_mb'])}MiB", "temp_directory": req.get("temp_dir") or ""}
    if req.get("temp_dir"):
        config["max_temp_directory_size"] = f"{int(req['spill_mb'])}MiB"
    con = duckdb.connect(req["db"], read_only=True, config=config)
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
            _status(out, ok=False, kind="refused", message=refused)
            return 0
        reader = con.sql(req["sql"]).to_arrow_reader(BATCH_ROWS)
        schema = reader.schema
        for batch in reader:
            keep = batch.slice(0, max(0, max_rows + 1 - rows))
            rows += keep.num_rows
            nbytes += keep.nbytes
            if nbytes > max_bytes:
                _status(out, ok=False, kind="bytes", message="")
                return 0
            nvalues += sum(_values(column) for column in keep.columns)
            if nvalues > max_values:
                _status(out, ok=False, kind="values", message=f"{nvalues:,}")
                return 0
            batches.append(keep)
            if rows > max_rows:
                break
        reader.close()
    except (duckdb.Error, MemoryError, pa.ArrowException, OSError) as exc:
        # errors met while streaming arrive through Arrow's C stream as
        # OSError/ArrowException carrying DuckDB's message
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        if isinstance(exc, duckdb.InterruptException) or first.startswith("INTERRUPT"):
            _status(out, ok=False, kind="timeout", message=first)
        elif (isinstance(exc, (duckdb.OutOfMemoryException, MemoryError, pa.ArrowMemoryError))
              or first.startswith("Out of Memory Error")):
            _status(out, ok=False, kind="memory", message=first)
        else:
            _status(out, ok=False, kind="failed", message=first)
        return 0
    finally:
        timer.cancel()
    seconds = time.monotonic() - start
    table = pa.Table.from_batches(batches, schema=schema).slice(0, max_rows)
    _status(out, ok=True, truncated=rows > max_rows, seconds=seconds)
    with pa.ipc.new_stream(out, table.schema) as writer:
        writer.write_table(table)
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
