"""Sweep runner: a killed sweep leaves no training process behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

DRIVER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from experiments.model import GPTConfig
    from experiments.sweep import grid, run_sweep
    from experiments.train import TrainConfig

    if __name__ == "__main__":      # the pool's spawned workers import this file again
        mc = GPTConfig(n_layer=1, d_model=16, n_head=2, block_size=16)
        tc = TrainConfig(steps=100_000, batch_size=2, eval_interval=100_000, log_interval=1_000,
                         corpus_max_bytes=300_000, threads=1)
        run_sweep(grid(["qkv", "k_eq_v", "q_eq_k"], [0.0], model=mc, training=tc), {out!r}, jobs=2)
""")


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkilled_sweep_takes_its_workers_with_it(tmp_path):
    """SIGKILL the sweep process while two runs train: its pool workers, which would
    otherwise go on training (and pick up queued runs) into folders a restarted
    sweep also writes, exit within seconds."""
    out = tmp_path / "sweep"
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(root=str(ROOT), out=str(out)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(list(out.glob("*/config.json"))) < 2:
            time.sleep(0.2)
        assert len(list(out.glob("*/config.json"))) >= 2, "the sweep never started two runs"
        workers = [p for p in _children(proc.pid) if "spawn_main" in
                   Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
        assert len(workers) == 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(p) for p in workers):
            time.sleep(0.2)
        assert not any(_alive(p) for p in workers), "pool workers outlived the killed sweep"
        assert not (out / "q_eq_k-mha-wd0").exists(), "a queued run started after the sweep died"
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in workers:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
