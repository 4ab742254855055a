"""MLflow's file store (``mlruns/``): ONE run per run folder, read without
the ``mlflow`` package, as its ``FileStore`` lays it out
(``mlflow/store/tracking/file_store.py``):

* ``mlruns/<experiment id>/meta.yaml``: the experiment (``name``);
* ``mlruns/<experiment id>/<run id>/meta.yaml``: the run (``run_id``,
  ``run_name``; in old stores ``name``, often empty), the unit's file;
* ``metrics/<key>``: one line per logged value, ``<timestamp ms> <value> <step>``
  (stores older than steps write ``<timestamp ms> <value>``: step 0, as
  MLflow reads them); a key with ``/`` is a sub-folder (``metrics/train/loss``);
* ``params/<key>``: the value as text; ``tags/<key>``: the same, with the
  run's display name in ``tags/mlflow.runName``.

The run is named by ``mlflow.runName`` (else ``run_name``, ``name``, the run
id); its params are its config (lr, weight decay, seed, model size through
``loaders.logs.metadata``), the experiment's name goes to ``meta["project"]``.
A run deleted in MLflow but not yet moved to ``mlruns/.trash/`` (which the
folder walk reports and skips) is read, its ``config["mlflow_lifecycle_stage"]``
saying ``deleted``. A metric line that is not 2 or 3 fields of numbers is a ``LogFormatError``
naming the file and line (the run is not stored half-read). Artifacts are
not read. A change to any file of the run folder reads it again whole.
"""
from __future__ import annotations

from pathlib import Path

from loaders.errors import LogFormatError
from loaders.logs.base import Parsed, RunData, empty_points, normalise_metric, points_frame
from loaders.logs.metadata import _read_yaml
from loaders.tracker_stores import mlflow_run_meta

NAME = "mlflow_files"
PRIORITY = 14
HELP = ("MLflow file store run (mlruns/<experiment>/<run>/meta.yaml + metrics/, params/, tags/): "
        "one run per folder")
APPENDABLE = False
EXAMPLE = "mlruns/1/ed05f9cd599442fe9a0c9222184710b8/meta.yaml"
FOLDER_UNIT = True


def sniff(path: Path, head: bytes) -> bool:
    return path.name == "meta.yaml" and mlflow_run_meta(path.parent) == path


def sniff_dir(folder: Path) -> Path | None:
    return mlflow_run_meta(folder)


def key_files(folder: Path) -> dict[str, Path]:
    """``{key: file}`` of a ``metrics/``, ``params/`` or ``tags/`` folder; a
    key holding ``/`` is a path below it."""
    if not folder.is_dir():
        return {}
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise LogFormatError(path, f"expected UTF-8 text, found byte 0x{exc.object[exc.start]:02x} at "
                                   f"offset {exc.start} that is not valid UTF-8") from None


def metric_lines(path: Path) -> tuple[list[int], list[float], list[float]]:
    """(steps, values, wall times in s) of one metric file."""
    steps, values, walls = [], [], []
    for n, line in enumerate(_text(path).splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            ts, value = int(parts[0]), float(parts[1])
            step = int(parts[2]) if len(parts) == 3 else 0
        except ValueError:
            raise LogFormatError(path, f"expected MLflow metric lines '<timestamp ms> <value> <step>', "
                                       f"found line {n} with {len(parts)} field{'s' * (len(parts) != 1)}: "
                                       f"{line.strip()[:80]!r}") from None
        steps.append(step)
        values.append(value)
        walls.append(ts / 1000.0)
    return steps, values, walls


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    run_dir = path.parent
    meta = _read_yaml(path)
    if meta is None:
        raise LogFormatError(path, "expected an MLflow run's meta.yaml (run_id, experiment_id, ...), found "
                                   "a file that is not a YAML mapping")
    params = {k: _text(p).strip() for k, p in key_files(run_dir / "params").items()}
    tags = {k: _text(p).strip() for k, p in key_files(run_dir / "tags").items()}
    exp = _read_yaml(run_dir.parent / "meta.yaml") if (run_dir.parent / "meta.yaml").is_file() else None
    steps, metrics, values, walls = [], [], [], []
    for key, file in key_files(run_dir / "metrics").items():
        s, v, w = metric_lines(file)
        steps += s
        values += v
        walls += w
        metrics += [normalise_metric(key)] * len(s)
    run_id = str(meta.get("run_id") or meta.get("run_uuid") or run_dir.name)
    name = next((str(x) for x in (tags.get("mlflow.runName"), meta.get("run_name"), meta.get("name"))
                 if x), run_id)
    pts = points_frame(steps, metrics, values, walls) if steps else empty_points()
    config = {"mlflow_run_id": run_id, "mlflow_lifecycle_stage": meta.get("lifecycle_stage"),
              "mlflow_params": params,
              "mlflow_tags": {k: v for k, v in tags.items() if not k.startswith("mlflow.")}}
    stated = {}
    if exp and exp.get("name"):
        stated["project"] = config["project"] = str(exp["name"])
    return Parsed([RunData(name=name, points=pts, config=config, meta=stated)])
