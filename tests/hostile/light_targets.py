"""``parse_targets``' jobs in a child that imports nothing before its first request
(``PRELOAD = ()``), for the tests of the sandbox's machinery: its table, its pool, the thread that
starts a child, the time limit, a child dying with its parent. What the child preloads is not
what those tests check, and the readers' imports (torch, duckdb) cost 2-3 CPU seconds a child.
The memory tests keep ``parse_targets``: their budget sits on top of what the child holds
after those imports."""
from __future__ import annotations

import sys

from loaders import sandbox
from tests.hostile import parse_targets

JOBS = parse_targets.JOBS           # the same table: each name runs parse_targets' function
PRELOAD: tuple[str, ...] = ()
ON_DEMAND = sandbox.ON_DEMAND


def call(job: str, path, **kwargs):
    """``loaders.sandbox.call`` of a job of this table."""
    return sandbox.call(job, path, entry=sys.modules[__name__], **kwargs)


if __name__ == "__main__":
    sys.exit(sandbox.serve(JOBS, PRELOAD, ON_DEMAND))
