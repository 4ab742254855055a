"""Every DuckDB connection the project opens: ``connect`` (no network, ever).

DuckDB installs and loads a "known" extension on first use by default: a
``--db`` naming an SQLite file would make it download ``sqlite_scanner`` from
the internet and create ``~/.duckdb/``; ``read_csv('https://...')`` would load
``httpfs``. Every connection here is opened with both switched off
(``autoinstall_known_extensions``, ``autoload_known_extensions``), so a
file that needs an extension is an error naming it, and nothing leaves the
machine. ``tests/test_duckdb_connections.py`` keeps every other module from
calling ``duckdb.connect`` itself.
"""
from __future__ import annotations

import duckdb

#: Settings of every connection: no extension is fetched or loaded behind the user's back.
NO_NETWORK = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}


def connect(database: str = ":memory:", *, read_only: bool = False,
            config: dict | None = None) -> duckdb.DuckDBPyConnection:
    """``duckdb.connect(database, read_only=..., config=...)`` with ``NO_NETWORK`` added to ``config``."""
    return duckdb.connect(database, read_only=read_only, config={**(config or {}), **NO_NETWORK})
