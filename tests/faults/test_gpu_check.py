"""scripts/gpu_check.sh: its steps fit the device tool's 600 s for one call, each under its own limit."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = (ROOT / "scripts" / "gpu_check.sh").read_text()


def _limits(text: str) -> dict[str, int]:
    return {name: int(limit) for name, limit in re.findall(r"^\s*step (\w+) (\d+) \S+\.txt", text, re.M)}


def test_the_steps_on_a_gpu_machine_fit_one_600_s_call():
    cuda_branch = SCRIPT[:SCRIPT.index("\nelse\n")]                  # the steps that run where CUDA is
    limits = _limits(cuda_branch)
    assert set(limits) == {"tests", "compare", "eig", "7b", "cpu", "1b", "forward", "scaling"}
    assert sum(limits.values()) <= 600, limits
    default = re.search(r'STEPS=\$\{STEPS:-"([^"]+)"\}', SCRIPT).group(1).split()
    assert default == list(limits), "the default STEPS run every step, in the order they appear"

