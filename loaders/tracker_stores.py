"""Where experiment trackers keep a run on disk: folder layouts, by path only.

A tracker's run is a folder (or rows of a database file), not one log file.
This module knows the layouts and nothing of their contents, so that the
folder walk (``loaders.ingest.scan``, which runs without pandas or torch)
can take a run folder as one unit, and the log readers
(``loaders.logs.readers``: ``sniff_dir``) name the same file for it:

* W&B, offline or synced: ``wandb/offline-run-<date>_<time>-<id>/`` or
  ``wandb/run-<date>_<time>-<id>/`` holding ``run-<id>.wandb`` (the
  binary transaction log) and ``files/`` (``config.yaml``,
  ``wandb-summary.json``, ``wandb-metadata.json``, ``output.log``);
  the unit's file is ``run-<id>.wandb``.
* MLflow's file store: ``mlruns/<experiment id>/<run id>/`` holding
  ``meta.yaml`` and ``metrics/``, ``params/``, ``tags/`` (one file per key);
  the unit's file is the run's ``meta.yaml``.
* Aim: a repository folder ``.aim/`` (RocksDB chunks under ``meta/`` and
  ``seqs/``, run names in ``run_metadata.sqlite``), which qkvscope does not
  read: ``aim_repo`` tells the walk to report it (``aim_skip``).

The SQLite stores (MLflow's ``mlflow.db``, trackio's ``<project>.db``) are
single files, found by their content like any log.

``store_folder``: whether a folder starting with a dot holds one of these
layouts, so that the walk goes into it (it skips other dot-folders, with a
report line).
"""
from __future__ import annotations

import re
from pathlib import Path

#: ``run-20260118_175801-a5sov16l`` / ``offline-run-...``: a W&B run folder's name.
WANDB_RUN_DIR = re.compile(r"^(?:offline-)?run-\d{8}_\d{6}-(?P<id>[A-Za-z0-9]+)$")


def wandb_run_file(folder: Path) -> Path | None:
    """``run-<id>.wandb`` of a W&B run folder, else None."""
    m = WANDB_RUN_DIR.match(folder.name)
    if not m:
        return None
    f = folder / f"run-{m.group('id')}.wandb"
    return f if f.is_file() else None


def mlflow_run_meta(folder: Path) -> Path | None:
    """``meta.yaml`` of an MLflow file-store run folder (beside ``metrics/``,
    ``params/`` or ``tags/``), else None."""
    meta = folder / "meta.yaml"
    if meta.is_file() and any((folder / d).is_dir() for d in ("metrics", "params", "tags")):
        return meta
    return None


def unit_file(folder: Path) -> Path | None:
    """The file that stands for ``folder`` when the folder is one tracker run
    (W&B, MLflow file store); the walk takes it and nothing else there."""
    return wandb_run_file(folder) or mlflow_run_meta(folder)


def aim_repo(folder: Path) -> bool:
    """Whether ``folder`` is an Aim repository (``.aim`` with ``meta/`` or
    ``seqs/`` or ``run_metadata.sqlite``)."""
    return folder.name == ".aim" and any(
        (folder / p).exists() for p in ("meta", "seqs", "run_metadata.sqlite"))


def aim_skip(folder: Path) -> str:
    """Why an Aim repository is not read, and what to do (the ingest report's
    line); its runs are counted by their folders under ``meta/chunks/``."""
    chunks = folder / "meta" / "chunks"
    n = sum(1 for c in chunks.iterdir() if c.is_dir()) if chunks.is_dir() else 0
    return (f"Aim repository ({n} run{'s' * (n != 1)}): its metrics are in RocksDB, which qkvscope "
            f"does not open; export them to CSV (the Aim UI's table export, or "
            f"aim.Repo(path).query_metrics(...).dataframe()) and ingest that file")


#: MLflow's file store moves deleted runs to ``mlruns/.trash/``: not read.
MLFLOW_TRASH = "MLflow's .trash folder: runs deleted in MLflow, not read"


def store_folder(folder: Path) -> bool:
    """Whether a dot-folder holds a tracker's store: it is an Aim repository,
    or it or a child of it is a ``wandb``/``mlruns`` folder, a W&B run folder,
    an MLflow experiment (``meta.yaml`` beside run folders) or holds
    ``mlflow.db``."""
    if aim_repo(folder) or (folder / "mlflow.db").is_file():
        return True
    try:
        children = [c for c in folder.iterdir() if c.is_dir() and not c.is_symlink()]
    except OSError:
        return False
    for c in children:
        if c.name in ("wandb", "mlruns", "trackio") or unit_file(c) or aim_repo(c):
            return True
        if (c / "meta.yaml").is_file() and any(unit_file(r) for r in c.iterdir() if r.is_dir()):
            return True
    return False
