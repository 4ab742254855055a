"""trackio project files (``~/.cache/huggingface/trackio/<project>.db``):
every run of the project, one run each, read with ``sqlite3`` read-only
(``_sqlite``), without the ``trackio`` package.

Tables as trackio's ``SQLiteStorage`` (``trackio/sqlite_storage.py``) writes
them: ``metrics(id, timestamp ISO text, run_name, step, metrics)`` where
``metrics`` is one JSON object per logged step (text, or bytes from
``orjson``); older files also have ``project_name`` in it. ``configs(run_name,
config)`` holds each run's config as JSON (trackio's own keys start with
``_``, e.g. ``_Username``, ``_Created``: kept in the config, not read as
hyperparameters). The project is ``project_name``, else the file's stem
(trackio names the file after it), in ``meta["project"]``.

Values that are not numbers (media, tables, strings) are counted per key in
``config["values_not_numbers"]``; a ``metrics`` cell that is not a JSON
object is a ``LogFormatError`` naming its row. A changed file is read again
whole.
"""
from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

from loaders.errors import LogFormatError
from loaders.logs.base import Parsed, RunData, empty_points, normalise_metric, points_frame
from loaders.logs.readers import _sqlite

NAME = "trackio"
PRIORITY = 13
HELP = "trackio project file (<project>.db: metrics table of JSON rows by run_name, step; configs): every run"
APPENDABLE = False
EXAMPLE = "~/.cache/huggingface/trackio/my-project.db"

SCHEMA = {"metrics": {"timestamp", "run_name", "step", "metrics"}}


def sniff(path: Path, head: bytes) -> bool:
    return _sqlite.has(path, head, SCHEMA)


def _wall(ts) -> float:
    try:
        return datetime.fromisoformat(str(ts)).timestamp()
    except ValueError:
        return math.nan


def _json(path: Path, raw, what: str):
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        raise LogFormatError(path, f"expected {what} to be JSON, found {str(raw)[:80]!r}") from None


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    cols = _sqlite.columns(path)
    project_col = "project_name" in cols.get("metrics", set())
    with _sqlite.open_ro(path) as con:
        rows = con.execute(
            f"SELECT id, run_name, step, timestamp, metrics, {'project_name' if project_col else 'NULL'} "
            f"FROM metrics ORDER BY id").fetchall()
        configs: dict[str, dict] = {}
        if {"run_name", "config"} <= cols.get("configs", set()):
            for run, raw in con.execute("SELECT run_name, config FROM configs ORDER BY rowid"):
                cfg = _json(path, raw, f"the config of run {run!r}")
                if isinstance(cfg, dict):
                    configs[run] = cfg
    runs: dict[str, dict] = {}
    for row_id, run, step, ts, raw, project in rows:
        r = runs.setdefault(run, {"pts": [], "not_numbers": {}, "project": project})
        values = _json(path, raw, f"the metrics of row {row_id}")
        if not isinstance(values, dict):
            raise LogFormatError(path, f"expected the metrics of row {row_id} to be a JSON object, found "
                                       f"{type(values).__name__}")
        wall = _wall(ts)
        for key, v in values.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                r["not_numbers"][key] = r["not_numbers"].get(key, 0) + 1
                continue
            r["pts"].append((int(step), normalise_metric(key), float(v), wall))
    out = []
    for run, r in runs.items():
        project = r["project"] or path.stem
        config = {"trackio_config": configs.get(run, {}), "project": project}
        if r["not_numbers"]:
            config["values_not_numbers"] = r["not_numbers"]
        pts = points_frame(*zip(*r["pts"])) if r["pts"] else empty_points()
        out.append(RunData(name=run, points=pts, config=config, meta={"project": project}))
    return Parsed(out)
