"""``bench/analysis_scaling.py`` and ``bench/_shapes.py``: the exponent fit, the folders
the benchmarks write, and one tiny scaling run that reports its rows (no timing is asserted)."""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"qkvscope_bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod                         # dataclasses look their module up here
    spec.loader.exec_module(mod)
    return mod


S = _load("analysis_scaling")
SHAPES = _load("_shapes")


def test_exponent_is_the_log_log_slope():
    assert S.exponent([1, 2, 4], [3, 24, 192]) == pytest.approx(3.0)
    assert S.exponent([1024, 2048, 4096], [0.5, 2.0, 8.0]) == pytest.approx(2.0)
    assert math.isnan(S.exponent([1, 2], [0.0, 1.0]))


def test_shapes_write_a_sharded_attention_only_llama_folder(tmp_path):
    from loaders.checkpoints import open_checkpoint

    shape = SHAPES.Shape("t", 3, 64, 4, 2, 16, shards=2)
    SHAPES.build(tmp_path, shape)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == ["model-00001-of-00002.safetensors",
                                                         "model-00002-of-00002.safetensors"]
    assert index["metadata"]["total_size"] == shape.attention_bytes() == 2 * 3 * (2 * 64 * 64 + 2 * 32 * 64)
    with open_checkpoint(tmp_path) as ck:
        assert (ck.meta.n_layers, ck.meta.d_model, ck.meta.n_heads, ck.meta.n_kv_heads, ck.meta.d_head) == \
            (3, 64, 4, 2, 16)
        assert tuple(ck.layer(2).W_K.shape) == (2, 64, 16)


@pytest.mark.slow
def test_a_tiny_scaling_run_reports_every_phase(tmp_path, capsys):
    got = S.run(1, [128, 256, 512], 1, 1, tmp_path)          # GQA at 256: 2 heads, 1 kv head
    assert sorted(got["mha"]) == [128, 256, 512]
    assert set(got["exponents"]) == set(S.PHASES)
    rows = [json.loads(line[len("BENCH_ROW "):]) for line in capsys.readouterr().out.splitlines()
            if line.startswith("BENCH_ROW ")]
    assert [r["measured"].split("'")[1] for r in rows[:-1]] == list(S.PHASES)
    assert all(r["result"] in ("pass", "FAIL", "-") for r in rows)
    assert rows[-1]["measured"].startswith("GQA-2 against MHA at d_model 256")
