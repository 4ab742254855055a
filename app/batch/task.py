"""The body of every batch task (``run_task``): one checkpoint, or one layer group of it, to Parquet.

A task has its checkpoint at the stored path read and analysed as a single ``analyze`` has it:
by ``app.jobs.compute_jobs`` (job ``analyze`` of ``app.sandbox_jobs``) in a reading child under
``QKVSCOPE_PARSE_MEMORY_MB`` and ``QKVSCOPE_ANALYSIS_TIMEOUT_S``, borrowed from
``loaders.sandbox.POOL`` (one per worker process, reused by its next task). It computes the
weight metrics (and, when asked, the activation metrics) and writes, per kind::

    part.parquet   checkpoint_sha256, path, layer, head, metric, value, chance, n_tokens,
                   ci_low, ci_high, chance_low, chance_high, above_chance, degenerate
                                                                          (one row per value)
    job.parquet    checkpoint_sha256, path, kind, metric_version, notes (JSON), seconds,
                   device, host, sample (JSON), tied (JSON)               (written last)

``sample`` and ``tied`` are what a single ``analyze`` stores beside its rows (the
activation sample; the ties read from the tensors): the task computes with the same
function, so batch and single runs store the same job rows.

``job.parquet`` is the completion marker. A layer group writes
``part-L<first>-<last>.parquet`` and ``job-L<first>-<last>.parquet`` (with
``first_layer``, ``last_layer``) instead. The same function runs in-process and on
Ray workers; the device is resolved in the child, once per task, where the task
runs (a worker may have a GPU the driver lacks). A checkpoint that ends its child
(memory, time, a signal) is one ``failed`` line, never retried.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Callable

import pandas as pd

from analysis.result_rows import rows_frame
from app.batch.location import ResultsLocation
from app.batch.plan import TaskOutcome, TaskSpec
from app.batch.report import log_call
from loaders import duck
from loaders.errors import QkvscopeError, StoreError


def _result_frame(job: dict, spec: TaskSpec) -> pd.DataFrame:
    """One computed job's rows (``analysis.result_rows``) as the part.parquet columns: the head
    label dropped (derivable), ``checkpoint_sha256`` and ``path`` first, layer and head numbers int32."""
    frame = rows_frame(job["rows"]).drop(columns="head_label").astype(
        {"layer": "int32", "head": "Int32", "layer2": "Int32", "head2": "Int32", "metric": "string"})
    frame.insert(0, "path", pd.Series([spec.path] * len(frame), dtype="string"))
    frame.insert(0, "checkpoint_sha256", pd.Series([spec.sha256] * len(frame), dtype="string"))
    return frame


def _json_or_none(value) -> str | None:
    """``value`` as the JSON text a job file column holds (None stays NULL)."""
    return None if value is None else json.dumps(value, sort_keys=True)


def run_task(spec: TaskSpec, log) -> TaskOutcome:
    """Analyse one checkpoint (or one layer group of it) and write its Parquet files; the
    body of every task.

    A whole-checkpoint task writes ``part.parquet`` and, last, ``job.parquet`` per kind. A
    layer group (``spec.layers``) opens the checkpoint itself, reads only its layers, and
    writes ``part-L<first>-<last>.parquet`` and, last, ``job-L<first>-<last>.parquet``, whose
    ``notes`` leave out the undefined-value notes: the driver adds those once, over every
    group, when it joins them (``finalise_groups``).

    A ``QkvscopeError`` (unreadable checkpoint, missing file, a bomb that hit the child's
    memory or time limit, any error raised while the child computed: it is the file's
    content that decides it) is returned as a ``failed`` outcome: retrying cannot help. Anything else propagates, so Ray
    (or the in-process loop) retries it.
    """
    from app.sandbox_jobs import call   # here: only where tasks run (the driver imports app.batch without it)

    host, pid = socket.gethostname(), os.getpid()
    attempt = log_call(log, "start", spec.key, host, pid)
    out = TaskOutcome(spec.checkpoint_id, spec.sha256, "computed", attempt, host, pid)
    try:
        loc = ResultsLocation(spec.results, spec.metric_version)
        if not Path(spec.path).exists():
            raise StoreError(f"{spec.path}: checkpoint {spec.checkpoint_id} is not readable on host {host} "
                             "(workers must reach the checkpoints at their stored paths)")
        # The file is someone's: read and analysed in a child process under the memory budget and
        # QKVSCOPE_ANALYSIS_TIMEOUT_S by the function `analyze` computes with; a bomb is a FileError.
        computed = call("analyze", spec.path, pooled=True, timeout="QKVSCOPE_ANALYSIS_TIMEOUT_S",
                        kinds=list(spec.kinds), device=spec.device,
                        layers=None if spec.layers is None else list(spec.layers))
        con = duck.connect()
        try:
            loc.prepare(con)
            for job in computed:
                kind = job["kind"]
                loc.write(con, _result_frame(job, spec), loc.part(spec.sha256, kind, spec.layers))
                marker = {"checkpoint_sha256": spec.sha256, "path": spec.path, "kind": kind,
                          "metric_version": loc.metric_version, "notes": json.dumps(job["notes"], sort_keys=True),
                          "seconds": job["seconds"], "device": job["device"], "host": host,
                          "sample": _json_or_none(job.get("sample")), "tied": _json_or_none(job.get("tied"))}
                if spec.layers is not None:
                    marker |= {"first_layer": spec.layers[0], "last_layer": spec.layers[1] - 1}
                # last: the completion marker (of the checkpoint, or of this group)
                loc.write(con, pd.DataFrame([marker]), loc.job(spec.sha256, kind, spec.layers))
        finally:
            con.close()
    except QkvscopeError as exc:
        out.status, out.error = "failed", str(exc)
        log_call(log, "end", spec.key, attempt, f"failed: {exc}")
        return out
    except Exception as exc:
        log_call(log, "end", spec.key, attempt, f"{type(exc).__name__}: {exc} (retried if attempts remain)")
        raise
    log_call(log, "end", spec.key, attempt, "computed")
    return out


TaskFn = Callable[[TaskSpec, object], TaskOutcome]
