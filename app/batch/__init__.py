"""Batch analysis: many checkpoints, in-process or on a Ray cluster, results as Parquet.

``run_batch(store, checkpoint_ids, results=..., ray_address=None)`` analyses
every checkpoint with ONE task per checkpoint, or, for a checkpoint whose
attention weights exceed ``max_task_bytes``, one task per layer group. Each task
writes its rows and, last, its completion marker as Parquet under ``results``::

    <results>/checkpoint=<sha256>/metric_version=<v>/kind=<weights|activations>/part.parquet
    <results>/checkpoint=<sha256>/metric_version=<v>/kind=<...>/job.parquet

A re-run skips a checkpoint whose ``job.parquet`` exists for every requested kind at
the current ``analysis.registry.METRIC_VERSION`` (read once, when the batch starts).
The driver (this process, the only DuckDB writer) then registers each result: DuckDB
reads the Parquet directly into ``analysis_results`` / ``analysis_jobs`` (so
``analyze ID``, the dashboard and SQL see them) and records the file locations in
``analysis_result_files``.

The package, in the order a batch uses it:

* ``plan``: inputs (``expand_targets``), sizes (``parse_size``), layer groups
  (``layer_groups``), the tasks (``TaskSpec``, ``plan_tasks``);
* ``location``: ``ResultsLocation``, the folder or ``s3://`` URL and its file names;
* ``task``: ``run_task``, the body of every task;
* ``executors``: in this process or on Ray (``connect_ray``), retries;
* ``run``: ``BatchRun``, the driver's state while tasks end;
* ``register``: layer groups joined (``finalise_groups``) and results read into the store;
* ``report``: ``AttemptLog``, ``CheckpointReport``, ``BatchReport`` (``analyze --json``);
* ``errors``: ``BatchError``.

Every SQL statement is in ``loaders.batch_results``. This module re-exports the names
``app.commands.analyze`` and the tests use.
"""
from __future__ import annotations

from pathlib import Path

from analysis.registry import METRIC_VERSION
from app.batch.errors import BatchError
from app.batch.executors import connect_ray, run_in_process, run_on_ray
from app.batch.location import ResultsLocation
from app.batch.plan import (DEFAULT_MAX_TASK_BYTES, TaskSpec, attention_bytes, expand_targets, is_glob,
                            layer_groups, parse_size, plan_tasks)
from app.batch.register import register
from app.batch.report import BatchReport, Notify
from app.batch.run import BatchRun
from app.batch.task import TaskFn, run_task
from loaders import duck
from loaders.batch_results import stored_checkpoints
from loaders.store import Store

__all__ = ["METRIC_VERSION", "BatchError", "connect_ray", "ResultsLocation", "DEFAULT_MAX_TASK_BYTES", "TaskSpec",
           "attention_bytes", "expand_targets", "is_glob", "layer_groups", "parse_size", "register", "run_task",
           "run_batch"]


def run_batch(store: Store, checkpoint_ids: list[int], *, results: str | Path,
              activations: bool = False, device: str | None = None, force: bool = False,
              ray_address: str | None = None, gpus_per_task: float | None = None, retries: int = 2,
              max_task_bytes: int | None = DEFAULT_MAX_TASK_BYTES,
              input_errors: list[dict] | None = None, notify: Notify | None = None,
              task_fn: TaskFn = run_task, quiet_workers: bool = False) -> BatchReport:
    """Analyse ``checkpoint_ids`` into Parquet under ``results`` and register them in ``store``.

    ``ray_address`` None runs in-process; otherwise see ``app.batch.executors``.
    ``gpus_per_task`` None asks for 1 GPU per task when the cluster has any, else 0.
    ``max_task_bytes``: a checkpoint with more attention weights than this computes its
    weight metrics in layer groups, one task each (None: never split).
    ``device`` None: each task uses its worker's default device (resolved once per task).
    ``task_fn`` replaces ``run_task`` (tests inject worker crashes).
    """
    if retries < 0:
        raise BatchError(f"--retries: expected a count >= 0, found {retries}")
    if max_task_bytes is not None and max_task_bytes < 1:
        raise BatchError(f"--max-task-bytes: expected a size of at least 1 byte, found {max_task_bytes}")
    loc = ResultsLocation(results, METRIC_VERSION)      # the metric version of the whole batch, read once
    if not loc.remote and Path(loc.root).exists() and not Path(loc.root).is_dir():
        raise BatchError(f"{loc.root}: expected a folder for the results, found a file")
    kinds = ["weights"] + (["activations"] if activations else [])
    rows = stored_checkpoints(store, checkpoint_ids)
    con = duck.connect()                       # the driver's reads and writes of result files
    try:
        if loc.remote:
            loc.prepare(con)
        plan = plan_tasks(rows, kinds, loc, con, force=force, device=device, max_task_bytes=max_task_bytes)
        run = BatchRun(store, loc, con, plan, total=len(rows), notify=notify)
        run.register_done()
        if ray_address is None:
            executor = "in-process"
            run_in_process(plan.specs, run.task_ended, retries=retries, task_fn=task_fn)
        else:
            executor = f"ray {ray_address}"
            if plan.specs:
                run_on_ray(plan.specs, run.task_ended, ray_address=ray_address, gpus_per_task=gpus_per_task,
                           retries=retries, task_fn=task_fn, quiet_workers=quiet_workers)
    finally:
        con.close()
    ordered = [plan.reports[i] for i in checkpoint_ids if i in plan.reports]
    return BatchReport(loc.root, loc.metric_version, executor, ordered, list(input_errors or []))
