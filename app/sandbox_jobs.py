"""The jobs ``app`` runs in the sandbox (``loaders.sandbox``), as a fixed table.

Each entry names a job and the function it calls, as literals: the child
started for ``app`` (``python -m app.sandbox_jobs``) looks a requested name up
here and imports nothing else; a name not in the table is refused. This
module imports nothing heavy: the server imports it to name its jobs, the
functions load in the child only.

========================  ===========================================  =======================================
job                       function                                     what it does
========================  ===========================================  =======================================
``classify``, ``ingest``, ``loaders.sandbox``                          the loaders' own jobs
``ingest_checkpoint``
``analyze``               ``app.jobs.compute_jobs``                    weight and activation metrics of a file
                                                                       (a batch task's too, a layer group's)
``info``                  ``app.commands.info.describe``               what ``info`` prints
``whatif``                ``app.commands.whatif.compute``              the what-if conversion and its loss
``spectra``               ``app.inspect_child.spectra``                one layer's singular values (Inspector)
``head_groupings``        ``app.inspect_child.head_groupings``         one layer's kv head groupings (Inspector)
``ties``                  ``app.jobs.read_ties``                       which projections are tied, per layer
``attention``             ``app.inspect_child.attention``              attention maps, written as ``.npy``
========================  ===========================================  =======================================

``call(job, path, **kwargs)`` runs one of them (``loaders.sandbox.call`` with this table).
"""
from __future__ import annotations

import sys
from pathlib import Path

from loaders import sandbox

JOBS: dict[str, tuple[str, str]] = {
    **sandbox.JOBS,
    "analyze": ("app.jobs", "compute_jobs"),
    "info": ("app.commands.info", "describe"),
    "whatif": ("app.commands.whatif", "compute"),
    "spectra": ("app.inspect_child", "spectra"),
    "head_groupings": ("app.inspect_child", "head_groupings"),
    "ties": ("app.jobs", "read_ties"),
    "attention": ("app.inspect_child", "attention"),
}
#: What the child imports before its first request: its jobs read checkpoints, never logs (a log's
#: ingest runs in the child of ``loaders.sandbox``'s own table, which preloads the log readers).
PRELOAD: tuple[str, ...] = (*sandbox.ON_DEMAND, "loaders.ingest")
#: Already preloaded: a request of ``loaders.sandbox``'s jobs may still name them.
ON_DEMAND = sandbox.ON_DEMAND


def call(job: str, path: str | Path, *, timeout: str = "QKVSCOPE_PARSE_TIMEOUT_S", pooled: bool = False, **kwargs):
    """``loaders.sandbox.call`` of a job of this table."""
    return sandbox.call(job, path, entry=sys.modules[__name__], timeout=timeout, pooled=pooled, **kwargs)


def pooled():
    """``with pooled() as box:`` an idle child of this table lent by ``loaders.sandbox.POOL``: a
    caller that ingests and then analyses (``analyze PATH``) does both in one child."""
    return sandbox.POOL.reader(sys.modules[__name__])


if __name__ == "__main__":
    sys.exit(sandbox.serve(JOBS, PRELOAD, ON_DEMAND))
