"""Training logs into DuckDB: one reader per format, detection, run metadata.

Public interface (used by ``loaders.ingest`` and the CLI):

* ``detect_log(path) -> str | None``: the reader name for a training log
  (a run folder counts: a Lightning ``version_N/``, a W&B run folder, an
  MLflow run folder), else None. Reads at most 64 KB.
* ``ingest_log(store, path, *, format=None) -> list[FileReport]``: parse and
  store one file in one transaction; re-ingesting an unchanged file adds
  nothing, a grown text log appends only its new points.
* ``list_runs(store) -> list[dict]``: runs with metadata, overrides applied.
* ``set_run_metadata(store, run_id, **fields) -> dict``: a user correction.
* ``READERS``: every reader module by name, in detection order (``.HELP``
  says what it reads); the readers are the modules of ``loaders.logs.readers``,
  whose docstring gives their protocol.
"""
from __future__ import annotations

import importlib

#: Each public name and the module that defines it. They are imported at first use (PEP 562):
#: ``loaders.logs.runs`` (a run's corrections, read by every ingest's parent process) must not
#: bring in the readers and pandas (0.36 s of a command's start).
_HOME = {"ingest_log": "loaders.logs.ingest",
         "detect_log": "loaders.logs.registry", "READERS": "loaders.logs.registry",
         "CHECKPOINT_LOG_FORMATS": "loaders.logs.registry",
         "list_runs": "loaders.logs.runs", "set_run_metadata": "loaders.logs.runs",
         "COLUMN_FIELDS": "loaders.logs.runs"}

__all__ = list(_HOME)


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
