"""The ingest journal (table ``ingest_journal``): what was read of each file, so a rescan reads
nothing of an unchanged file and only the new part of a grown log. Every statement on the table
is here; each takes the connection of the caller's transaction.

A row is keyed by the file's resolved path: ``kind`` (``log`` or ``checkpoint``), the reader
``format``, ``size`` and ``mtime`` when it was read, the content ``sha256`` (a checkpoint's, a
log read whole), and for a log ``read_bytes`` (how far it was consumed, the end of a complete
line) and the reader ``state`` (JSON: ``loaders.logs.ingest``).
"""
from __future__ import annotations

import json


def stored_checkpoint(con, key: str, size: int, mtime: float) -> int | None:
    """The id of the stored checkpoint the file ``key`` was journalled as, when it still has
    this ``size`` and ``mtime`` (so it needs no re-hashing); else None."""
    row = con.execute(
        """SELECT c.id FROM ingest_journal j JOIN checkpoints c ON c.sha256 = j.sha256
           WHERE j.path = ? AND j.kind = 'checkpoint' AND j.size = ? AND j.mtime = ?""",
        [key, size, mtime]).fetchone()
    return None if row is None else row[0]


def record_checkpoint(con, key: str, size: int, mtime: float, digest: str) -> None:
    """Journal the file ``key`` as the checkpoint of content hash ``digest``."""
    con.execute(
        """INSERT OR REPLACE INTO ingest_journal (path, kind, format, size, mtime, sha256)
           VALUES (?, 'checkpoint', NULL, ?, ?, ?)""", [key, size, mtime, digest])


def log_entry(con, key: str) -> dict | None:
    """The journal row of the log ``key``: ``size, mtime, sha256, read_bytes, state`` (a dict)
    and ``format``; None when it was never read."""
    row = con.execute("SELECT size, mtime, sha256, read_bytes, state, format FROM ingest_journal "
                      "WHERE path = ? AND kind = 'log'", [key]).fetchone()
    if row is None:
        return None
    return {"size": row[0], "mtime": row[1], "sha256": row[2], "read_bytes": row[3],
            "state": json.loads(row[4]) if row[4] else {}, "format": row[5]}


def log_seen(con, key: str) -> tuple | None:
    """``(size, mtime, read_bytes)`` of the log ``key`` as journalled; None when never read."""
    rows = con.execute("SELECT size, mtime, read_bytes FROM ingest_journal WHERE path = ? AND kind = 'log'",
                       [key]).fetchall()          # fetchall: no open result before a register()
    return tuple(rows[0]) if rows else None


def touch(con, key: str, size: int, mtime: float) -> None:
    """A file whose content is unchanged got a new ``size``/``mtime`` stamp: keep it."""
    con.execute("UPDATE ingest_journal SET mtime = ?, size = ? WHERE path = ?", [mtime, size, key])


def record_log(con, key: str, fmt: str, size: int, mtime: float, digest: str | None, read_bytes: int | None,
               state: dict) -> None:
    """Journal the log ``key`` as read by the reader ``fmt`` up to ``read_bytes``, with its ``state``."""
    con.execute(
        """INSERT OR REPLACE INTO ingest_journal
               (path, kind, format, size, mtime, sha256, read_bytes, state, ingested_at)
           VALUES (?, 'log', ?, ?, ?, ?, ?, ?, current_timestamp)""",
        [key, fmt, size, mtime, digest, read_bytes, json.dumps(state)])
