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

from loaders.logs.ingest import ingest_log
from loaders.logs.registry import CHECKPOINT_LOG_FORMATS, READERS, detect_log
from loaders.logs.runs import COLUMN_FIELDS, list_runs, set_run_metadata

__all__ = ["detect_log", "ingest_log", "list_runs", "set_run_metadata", "READERS",
           "CHECKPOINT_LOG_FORMATS", "COLUMN_FIELDS"]
