"""Every DuckDB connection the project opens: ``connect`` (no network, ever).

DuckDB installs and loads a "known" extension on first use by default: a
``--db`` naming an SQLite file would make it download ``sqlite_scanner`` from
the internet and create ``~/.duckdb/``; ``read_csv('https://...')`` would load
``httpfs``. Every connection here is opened with both switched off
(``autoinstall_known_extensions``, ``autoload_known_extensions``), so a
file that needs an extension is an error naming it, and nothing leaves the
machine. ``tests/test_duckdb_connections.py`` keeps every other module from
calling ``duckdb.connect`` itself.

A path handed to DuckDB's ``read_csv``/``read_json``/``read_parquet`` is a
pattern: ``log?.csv`` reads ``logX.csv``, ``run[12].csv`` reads ``run1.csv``.
``literal_file`` gives what reads exactly one file, whatever its name.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import duckdb

#: Settings of every connection: no extension is fetched or loaded behind the user's back.
NO_NETWORK = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}


def connect(database: str = ":memory:", *, read_only: bool = False,
            config: dict | None = None) -> duckdb.DuckDBPyConnection:
    """``duckdb.connect(database, read_only=..., config=...)`` with ``NO_NETWORK`` added to ``config``."""
    return duckdb.connect(database, read_only=read_only, config={**(config or {}), **NO_NETWORK})


#: Characters DuckDB's file readers expand in a path (``*``, ``?``, ``[...]``, ``{a,b}``).
GLOB_CHARS = frozenset("*?[]{}")


def literal_file(path: str | Path) -> str | BinaryIO:
    """What DuckDB's file readers read as exactly the file ``path``: its absolute path
    when that holds none of ``GLOB_CHARS`` (DuckDB reads it itself, the fastest way),
    else the file opened here, which DuckDB reads through (about 2.6x slower on a
    50 MB CSV) and closes once the relation is gone."""
    text = os.path.abspath(path)
    if GLOB_CHARS.isdisjoint(text):
        return text
    return open(text, "rb")     # noqa: SIM115 -- the relation reading it owns it
