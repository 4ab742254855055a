"""Shared helpers for the log tests: a store in tmp_path and point queries."""
from __future__ import annotations

from pathlib import Path

from loaders.store import Store


def points(store: Store, run_id: int, metric: str) -> list[tuple]:
    """(step, value) of one metric of one run, by step."""
    with store.connect() as con:
        return con.execute("SELECT step, value FROM points WHERE run_id = ? AND metric = ? ORDER BY step",
                           [run_id, metric]).fetchall()


def count_points(store: Store) -> int:
    with store.connect() as con:
        return con.execute("SELECT count(*) FROM points").fetchone()[0]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
