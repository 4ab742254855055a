"""``scripts/gpu_compare.py``: CPU against another device, metric by metric.
(On CUDA it runs in ``scripts/gpu_check.sh``; here both sides are the CPU.)"""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_compare.py"
CKPT = ROOT / "data" / "demo" / "k_eq_v-gqa2-wd0.1" / "checkpoints" / "final_step_004000.safetensors"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_compare", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow                        # every metric of a checkpoint, twice: seconds, not a unit test
def test_same_device_agrees(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["gpu_compare.py", "--device", "cpu", "--tokens", "256", str(CKPT)])
    code = _module().main()
    out = capsys.readouterr().out
    assert code == 0, out
    total = re.search(r": (\d+) values\n", out)
    assert total and f"all {total.group(1)} values agree (rtol 0.002, atol 0.0001)" in out
    assert "logit    max |diff| 0.00e+00" in out          # activation metrics are compared too


def test_a_difference_or_a_missing_value_fails(monkeypatch, capsys):
    mod = _module()
    index = pd.MultiIndex.from_tuples([(0, "L0H0", "qk_symmetry"), (0, "L0H1", "qk_symmetry"),
                                       (0, "L0", "wq_condition")], names=["layer", "head_label", "metric"])
    ref = pd.Series([0.5, 0.7, 120.0], index=index)

    def frames(path, device, tokens):
        if device == "cpu":
            return ref, {}
        return pd.Series([0.5, 0.71, float("nan")], index=index), {}
    monkeypatch.setattr(mod, "frames", frames)
    monkeypatch.setattr(sys, "argv", ["gpu_compare.py", "--device", "other", str(CKPT)])
    assert mod.main() == 1
    out = capsys.readouterr().out
    assert "FAIL layer 0 L0H1 qk_symmetry: cpu 0.7, other 0.71" in out
    assert "FAIL layer 0 L0 wq_condition: cpu 120, other nan" in out
    assert "L0H0" not in out
