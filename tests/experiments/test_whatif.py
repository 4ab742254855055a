"""whatif on the demo's checkpoints (real runs of this project's trainer) and the real small checkpoints."""
from pathlib import Path

import pytest
import torch

from app.commands.info import tensor_ties
from experiments.activation_runs import SampleSpec
from experiments.whatif import Target, WhatIfError, layer_of, parse_layers, whatif
from loaders.checkpoints import open_checkpoint

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"
SAMPLE = SampleSpec(None, 512)


def _run(name, to, method=None, **kw):
    with open_checkpoint(str(DEMO / name / "checkpoints" / "final_step_004000.safetensors")) as ckpt:
        return whatif(ckpt, to=to, method=method, sample=SAMPLE, device="cpu", **kw)


def test_a_k_eq_v_trained_model_converted_to_k_eq_v_changes_nothing():
    r = _run("k_eq_v-mha-wd0.1", "k_eq_v")
    assert abs(r["steps"][0]["loss"] - r["baseline"]["loss"]) <= 1e-5
    assert r["steps"][0]["kv_bytes_per_token"] == r["baseline"]["kv_bytes_per_token"] == 4 * 1 * 4 * 16 * 4


@pytest.mark.parametrize("method", ["mean", "aligned"])
def test_mqa_of_an_mqa_model_changes_nothing(method):
    r = _run("qkv-mqa-wd0.1", "mqa", method)
    assert abs(r["steps"][0]["loss"] - r["baseline"]["loss"]) <= 1e-5


@pytest.mark.parametrize("name", ["qkv-mha-wd0.1", "qkv-gqa2-wd0.1"])
def test_lstsq_loses_no_more_than_keep_k_on_the_demo_qkv_models(name):
    lstsq, keep = _run(name, "k_eq_v", "lstsq"), _run(name, "k_eq_v", "keep_k")
    assert lstsq["baseline"] == keep["baseline"]
    assert lstsq["steps"][0]["loss"] < keep["steps"][0]["loss"]
    assert lstsq["steps"][0]["kv_bytes_per_token"] == lstsq["baseline"]["kv_bytes_per_token"] / 2


def test_json_contract_and_greedy_curve():
    r = _run("qkv-mha-wd0.1", "mqa", layers="greedy")
    assert list(r) == ["checkpoint", "target", "method", "sample", "baseline", "steps", "healed", "notes"]
    assert list(r["baseline"]) == ["loss", "ppl", "ci_low", "ci_high", "kv_bytes_per_token", "attention_params"]
    assert [len(s["layers"]) for s in r["steps"]] == [1, 2, 3, 4]
    assert all(a["layers"] == b["layers"][:-1] for a, b in zip(r["steps"], r["steps"][1:]))
    assert [s["kv_bytes_per_token"] for s in r["steps"]] == [2048 - 384 * k for k in (1, 2, 3, 4)]
    s = r["steps"][-1]
    assert list(s) == ["layers", "loss", "ppl", "delta_ppl_pct", "ci_low", "ci_high", "kv_bytes_per_token",
                       "attention_params"]
    assert s["ci_low"] < s["ppl"] < s["ci_high"]
    assert s["delta_ppl_pct"] == pytest.approx(100 * (s["ppl"] / r["baseline"]["ppl"] - 1))
    assert r["target"] == "mqa" and r["method"] == "mean" and r["healed"] is None


def test_saved_conversion_reads_back_as_its_variant(tmp_path):
    r = _run("qkv-gqa2-wd0.1", "k_eq_v", out=str(tmp_path / "conv"))
    saved = r["notes"]["out"]
    with open_checkpoint(saved) as ckpt:
        assert (ckpt.meta.variant, ckpt.meta.n_kv_heads) == ("k_eq_v", 2)
        assert ckpt.meta.kv_bytes_per_token == r["steps"][0]["kv_bytes_per_token"]
    assert tensor_ties(saved)["variant"] == "k_eq_v"
    again = whatif(open_checkpoint(saved), to="k_eq_v", sample=SAMPLE, device="cpu")
    assert again["baseline"]["loss"] == pytest.approx(r["steps"][0]["loss"], abs=1e-5)


def test_healing_keeps_the_tie_and_reports_the_loss():
    r = _run("qkv-mha-wd0.1", "k_eq_v", "keep_k", heal_steps=3, heal_how="lm")
    assert r["healed"]["steps"] == 3
    assert r["healed"]["loss"] < r["steps"][0]["loss"]


def test_layer_subset_and_errors():
    r = _run("qkv-mha-wd0.1", "gqa:2", layers="1,3")
    assert r["steps"][0]["layers"] == [1, 3]
    assert r["steps"][0]["kv_bytes_per_token"] == 2048 - 2 * 256
    with pytest.raises(WhatIfError, match=r"--layers 4: expected all, greedy or distinct layer numbers 0\.\.3 "
                                          r"separated by commas \(the model has 4 layers\)"):
        parse_layers("4", 4)
    with pytest.raises(WhatIfError, match="--to gqa: expected gqa:N with N a positive integer"):
        Target.parse("gqa", None)
    with pytest.raises(WhatIfError, match="--method psd: k_eq_v takes one of lstsq, keep_k, keep_v, avg"):
        Target.parse("k_eq_v", "psd")
    with pytest.raises(WhatIfError, match=r"4 kv heads cannot be pooled into 3 groups"):
        _run("qkv-mha-wd0.1", "gqa:3")


def test_layer_of_reads_the_canonical_form_of_each_variant():
    from experiments.model import GPT, GPTConfig

    for variant in ("qkv", "q_eq_k", "k_eq_v", "q_eq_k_eq_v", "wq_identity"):
        m = GPT(GPTConfig(n_layer=1, d_model=32, n_head=4, n_kv_heads=2, variant=variant, block_size=16))
        layer = layer_of(m.blocks[0].attn, 0)
        x = torch.randn(5, 32)
        k = m.blocks[0].attn._heads((getattr(m.blocks[0].attn, {"qkv": "k", "wq_identity": "k", "q_eq_k": "qk",
                                     "k_eq_v": "kv", "q_eq_k_eq_v": "qkv"}[variant]))(x[None]), 2)[0]
        assert torch.allclose(k[1], x @ layer.W_K[1], atol=1e-6)


@pytest.mark.parametrize("name", ["nanogpt-gpt-by-hand", "llama2c-train-llama2xs"])
def test_real_checkpoints_complete_with_intervals(realworld, name):
    with open_checkpoint(str(realworld / "checkpoints" / name / "ckpt.pt")) as ckpt:
        r = whatif(ckpt, to="k_eq_v", sample=SAMPLE, device="cpu")
    s = r["steps"][0]
    assert s["ci_low"] < s["ppl"] < s["ci_high"]
    assert s["kv_bytes_per_token"] == r["baseline"]["kv_bytes_per_token"] / 2


def test_rotary_models_keep_their_function_where_the_conversion_is_exact():
    """A rotary K=V GQA model to k_eq_v, and a rotary Q-K-V model to a full-rank latent, keep their losses."""
    from experiments.model import GPT, GPTConfig
    from experiments.whatif import Surgery, captured_stats, window_losses

    torch.manual_seed(0)
    windows = torch.randint(0, 256, (4, 17))
    for variant, to in (("k_eq_v", "k_eq_v"), ("qkv", "latent:32"), ("q_eq_k", "q_eq_k")):
        m = GPT(GPTConfig(n_layer=2, d_model=32, n_head=4, n_kv_heads=2, variant=variant, positions="rotary",
                          block_size=16)).eval()
        mods = [b.attn for b in m.blocks]
        surgery = Surgery(m, Target.parse(to, "keep_k" if to == "q_eq_k" else None),
                          captured_stats(m, mods, windows, "cpu"), rotary=True, variant=variant)
        before = window_losses(m, windows, "cpu")
        after = window_losses(surgery.model([0, 1]), windows, "cpu")
        assert abs(after - before).max() <= 1e-5, (variant, to)
        assert [type(b.attn) for b in m.blocks] == [type(a) for a in mods]           # the original untouched
        assert all(b.attn is a for b, a in zip(m.blocks, mods))
