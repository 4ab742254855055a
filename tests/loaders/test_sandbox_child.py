"""What a reading child (``loaders.sandbox.Sandbox``) starts with: its environment, read from
``/proc`` of the real child process."""
from __future__ import annotations

from pathlib import Path

import pytest

from loaders.sandbox import Sandbox


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
@pytest.mark.parametrize("given, used", [(None, "system"), ("jemalloc", "jemalloc")])
def test_the_child_uses_the_system_arrow_pool_unless_told(monkeypatch, given, used):
    """pyarrow's default pool (mimalloc) reserves a 1 GiB arena at its first use. The child's data
    limit is what it holds plus the file's budget, so that arena, reserved by the first analysis
    in a child (pandas' string columns), would fail a small checkpoint under a 1 GiB budget
    (``tests/app/test_batch.py``'s bomb among good checkpoints, run alone). The child asks for
    glibc's malloc, as the server does, unless its environment names a pool."""
    if given is None:
        monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    else:
        monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", given)
    with Sandbox() as box:
        box._start()
        assert _environ(box._proc.pid)["ARROW_DEFAULT_MEMORY_POOL"] == used
