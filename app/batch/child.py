"""A batch task's metrics, computed in the reading child process (``compute``), and back (``frame_of``).

Every batch task (in-process or on a Ray worker) computes its checkpoint's
metrics the way a single ``analyze`` does: in a child of
``loaders.sandbox`` (``call(..., timeout="QKVSCOPE_ANALYSIS_TIMEOUT_S")``)
under the memory limit ``QKVSCOPE_PARSE_MEMORY_MB`` (plus the file's
size, on top of what the child holds after its imports) and the time limit
``QKVSCOPE_ANALYSIS_TIMEOUT_S``. A bomb among good checkpoints ends that
child with one line ``PATH: what`` (a ``FileError``), which fails that
task without retries; the worker and the other tasks go on. The task
borrows a child from ``loaders.sandbox.POOL`` (one per worker process, reused by
its next task: a child's start costs 2-3 s of imports).

Rows come back as JSON lists in ``RESULT_COLUMNS`` order (``None`` for a
missing value; ``analysis.result_rows``); ``frame_of`` makes the frame the task writes to Parquet.
"""
from __future__ import annotations

import pandas as pd

from analysis.result_rows import json_rows, rows_frame


def compute(path: str, *, kinds: list[str], device: str | None, layers: list[int] | None = None) -> dict:
    """Run in the child: the metrics of ``kinds`` of the checkpoint at ``path``, computed by
    ``app.jobs._compute``, the one function a single ``analyze`` computes with (so a batch
    stores the same job rows: notes, sample, ties).

    ``layers`` ``[first, stop)``: the weight metrics of those layers only (a layer group,
    without the undefined-value notes: the driver adds those once over every group).
    Returns ``{"n_layers", "device", "jobs": [{"kind", "rows", "notes", "seconds", "sample",
    "tied"}]}``; ``jobs`` is empty when ``layers`` is not inside the file's ``n_layers``
    (the caller says so). ``device`` None: cuda when available, else cpu (resolved here,
    where the task runs).
    """
    # here: runs in the reading child; torch loads there, not in the task's parent
    from analysis.weights import default_device
    from app.jobs import _compute
    from experiments.sample_text import SampleSpec
    from loaders.checkpoints import open_checkpoint

    dev = device or default_device()
    out = {"device": str(dev), "jobs": []}
    with open_checkpoint(path) as ckpt:
        out["n_layers"] = n_layers = ckpt.meta.n_layers
        if layers is not None and not 0 <= layers[0] < layers[1] <= n_layers:
            return out
        out["jobs"] = _compute(ckpt, list(kinds), dev, SampleSpec(),
                               layers=None if layers is None else (layers[0], layers[1]))
    return out


def frame_of(job: dict) -> pd.DataFrame:
    """The metric frame (``RESULT_COLUMNS``, the stored dtypes) of one of ``compute``'s jobs."""
    return rows_frame(job["rows"])
