"""SQLite files of experiment trackers (MLflow's ``mlflow.db``, trackio's
``<project>.db``): opened with Python's ``sqlite3``, read-only
(``file:...?mode=ro`` URI: nothing is written, no journal is created), never
through DuckDB's sqlite extension (which it would download).
"""
from __future__ import annotations

import sqlite3
from contextlib import closing, contextmanager
from pathlib import Path
from urllib.parse import quote

from loaders.errors import LogFormatError

#: The first 16 bytes of every SQLite 3 database file.
MAGIC = b"SQLite format 3\x00"


@contextmanager
def open_ro(path: Path):
    """A read-only connection to ``path``; an SQLite error is a ``LogFormatError``."""
    uri = f"file:{quote(str(Path(path).resolve()))}?mode=ro"
    try:
        with closing(sqlite3.connect(uri, uri=True)) as con:
            yield con
    except sqlite3.Error as exc:
        raise LogFormatError(path, f"expected a readable SQLite database, found one SQLite cannot read "
                                   f"({type(exc).__name__}: {exc})") from None


def columns(path: Path) -> dict[str, set[str]]:
    """``{table: {column, ...}}`` of an SQLite file; {} when it cannot be read."""
    try:
        with open_ro(path) as con:
            tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            return {t: {r[1] for r in con.execute("SELECT * FROM pragma_table_info(?)", [t])} for t in tables}
    except (LogFormatError, sqlite3.Error):
        return {}


def has(path: Path, head: bytes, schema: dict[str, set[str]]) -> bool:
    """Whether ``path`` is an SQLite file holding every table of ``schema`` with those columns."""
    if head[:16] != MAGIC:
        return False
    found = columns(path)
    return all(t in found and cols <= found[t] for t, cols in schema.items())


def why_not(path: Path, expected: dict[str, dict[str, set[str]]]) -> str:
    """Why an SQLite file is none of ``expected`` ({format: schema}): its tables."""
    found = columns(path)
    want = "; ".join(f"{fmt}: " + ", ".join(f"{t}({', '.join(sorted(c))})" for t, c in sorted(s.items()))
                     for fmt, s in expected.items())
    return (f"expected a tracker's SQLite store ({want}), found an SQLite database with tables "
            f"{', '.join(sorted(found)) or '(none)'}")
