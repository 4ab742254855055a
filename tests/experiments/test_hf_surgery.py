"""whatif on tiny Hugging Face causal LMs built with transformers: GPT-2 (Conv1D, biases) and Llama (GQA, rotary)."""
import pytest
import torch

from experiments import hf_surgery
from experiments.activation_runs import SampleSpec
from experiments.whatif import WhatIfError, whatif
from loaders.checkpoints import open_checkpoint

SAMPLE = SampleSpec(None, 256)


def _gpt2(folder, kv_equal=False):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=256, n_positions=64))
    if kv_equal:
        with torch.no_grad():
            for block in m.transformer.h:
                block.attn.c_attn.weight[:, 64:] = block.attn.c_attn.weight[:, 32:64]
                block.attn.c_attn.bias[64:] = block.attn.c_attn.bias[32:64]
    m.save_pretrained(folder)
    return str(folder)


def _llama(folder, kv_equal=False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                     hidden_size=32, intermediate_size=64, vocab_size=256,
                                     max_position_embeddings=64))
    if kv_equal:   # both kv heads equal: an MQA model written as GQA-2
        with torch.no_grad():
            for layer in m.model.layers:
                for lin in (layer.self_attn.k_proj, layer.self_attn.v_proj):
                    lin.weight[8:] = lin.weight[:8]
    m.save_pretrained(folder)
    return str(folder)


def _run(path, to, **kw):
    with open_checkpoint(path) as ckpt:
        return whatif(ckpt, to=to, sample=SAMPLE, device="cpu", **kw)


@pytest.mark.parametrize("build", [_gpt2, _llama])
def test_read_then_write_is_the_identity(tmp_path, build):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(build(tmp_path / "m"))
    ids = torch.randint(0, 256, (2, 12))
    before = m(ids).logits
    mods, geom = hf_surgery.modules(m), hf_surgery.geometry(m)
    layers = [hf_surgery.read(mod, i, geom) for i, mod in enumerate(mods)]
    with torch.no_grad():
        for mod in mods:            # scramble, then write back
            for p in mod.parameters():
                p.mul_(0.5)
    for mod, layer in zip(mods, layers):
        hf_surgery.write(mod, layer, geom)
    assert torch.equal(m(ids).logits, before)


def test_gpt2_with_equal_k_and_v_converted_to_k_eq_v_changes_nothing(tmp_path):
    r = _run(_gpt2(tmp_path / "g", kv_equal=True), "k_eq_v")
    assert abs(r["steps"][0]["loss"] - r["baseline"]["loss"]) <= 1e-5
    assert (r["baseline"]["kv_bytes_per_token"], r["steps"][0]["kv_bytes_per_token"]) == (2 * 2 * 4 * 8 * 4, 2 * 1 * 4 * 8 * 4)


@pytest.mark.parametrize("method", ["mean", "aligned"])
def test_llama_mqa_of_equal_kv_heads_and_gqa_of_its_own_heads_change_nothing(tmp_path, method):
    path = _llama(tmp_path / "l", kv_equal=True)
    r = _run(path, "mqa", method=method)
    assert abs(r["steps"][0]["loss"] - r["baseline"]["loss"]) <= 1e-5
    assert r["steps"][0]["kv_bytes_per_token"] == r["baseline"]["kv_bytes_per_token"] / 2
    assert r["notes"]["rotary"].startswith("aligned: keys are not rotated")
    assert _run(path, "gqa:2")["steps"][0]["loss"] == r["baseline"]["loss"]


def test_hugging_face_models_are_not_healed_or_saved(tmp_path):
    with pytest.raises(WhatIfError, match="--heal-steps and --out need a model built as this project's GPT"):
        _run(_gpt2(tmp_path / "g"), "k_eq_v", heal_steps=1)
