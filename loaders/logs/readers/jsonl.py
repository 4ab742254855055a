"""JSON-lines logs: one object per line with a step and numeric fields.

Parsed by DuckDB's ``read_json`` (newline-delimited, every row sampled so a
metric that first appears late is still a column) and reshaped with
``UNPIVOT``: a key absent from a line is no point; ``NaN`` is a point whose
value is NaN (stored as NULL). Non-numeric fields (strings, nested objects)
are not metrics and are ignored. This is the format of this project's own
trainer (``metrics.jsonl`` beside ``config.json``).

A reader module (protocol: ``loaders.logs.readers``); a new format copies
this one: ``NAME``, ``PRIORITY``, ``HELP``, ``APPENDABLE``, ``sniff``, ``read``.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import duckdb

from loaders.errors import LogFormatError
from loaders import duck
from loaders.logs.base import (SOURCE_VIEW, Parsed, RunData, complete_lines, decode_text, empty_points,
                               is_text_head)
from loaders.logs.readers._csv import STEP_COLUMNS, TOKEN_COLUMNS, WALL_COLUMNS, unpivot_select

NAME = "jsonl"
PRIORITY = 40
HELP = "JSON lines: one object per line with a step key (step, iter, ...) and numeric fields"
APPENDABLE = True
EXAMPLE = "runs/k_eq_v-mha-wd0.03/metrics.jsonl"

_NUMERIC = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
            "UINTEGER", "UBIGINT", "FLOAT", "DOUBLE"}


def _first_object(text: str) -> dict | None:
    """The first non-empty line of ``text`` as a JSON object, or None."""
    for line in text.split("\n"):
        line = line.strip()
        if not line:
            continue
        if not line.startswith("{"):
            return None
        try:
            obj = json.loads(line)
        except ValueError:
            return None
        return obj if isinstance(obj, dict) else None
    return None


def _step_key(keys) -> str | None:
    low = {k.lower(): k for k in keys}
    for n in STEP_COLUMNS:
        if n in low:
            return low[n]
    return None


def sniff(path: Path, head: bytes) -> bool:
    """The first non-empty line is a JSON object with a step key and a numeric field."""
    if not is_text_head(head):
        return False
    try:
        text = head.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        text = head[:exc.start].decode("utf-8")
    obj = _first_object(text)
    if obj is None or _step_key(obj) is None:
        return False
    return any(isinstance(v, (int, float)) and not isinstance(v, bool)
               for k, v in obj.items() if k != _step_key(obj))


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read()
    chunk, used = complete_lines(data, complete)
    if start == 0 and not chunk and data.strip():
        chunk, used = data, len(data)  # a one-line file without its final newline
    decode_text(path, chunk, start)
    state = dict(state or {})
    if not chunk.strip():
        return Parsed(runs=[], read_bytes=start + used, state=state)
    con = duck.connect()
    try:
        try:
            rel = con.read_json(io.BytesIO(chunk), format="newline_delimited", sample_size=-1)
        except duckdb.Error as exc:
            raise LogFormatError(path, f"expected one JSON object per line, found a line "
                                       f"DuckDB cannot parse ({str(exc).splitlines()[0]})") from None
        con.register(SOURCE_VIEW, rel)
        cols = dict(zip(rel.columns, (str(t) for t in rel.types)))
        step = _step_key(cols) or state.get("step")
        if step is None or step not in cols:
            raise LogFormatError(path, f"expected a step key ({', '.join(STEP_COLUMNS[:5])}, ...) "
                                       f"in each object, found keys {sorted(cols)[:10]}")
        low = {c.lower(): c for c in cols}
        wall = next((low[w] for w in WALL_COLUMNS if w in low), None)
        tokens = next((low[t] for t in TOKEN_COLUMNS if t in low), None)
        metrics = [c for c, t in cols.items()
                   if c not in (step, wall, tokens) and t.split("(")[0] in _NUMERIC]
        state["step"] = step
        pts = empty_points()
        if metrics:
            select, params = unpivot_select(step, [(m, m) for m in metrics], wall, tokens)
            pts = con.sql(select, params=params or None).to_arrow_table()
    finally:
        con.close()
    return Parsed(runs=[RunData(name="", points=pts)], read_bytes=start + used, state=state)
