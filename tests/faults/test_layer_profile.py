"""``scripts/layer_profile.py``: one layer's weight metrics op by op (on CUDA it runs in
``scripts/gpu_check.sh`` with both placements of the small decompositions; here the CPU)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_one_layer_is_read_from_a_written_folder_and_profiled():
    proc = subprocess.run([sys.executable, "scripts/layer_profile.py", "--shape", "tiny", "--repeat", "1",
                           "--rows", "5"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert out.startswith("one tiny-shaped layer (d_model 256, 4 heads, 2 kv heads, d_head 64) on cpu, torch ")
    # the profiler's table (its top ops by self CPU time vary with the machine's load)
    assert re.search(r"^\s+aten::\w+ ", out, re.M) and "Self CPU time total" in out
    assert re.search(r"weight_metrics of the layer: median \d+\.\d{4} s of 1\n", out)
    assert "on the GPU" not in out                                  # one placement on the CPU
