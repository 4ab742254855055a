"""Running one measurement in a fresh process, as the benchmarks do (each phase starts cold,
its peak memory its own).

``run`` returns the child's stdout; a child that fails ends the benchmark with a
``SystemExit`` that names it and carries the end of its stderr (its traceback: on a GPU
machine a bare "returned non-zero exit status 1" said nothing). ``outlive_abort`` lets a
benchmark's parent outlast a SIGABRT: ``scripts/gpu_check.sh`` stops a step past its limit
with SIGABRT to the whole process group, so that every Python process in it prints its
threads' stacks (``PYTHONFAULTHANDLER``); the parent, which holds the child's stderr in a
pipe, must live on to print the child's.
"""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path


def run(cmd: list[str], *, cwd: str | Path | None = None) -> str:
    """``cmd``'s stdout; a SystemExit with the end of its stderr when it exits non-zero."""
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(Path(c).name if i < 2 else c for i, c in enumerate(cmd[:6]))} ... "
                         f"exited {proc.returncode}:\n{_ends(proc.stderr)}")
    return proc.stdout


def _ends(err: str, head: int = 3000, tail: int = 3000) -> str:
    """The start and the end of a long stderr: a traceback's last lines say what failed, a
    faulthandler dump's first lines where the thread stood (it prints the innermost frame first)."""
    if len(err) <= head + tail:
        return err
    return f"{err[:head]}\n[... {len(err) - head - tail:,} characters ...]\n{err[-tail:]}"


def outlive_abort() -> None:
    """Note a SIGABRT instead of dying of it (faulthandler's own dump of this process is lost:
    it waits for a child, whose stack is the one that says where the time went)."""
    def note(signum, frame):
        print("SIGABRT: waiting for the child to print its stacks and exit", file=sys.stderr, flush=True)
    signal.signal(signal.SIGABRT, note)
