"""Jobs that ``tests/hostile/test_sandbox.py`` runs in the sandbox (``loaders.sandbox``): each
does what a bomb nobody thought of, or a file changing under a reader, does. This module is a
sandbox entry like ``app.sandbox_jobs``: ``JOBS`` is its table, ``call(NAME, path)`` runs one."""
from __future__ import annotations

import os
import sys
import time

from loaders import sandbox


def grow(path: str) -> int:
    """Allocate 256 MiB blocks and touch them until an allocation fails."""
    blocks = []
    while True:
        b = bytearray(256 << 20)
        b[::4096] = b"\x01" * len(b[::4096])          # touch every page: resident, not just reserved
        blocks.append(b)


def stall(path: str) -> None:
    """Never answer (a parser stuck in a loop)."""
    while True:
        time.sleep(0.1)


def read_while_truncated(path: str) -> float:
    """Memory-map a .pt (as ``TorchSource`` does), have it truncated by "a
    training run rewriting it", then read the tensor: the pages are gone (SIGBUS)."""
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    os.truncate(path, 0)
    return float(state["w"].sum())


def pid(path: str) -> int:
    return os.getpid()


def allocate(path: str, mib: int = 128) -> int:
    """Allocate and touch ``mib`` MiB (well under the budget, far over it with the child's imports)."""
    b = bytearray(mib << 20)
    b[::4096] = b"\x01" * len(b[::4096])
    return len(b)


def glibc_gives_up(path: str) -> None:
    """Exit as glibc does when it cannot map a new thread's TLS or a library under a memory limit
    ("cannot allocate memory for thread-local data: ABORT", ``_exit(127)``)."""
    os.write(2, b"cannot allocate memory for thread-local data: ABORT\n")
    os._exit(127)


def killed(path: str) -> None:
    """Append a line to ``path`` (one per run of this job), then be killed as the kernel's
    out-of-memory killer kills a reader (SIGKILL)."""
    with open(path, "a") as f:
        f.write("ran\n")
    os.kill(os.getpid(), 9)


def loaded(path: str, module: str) -> bool:
    """Whether ``module`` is imported in this child."""
    return module in sys.modules


JOBS = {**sandbox.JOBS, **{name: (__spec__.name if __name__ == "__main__" else __name__, name)
                           for name in ("grow", "stall", "read_while_truncated", "pid", "allocate",
                                        "glibc_gives_up", "killed", "loaded")}}
#: The readers a checkpoint's request brings in too (torch): what these children hold when a
#: memory budget is set is what a checkpoint reader holds.
PRELOAD = (*sandbox.PRELOAD, *sandbox.ON_DEMAND)
ON_DEMAND = sandbox.ON_DEMAND


def call(job: str, path, **kwargs):
    """``loaders.sandbox.call`` of a job of this table."""
    return sandbox.call(job, path, entry=sys.modules[__name__], **kwargs)


if __name__ == "__main__":
    sys.exit(sandbox.serve(JOBS, PRELOAD, ON_DEMAND))
