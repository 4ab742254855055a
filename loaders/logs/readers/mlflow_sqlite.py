"""MLflow's SQLite tracking store (``mlflow.db``, ``--backend-store-uri
sqlite:///mlflow.db``): every run of the file, one run each, read with
``sqlite3`` read-only (``_sqlite``), without the ``mlflow`` package.

Tables as MLflow's SQLAlchemy store defines them (``mlflow/store/tracking/
dbmodels/models.py``; the schema in mlflow's ``tests/resources/db/
latest_schema.sql``): ``experiments(experiment_id, name)``,
``runs(run_uuid, name, experiment_id, lifecycle_stage)``,
``metrics(key, value, timestamp ms, step, is_nan, run_uuid)``,
``params(key, value, run_uuid)``, ``tags(key, value, run_uuid)``.

A run is named by its ``mlflow.runName`` tag (else ``runs.name``, its id);
its params are its config; its experiment's name goes to
``meta["project"]``. Runs deleted in MLflow (``lifecycle_stage``
``deleted``) are left out and counted in each run's
``config["mlflow_deleted_runs"]``. An ``is_nan`` value is stored as NaN.
A changed file is read again whole.
"""
from __future__ import annotations

import math
from pathlib import Path

from loaders.logs.base import Parsed, RunData, empty_points, normalise_metric, points_frame
from loaders.logs.readers import _sqlite

NAME = "mlflow_sqlite"
PRIORITY = 12
HELP = "MLflow SQLite tracking store (mlflow.db: experiments, runs, metrics, params, tags): every run"
APPENDABLE = False
EXAMPLE = "mlflow.db"

SCHEMA = {"experiments": {"experiment_id", "name"},
          "runs": {"run_uuid", "name", "experiment_id", "lifecycle_stage"},
          "metrics": {"key", "value", "timestamp", "step", "run_uuid"},
          "params": {"key", "value", "run_uuid"},
          "tags": {"key", "value", "run_uuid"}}


def sniff(path: Path, head: bytes) -> bool:
    return _sqlite.has(path, head, SCHEMA)


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    with _sqlite.open_ro(path) as con:
        exps = dict(con.execute("SELECT experiment_id, name FROM experiments").fetchall())
        runs = con.execute("SELECT run_uuid, name, experiment_id, lifecycle_stage FROM runs "
                           "ORDER BY start_time, run_uuid").fetchall()
        kv: dict[str, dict[str, dict]] = {"params": {}, "tags": {}}
        for table in kv:
            for key, value, run in con.execute(f"SELECT key, value, run_uuid FROM {table}"):
                kv[table].setdefault(run, {})[key] = value
        has_nan = "is_nan" in _sqlite.columns(path).get("metrics", set())
        rows: dict[str, list] = {}
        for run, key, value, ts, step, nan in con.execute(
                f"SELECT run_uuid, key, value, timestamp, step, {'is_nan' if has_nan else '0'} FROM metrics "
                f"ORDER BY run_uuid, timestamp, step"):
            rows.setdefault(run, []).append((step, normalise_metric(key), math.nan if nan else value,
                                             ts / 1000.0 if ts is not None else math.nan))
    deleted = sum(1 for r in runs if r[3] == "deleted")
    names = [kv["tags"].get(r[0], {}).get("mlflow.runName") or r[1] or r[0] for r in runs]
    out = []
    for (run_id, _, exp_id, stage), name in zip(runs, names):
        if stage == "deleted":
            continue
        tags = kv["tags"].get(run_id, {})
        pts = rows.get(run_id, [])
        config = {"mlflow_run_id": run_id, "mlflow_params": kv["params"].get(run_id, {}),
                  "mlflow_tags": {k: v for k, v in tags.items() if not k.startswith("mlflow.")}}
        if deleted:
            config["mlflow_deleted_runs"] = deleted
        meta = {}
        if exps.get(exp_id):
            meta["project"] = config["project"] = exps[exp_id]
        if names.count(name) > 1:            # MLflow names need not be unique: the id tells them apart
            name = f"{name} ({run_id[:8]})"
        out.append(RunData(name=name,
                           points=points_frame(*zip(*pts)) if pts else empty_points(),
                           config=config, meta=meta))
    return Parsed(out)
