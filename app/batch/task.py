"""The body of every batch task (``run_task``): one checkpoint, or one layer group of it, to Parquet.

A task opens its checkpoint at the stored path (streaming one layer at a time, as
``app.jobs.weight_frame`` does), computes the weight metrics (and, when asked, the
activation metrics) and writes, per kind::

    part.parquet   checkpoint_sha256, path, layer, head, metric, value, chance, n_tokens,
                   ci_low, ci_high                                        (one row per value)
    job.parquet    checkpoint_sha256, path, kind, metric_version, notes (JSON), seconds,
                   device, host                                           (written last)

``job.parquet`` is the completion marker. A layer group writes
``part-L<first>-<last>.parquet`` and ``job-L<first>-<last>.parquet`` (with
``first_layer``, ``last_layer``) instead. The same function runs in-process and on
Ray workers; the device is resolved here, once per task, where the task starts
(a worker may have a GPU the driver lacks).
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Callable

import duckdb
import pandas as pd

from app.batch.errors import BatchError
from app.batch.location import ResultsLocation
from app.batch.plan import TaskOutcome, TaskSpec
from app.batch.report import log_call
from loaders.errors import QkvscopeError, StoreError


def _result_frame(frame: pd.DataFrame, spec: TaskSpec) -> pd.DataFrame:
    """The tidy metric frame as the part.parquet columns (head label dropped: derivable)."""
    return pd.DataFrame({
        "checkpoint_sha256": pd.Series([spec.sha256] * len(frame), dtype="string"),
        "path": pd.Series([spec.path] * len(frame), dtype="string"),
        "layer": frame["layer"].astype("int32").to_numpy(),
        "head": frame["head"].astype("Int32").to_numpy(),
        "metric": frame["metric"].astype("string").to_numpy(),
        "value": frame["value"].astype("float64").to_numpy(),
        **{c: pd.to_numeric(frame[c] if c in frame.columns else pd.Series([None] * len(frame)), errors="coerce")
           .astype("Int64" if c == "n_tokens" else "float64").to_numpy()
           for c in ("chance", "n_tokens", "ci_low", "ci_high")},
    })


def run_task(spec: TaskSpec, log) -> TaskOutcome:
    """Analyse one checkpoint (or one layer group of it) and write its Parquet files; the
    body of every task.

    A whole-checkpoint task writes ``part.parquet`` and, last, ``job.parquet`` per kind. A
    layer group (``spec.layers``) opens the checkpoint itself, reads only its layers, and
    writes ``part-L<first>-<last>.parquet`` and, last, ``job-L<first>-<last>.parquet``, whose
    ``notes`` leave out the undefined-value notes: the driver adds those once, over every
    group, when it joins them (``finalise_groups``).

    A ``QkvscopeError`` (unreadable checkpoint, missing file) is returned as a
    ``failed`` outcome: retrying cannot help. Anything else propagates, so Ray
    (or the in-process loop) retries it.
    """
    # here: these import torch; the driver imports app.batch without it (and a worker needs them anyway)
    from app.jobs import activation_frame, weight_frame
    from analysis.weights import default_device
    from loaders.checkpoints import open_checkpoint

    host, pid = socket.gethostname(), os.getpid()
    attempt = log_call(log, "start", spec.key, host, pid)
    out = TaskOutcome(spec.checkpoint_id, spec.sha256, "computed", attempt, host, pid)
    try:
        loc = ResultsLocation(spec.results, spec.metric_version)
        if not Path(spec.path).exists():
            raise StoreError(f"{spec.path}: checkpoint {spec.checkpoint_id} is not readable on host {host} "
                             "(workers must reach the checkpoints at their stored paths)")
        dev = spec.device or default_device()        # once, for every kind of this task
        con = duckdb.connect()
        try:
            loc.prepare(con)
            with open_checkpoint(spec.path) as ckpt:
                n_layers = ckpt.meta.n_layers
                if spec.layers is not None and not 0 <= spec.layers[0] < spec.layers[1] <= n_layers:
                    raise BatchError(f"{spec.path}: {spec.label} of checkpoint {spec.checkpoint_id} do not "
                                     f"exist: the file has {n_layers} layers (it changed since it was "
                                     "ingested; ingest it again)")
                for kind in spec.kinds:
                    t_kind = time.perf_counter()
                    if spec.layers is not None:
                        frame, notes = weight_frame(ckpt, device=dev, layers=range(*spec.layers),
                                                    nonfinite_notes=False)
                    else:
                        fn = weight_frame if kind == "weights" else activation_frame
                        frame, notes = fn(ckpt, device=dev)
                    seconds = time.perf_counter() - t_kind
                    loc.write(con, _result_frame(frame, spec), loc.part(spec.sha256, kind, spec.layers))
                    job = {"checkpoint_sha256": spec.sha256, "path": spec.path, "kind": kind,
                           "metric_version": loc.metric_version, "notes": json.dumps(notes, sort_keys=True),
                           "seconds": seconds, "device": str(dev), "host": host}
                    if spec.layers is not None:
                        job |= {"first_layer": spec.layers[0], "last_layer": spec.layers[1] - 1}
                    # last: the completion marker (of the checkpoint, or of this group)
                    loc.write(con, pd.DataFrame([job]), loc.job(spec.sha256, kind, spec.layers))
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
