"""whatif on tiny Hugging Face causal LMs built with transformers (config + random init, save_pretrained):
GPT-2 (Conv1D, biases), Llama (GQA, rotary), GPT-NeoX (fused per-head query_key_value, partial rotary)
and Gemma (GQA, head_dim not d_model / n_heads)."""
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


def _neox(folder, kv_equal=False):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    m = GPTNeoXForCausalLM(GPTNeoXConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=32,
                                         intermediate_size=64, vocab_size=256, max_position_embeddings=64,
                                         rotary_pct=0.5))
    if kv_equal:   # per head the outputs are [q | k | v], 8 each
        with torch.no_grad():
            for layer in m.gpt_neox.layers:
                qkv = layer.attention.query_key_value
                w, b = qkv.weight.view(4, 3, 8, 32), qkv.bias.view(4, 3, 8)
                w[:, 2], b[:, 2] = w[:, 1], b[:, 1]
    m.save_pretrained(folder)
    return str(folder)


def _gemma(folder, kv_equal=False):
    from transformers import GemmaConfig, GemmaForCausalLM

    torch.manual_seed(0)
    m = GemmaForCausalLM(GemmaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                     head_dim=4, hidden_size=32, intermediate_size=64, vocab_size=256,
                                     max_position_embeddings=64))
    if kv_equal:   # K = V in every kv head
        with torch.no_grad():
            for layer in m.model.layers:
                layer.self_attn.v_proj.weight.copy_(layer.self_attn.k_proj.weight)
    m.save_pretrained(folder)
    return str(folder)


def _run(path, to, **kw):
    with open_checkpoint(path) as ckpt:
        return whatif(ckpt, to=to, sample=SAMPLE, device="cpu", **kw)


@pytest.mark.parametrize("build", [_gpt2, _llama, _neox, _gemma])
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


@pytest.mark.parametrize("build", [_neox, _gemma])
def test_neox_and_gemma_with_equal_k_and_v_converted_to_k_eq_v_change_nothing(tmp_path, build):
    r = _run(build(tmp_path / "m", kv_equal=True), "k_eq_v", method="lstsq")
    assert abs(r["steps"][0]["loss"] - r["baseline"]["loss"]) <= 1e-5
    assert r["steps"][0]["kv_bytes_per_token"] == r["baseline"]["kv_bytes_per_token"] / 2
    assert r["steps"][0]["ci_low"] < r["steps"][0]["ppl"] < r["steps"][0]["ci_high"]


@pytest.mark.parametrize("build,heads", [(_neox, 4), (_gemma, 2)])
def test_neox_and_gemma_gqa_of_their_own_heads_change_nothing_and_mqa_halves_or_quarters_the_cache(tmp_path, build, heads):
    path = build(tmp_path / "m")
    same = _run(path, f"gqa:{heads}")
    assert same["steps"][0]["loss"] == pytest.approx(same["baseline"]["loss"], abs=1e-6)
    mqa = _run(path, "mqa")
    assert mqa["steps"][0]["kv_bytes_per_token"] == mqa["baseline"]["kv_bytes_per_token"] / heads
    assert mqa["steps"][0]["loss"] != mqa["baseline"]["loss"]


def test_a_fused_attention_of_another_layout_is_refused():
    class FalconAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.query_key_value, self.dense = torch.nn.Linear(4, 12), torch.nn.Linear(4, 4)

    with pytest.raises(hf_surgery.Unsupported, match="FalconAttention: a fused query_key_value whose layout is not GPT-NeoX's"):
        hf_surgery.modules(torch.nn.Sequential(FalconAttention()))


def _vit(folder, kv_equal=False, image_size=8, channels=1):
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    m = ViTForImageClassification(ViTConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=32,
                                            intermediate_size=64, image_size=image_size, patch_size=4,
                                            num_channels=channels, num_labels=10))
    if kv_equal:
        with torch.no_grad():
            for layer in m.vit.layers:
                sa = layer.attention
                sa.v_proj.weight.copy_(sa.k_proj.weight)
                sa.v_proj.bias.copy_(sa.k_proj.bias)
    m.save_pretrained(folder)
    return str(folder)


def test_a_vit_classifier_on_the_digits_keeps_its_function_where_the_conversion_is_exact(tmp_path):
    """Hugging Face ViT on the bundled digits: K = V converted to k_eq_v and
    gqa of its own heads change nothing; accuracy and its interval come in the notes."""
    path = _vit(tmp_path / "v", kv_equal=True)
    with open_checkpoint(path) as ckpt:
        r = whatif(ckpt, to="k_eq_v", images="digits", sample=SAMPLE, device="cpu")
        g = whatif(ckpt, to="gqa:4", method="aligned", images="digits", sample=SAMPLE, device="cpu")
    assert abs(r["steps"][0]["loss"] - r["baseline"]["loss"]) <= 1e-5
    assert g["steps"][0]["loss"] == pytest.approx(g["baseline"]["loss"], abs=1e-6)
    assert r["sample"]["n_images"] == 256 // 5 and r["sample"]["window"] == 5          # (8/4)^2 + 1 tokens
    acc = r["notes"]["accuracy"]["baseline"]
    assert acc["ci_low"] <= acc["accuracy"] <= acc["ci_high"]
    assert r["notes"]["accuracy"]["0,1"] == acc


def test_images_are_resized_and_their_channels_repeated_to_what_the_model_reads(tmp_path):
    with open_checkpoint(_vit(tmp_path / "v", image_size=16, channels=3)) as ckpt:
        r = whatif(ckpt, to="mqa", images="digits", sample=SAMPLE, device="cpu")
    assert (r["sample"]["image_size"], r["sample"]["channels"], r["sample"]["resized_from"]) == (16, 3, 8)
    assert r["steps"][0]["kv_bytes_per_token"] == r["baseline"]["kv_bytes_per_token"] / 4

