"""The serving-cost calculator: known answers, real caches, real parameter counts, properties."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.errors import AnalysisError
from analysis.gpus import CATALOGUE, GB, GIB, get_gpu
from analysis.kv_cost import (
    VARIANTS, Attention, Geometry, Serving, bytes_per_element, compare, estimate, geometry_from_info,
    kv_bytes_per_token, params, savings, standard_configs, sweep_context, sweep_users,
)
from analysis.presets import PRESETS, get_preset

H100 = get_gpu("h100-sxm")


# -- known answers ------------------------------------------------------------------------

def test_llama3_8b_bf16_needs_128_kib_per_token():
    g = get_preset("llama-3-8b")
    assert kv_bytes_per_token(g, Attention(), "bf16") == 128 * 1024
    e = estimate(g, Attention(), Serving(context=8192), H100)
    assert e.bytes_per_user == 128 * 1024 * 8192 == 1 * GIB


@pytest.mark.parametrize("variant, kv_heads, reduction", [
    ("k_eq_v", 16, 0.5),         # K=V: one cached tensor instead of two
    ("k_eq_v", 4, 0.875),        # K=V with GQA-4: 1*4 / (2*16)
    ("k_eq_v", 1, 0.96875),      # K=V with MQA: 1*1 / (2*16), "about 96.9%"
    ("q_eq_k", 16, 0.0),         # Q=K leaves the cache unchanged
    ("wq_identity", 16, 0.0),    # query-free leaves the cache unchanged
])
def test_projection_sharing_paper_reductions_follow_from_its_300m_geometry(variant, kv_heads, reduction):
    g = get_preset("projection-sharing-300m")
    base = kv_bytes_per_token(g, Attention("qkv"), "bf16")
    assert base == 20 * 2 * 16 * 64 * 2
    assert 1 - kv_bytes_per_token(g, Attention(variant, kv_heads), "bf16") / base == reduction


def test_consistent_mqa_k_eq_v_ratio_for_the_1_2b_model_is_64x_not_67x():
    g = get_preset("projection-sharing-1.2b")
    base = estimate(g, Attention("qkv"), Serving(context=2048), H100)
    tied = estimate(g, Attention("k_eq_v", 1), Serving(context=2048), H100)
    assert base.bytes_per_user / tied.bytes_per_user == 64
    # the "67x" comes from dividing a figure in MB by one in MiB: 64 * 2^20 / 1e6
    assert round(64 * 2 ** 20 / 1e6, 1) == 67.1


def test_projection_sharing_300m_k_eq_v_has_284_5m_parameters_as_its_model_card_says():
    total, _ = params(get_preset("projection-sharing-300m"), Attention("k_eq_v"))
    assert round(total / 1e6, 1) == 284.5


@pytest.mark.parametrize("variant, dropped", [
    ("qkv", 0),
    ("wq_identity", "q"),
    ("q_eq_k", "q"),
    ("k_eq_v", "v"),
    ("q_eq_k_eq_v", "qv"),
])
def test_parameter_counts_drop_the_tied_projection(variant, dropped):
    g = get_preset("llama-3-8b")  # GQA: W_Q is 4x the size of W_V
    d, nh, nkv, dh, L = 4096, 32, 8, 128, 32
    base, base_attn = params(g, Attention("qkv"))
    total, attn = params(g, Attention(variant))
    expect = 0
    if dropped and "q" in dropped:
        expect += L * d * nh * dh
    if dropped and "v" in dropped:
        expect += L * d * nkv * dh
    assert base - total == expect
    assert base_attn - attn == expect


@pytest.mark.parametrize("dtype, expected", [
    ("fp32", 4), ("bf16", 2), ("fp16", 2), ("fp8", 1),
    ("int8", 1 + 4 / 64), ("int4", 0.5 + 4 / 64),
])
def test_bytes_per_element_with_group_scale_overhead(dtype, expected):
    assert bytes_per_element(dtype) == expected


def test_int4_group_overhead_is_editable():
    assert bytes_per_element("int4", group_size=128, group_overhead_bytes=2) == 0.5 + 2 / 128


def test_mla_cache_is_latent_plus_rope_per_layer():
    g = get_preset("llama-2-7b")
    assert kv_bytes_per_token(g, Attention(mla_latent=512, mla_rope=64), "bf16") == 32 * (512 + 64) * 2


def test_cross_layer_sharing_divides_cache_layers_rounding_up():
    g = get_preset("gpt2")  # 12 layers
    one = kv_bytes_per_token(g, Attention(), "bf16")
    assert kv_bytes_per_token(g, Attention(layers_per_cache=2), "bf16") == one / 2
    assert kv_bytes_per_token(g, Attention(layers_per_cache=5), "bf16") == one * 3 / 12


def test_sliding_window_caps_the_cached_tokens():
    g = get_preset("mistral-7b")  # its own window: 4096
    s = Serving(context=32768)
    assert estimate(g, Attention(), s, H100).cached_tokens == 4096
    assert estimate(g, Attention(window=0), s, H100).cached_tokens == 32768
    assert estimate(g, Attention(window=1024), s, H100).cached_tokens == 1024


def test_users_per_gpu_known_answer():
    g = get_preset("llama-3-8b")
    e = estimate(g, Attention(), Serving(context=4096, mem_utilisation=0.9, reserve_bytes=2 * GB), H100)
    weights = 8_030_261_248 * 2
    assert e.weights_bytes == weights
    assert e.users_per_gpu == math.floor((80 * GB * 0.9 - weights - 2 * GB) / (131072 * 4096)) == 100


def test_roofline_and_cost_known_answer():
    g = get_preset("llama-3-8b")
    s = Serving(context=4096, users=10, bandwidth_efficiency=1.0, compute_efficiency=1.0)
    gpu = H100.with_overrides(price_per_hour=3.6)
    e = estimate(g, Attention(), s, gpu)
    read = (8_030_261_248 - 128256 * 4096) * 2  # the input embedding table is not read in full
    memory_time = (read + 10 * 131072 * 4096) / 3.35e12
    assert e.memory_time_s == pytest.approx(memory_time, rel=1e-12)
    assert e.bound == "memory"
    assert e.tokens_per_s == pytest.approx(10 / memory_time, rel=1e-12)
    assert e.usd_per_million_tokens == pytest.approx(3.6 / (10 / memory_time * 3600) * 1e6, rel=1e-12)


def test_compute_bound_when_throughput_is_tiny():
    g = get_preset("gpt2")
    e = estimate(g, Attention(), Serving(context=1024), H100.with_overrides(bf16_flops=1e9))
    assert e.bound == "compute"
    assert e.step_time_s == e.compute_time_s


def test_users_beyond_one_gpu_add_replicas():
    g = get_preset("llama-3-8b")
    one = estimate(g, Attention(), Serving(context=4096), H100)
    e = estimate(g, Attention(), Serving(context=4096, users=one.users_per_gpu * 2 + 1), H100)
    assert e.replicas == 3 and e.gpus == 3


def test_one_more_user_never_lowers_throughput_across_replicas():
    """Found by the hypothesis test: 925 users on 2 replicas run at batches 463 and 462,
    not both at 463 (no batch cap, so memory alone sets the split)."""
    g = get_preset("gpt2")
    a = estimate(g, Attention(), Serving(context=2048, users=924, max_batch=None), H100)
    b = estimate(g, Attention(), Serving(context=2048, users=925, max_batch=None), H100)
    assert (a.replicas, b.replicas) == (2, 2)
    assert a.tokens_per_s < b.tokens_per_s


def test_weights_that_do_not_fit_give_zero_users_and_no_cost():
    e = estimate(get_preset("llama-2-70b"), Attention(), Serving(), H100)
    assert (e.users_per_gpu, e.fits, e.tokens_per_s, e.usd_per_million_tokens, e.bound) == (0, False, 0.0,
                                                                                          None, None)
    tp = estimate(get_preset("llama-2-70b"), Attention(), Serving(gpus_per_replica=4), H100)
    assert tp.fits and tp.gpus == 4


def test_prompt_and_output_lengths_set_context_and_decode_length():
    s = Serving(context=None, prompt_len=1000, output_len=200)
    assert s.resolved_context() == 1200 and s.decode_length() == 1100


def test_savings_against_baseline():
    g = get_preset("llama-3-8b")
    s = Serving()
    base = estimate(g, Attention(), s, H100)
    tied = estimate(g, Attention("k_eq_v"), s, H100)
    out = savings(tied, base)
    assert out["saving_bytes_per_token"] == 0.5
    assert out["ratio_users_per_gpu"] == tied.users_per_gpu / base.users_per_gpu
    table = compare(g, standard_configs(g), s, H100)
    assert list(table["variant"][:5]) == list(VARIANTS)
    assert table.loc[0, "saving_bytes_per_token"] == 0.0


def test_sweeps_are_tidy():
    g = get_preset("gpt2")
    configs = [Attention(), Attention("k_eq_v")]
    ctx = sweep_context(g, configs, Serving(), H100, [256, 1024])
    assert len(ctx) == 4 and set(ctx.columns) >= {"label", "context", "bytes_per_user", "users_per_gpu"}
    users = sweep_users(g, configs, Serving(), H100, [1, 8])
    assert len(users) == 4 and set(users.columns) >= {"users", "gpus", "usd_per_million_tokens"}


def test_steps_show_numbers_filled_in():
    e = estimate(get_preset("llama-3-8b"), Attention(), Serving(), H100)
    by_name = {s.name: s for s in e.steps}
    assert by_name["KV bytes per token"].filled == "32 * 2 * 8 * 128 * 2 = 131,072.0 B (128.000 KiB)"


def test_checkpoint_info_keeps_its_parameter_count():
    info = {"n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_model": 32, "d_head": 8, "variant": "k_eq_v",
            "params": {"total": 10_000, "attention": 1_500}, "path": "/tmp/x.pt"}
    g = geometry_from_info(info)
    assert params(g, Attention("k_eq_v")) == (10_000, 1_500)
    # the baseline adds back W_V: 2 layers * 32 * 2 * 8
    assert params(g, Attention("qkv")) == (10_000 + 1024, 1_500 + 1024)


# -- errors -------------------------------------------------------------------------------

def test_errors_name_what_was_expected_and_found():
    g = get_preset("llama-3-8b")
    with pytest.raises(AnalysisError) as exc:
        kv_bytes_per_token(g, Attention(n_kv_heads=5))
    assert str(exc.value) == ("geometry 'llama-3-8b': n_kv_heads must divide n_heads=32 "
                              "(1 for MQA, 32 for MHA), got 5")
    with pytest.raises(AnalysisError) as exc:
        get_preset("gpt5")
    assert str(exc.value).startswith("unknown preset 'gpt5': expected one of gpt2, gpt2-medium")
    with pytest.raises(AnalysisError) as exc:
        bytes_per_element("int3")
    assert str(exc.value) == "unknown dtype 'int3': expected one of fp32, bf16, fp16, fp8, int8, int4, fp4, nvfp4"
    with pytest.raises(AnalysisError) as exc:
        estimate(g, Attention(), Serving(mem_utilisation=1.5), H100)
    assert str(exc.value) == "serving: mem_utilisation must be in (0, 1], got 1.5"
    with pytest.raises(AnalysisError) as exc:
        geometry_from_info({"n_layers": 2, "n_heads": 4}, name="a.pt")
    assert str(exc.value) == "a.pt: checkpoint geometry lacks n_kv_heads, d_model, d_head"


def test_every_gpu_figure_cites_a_source():
    for gpu in CATALOGUE.values():
        assert set(gpu.sources) == {"memory", "bandwidth", "bf16", "price"}, gpu.name
        assert all(len(text) > 10 for text in gpu.sources.values()), gpu.name
    assert set(CATALOGUE) >= {"h100-sxm", "h100-pcie", "h200", "b200", "a100-40gb", "a100-80gb", "l40s",
                              "l4", "a10g", "rtx-4090", "mi300x", "edge-phone"}


# -- the proof: caches that real models allocate ------------------------------------------

def _llama_cache_bytes(layers, heads, kv_heads, d_head, tokens, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=heads * d_head, intermediate_size=64,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      head_dim=d_head, max_position_embeddings=256)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    ids = torch.randint(0, 64, (1, tokens))
    with torch.inference_mode():
        cache = model(ids, use_cache=True).past_key_values
    total = 0
    for layer in cache.layers:  # (B, n_kv_heads, T, d_head) each
        assert layer.keys.shape == (1, kv_heads, tokens, d_head)
        total += layer.keys.nbytes + layer.values.nbytes
    return total


@pytest.mark.parametrize("dtype, name", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
@pytest.mark.parametrize("kv_heads", [1, 2, 8])
def test_transformers_llama_cache_bytes_equal_the_calculator(dtype, name, kv_heads):
    layers, heads, d_head, tokens = 3, 8, 8, 37
    actual = _llama_cache_bytes(layers, heads, kv_heads, d_head, tokens, dtype)
    g = Geometry(name="tiny-llama", n_layers=layers, n_heads=heads, n_kv_heads=kv_heads,
                 d_model=heads * d_head, d_head=d_head, mlp="gated", norm="rmsnorm")
    e = estimate(g, Attention(), Serving(context=tokens, kv_dtype=name), H100)
    assert actual == e.bytes_per_user


def test_transformers_sliding_window_cache_holds_window_minus_the_new_token():
    """Mistral's sliding cache keeps window-1 tokens between steps and appends the current
    one while attending, so its peak equals the calculator's min(context, window)."""
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=8,
                        max_position_embeddings=128)
    model = MistralForCausalLM(cfg).eval()
    with torch.inference_mode():
        cache = model(torch.randint(0, 64, (1, 30)), use_cache=True).past_key_values
    stored = sum(l.keys.nbytes + l.values.nbytes for l in cache.layers)
    g = Geometry(name="tiny-mistral", n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, d_head=8,
                 sliding_window=8)
    e = estimate(g, Attention(), Serving(context=30, kv_dtype="fp32"), H100)
    assert stored + e.bytes_per_token == e.bytes_per_user


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_project_variant_model_cache_and_parameters_equal_the_calculator(variant, kv_heads):
    model_mod = pytest.importorskip("experiments.model")
    cfg = model_mod.GPTConfig(vocab_size=64, block_size=64, n_layer=2, n_head=4, n_kv_heads=kv_heads,
                              d_model=32, variant=variant)
    torch.manual_seed(0)
    model = model_mod.GPT(cfg).eval()
    cache = model_mod.KVCache(cfg.n_layer)
    with torch.inference_mode():
        model(torch.randint(0, 64, (1, 21)), cache=cache)
    g = Geometry(name="tiny-gpt", n_layers=2, n_heads=4, n_kv_heads=kv_heads, d_model=32, d_head=8,
                 d_mlp=128, vocab=64, n_positions=64, tied_embeddings=True, bias=False, norm="layernorm")
    e = estimate(g, Attention(variant), Serving(context=21, kv_dtype="fp32"), H100)
    assert cache.nbytes() == e.bytes_per_user
    total, attn = params(g, Attention(variant))
    assert (total, attn) == (model.n_params(), model.n_attention_params())


def _hf_param_count(kind: str, geometry: Geometry) -> int:
    import transformers as tf

    g = geometry
    if kind == "gpt2":
        cfg = tf.GPT2Config(vocab_size=g.vocab, n_positions=g.n_positions, n_embd=g.d_model,
                            n_layer=g.n_layers, n_head=g.n_heads)
        cls = tf.GPT2LMHeadModel
    else:
        cfg_cls = {"llama": tf.LlamaConfig, "mistral": tf.MistralConfig, "qwen2": tf.Qwen2Config}[kind]
        cfg = cfg_cls(vocab_size=g.vocab, hidden_size=g.d_model, intermediate_size=g.d_mlp,
                      num_hidden_layers=g.n_layers, num_attention_heads=g.n_heads,
                      num_key_value_heads=g.n_kv_heads, tie_word_embeddings=g.tied_embeddings)
        cls = {"llama": tf.LlamaForCausalLM, "mistral": tf.MistralForCausalLM,
               "qwen2": tf.Qwen2ForCausalLM}[kind]
    with torch.device("meta"):  # shapes only: no memory for 70B parameters
        model = cls(cfg)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name, kind", [
    ("gpt2", "gpt2"), ("gpt2-xl", "gpt2"), ("llama-2-7b", "llama"), ("llama-2-70b", "llama"),
    ("llama-3-8b", "llama"), ("mistral-7b", "mistral"), ("qwen2-7b", "qwen2"),
])
def test_preset_parameter_counts_equal_transformers_models(name, kind):
    g = get_preset(name)
    assert params(g, Attention())[0] == _hf_param_count(kind, g)


@pytest.mark.parametrize("name, expected", [
    ("gpt2", 124_439_808), ("llama-2-7b", 6_738_415_616), ("llama-2-13b", 13_015_864_320),
    ("llama-2-70b", 68_976_648_192), ("llama-3-8b", 8_030_261_248), ("llama-3-70b", 70_553_706_496),
    ("mistral-7b", 7_241_732_096), ("qwen2-7b", 7_615_616_512),
])
def test_preset_parameter_counts_known_answers(name, expected):
    assert params(get_preset(name), Attention())[0] == expected


# -- properties ---------------------------------------------------------------------------

geometries = st.sampled_from(list(PRESETS.values()))
variants = st.sampled_from(VARIANTS)
kv_dtypes = st.sampled_from(["fp32", "bf16", "fp8", "int8", "int4"])


def _kv_choices(g: Geometry) -> list[int]:
    return [k for k in range(1, g.n_heads + 1) if g.n_heads % k == 0]


@settings(max_examples=60, deadline=None)
@given(g=geometries, variant=variants, dtype=kv_dtypes, data=st.data(),
       c1=st.integers(1, 200_000), c2=st.integers(1, 200_000))
def test_monotone_in_context(g, variant, dtype, data, c1, c2):
    kv = data.draw(st.sampled_from(_kv_choices(g)))
    lo, hi = sorted((c1, c2))
    a = estimate(g, Attention(variant, kv), Serving(context=lo, kv_dtype=dtype), H100)
    b = estimate(g, Attention(variant, kv), Serving(context=hi, kv_dtype=dtype), H100)
    assert a.bytes_per_user <= b.bytes_per_user
    assert a.users_per_gpu >= b.users_per_gpu


@settings(max_examples=60, deadline=None)
@given(g=st.sampled_from([PRESETS["gpt2"], PRESETS["llama-3-8b"], PRESETS["projection-sharing-300m"]]),
       variant=variants, u1=st.integers(1, 5000), u2=st.integers(1, 5000))
def test_monotone_in_users(g, variant, u1, u2):
    lo, hi = sorted((u1, u2))
    a = estimate(g, Attention(variant), Serving(context=2048, users=lo), H100)
    b = estimate(g, Attention(variant), Serving(context=2048, users=hi), H100)
    assert a.gpus <= b.gpus
    assert a.tokens_per_s <= b.tokens_per_s * (1 + 1e-12)
    assert (a.bytes_all_users or 0) <= (b.bytes_all_users or 0)


@settings(max_examples=80, deadline=None)
@given(g=geometries, dtype=kv_dtypes, data=st.data(), context=st.integers(1, 100_000),
       layers_per_cache=st.integers(1, 4))
def test_k_eq_v_never_larger_than_separate_k_and_v(g, dtype, data, context, layers_per_cache):
    kv = data.draw(st.sampled_from(_kv_choices(g)))
    s = Serving(context=context, kv_dtype=dtype)
    for tied, untied in (("k_eq_v", "qkv"), ("q_eq_k_eq_v", "q_eq_k")):
        a = estimate(g, Attention(tied, kv, layers_per_cache=layers_per_cache), s, H100)
        b = estimate(g, Attention(untied, kv, layers_per_cache=layers_per_cache), s, H100)
        assert a.bytes_per_token <= b.bytes_per_token
        assert a.bytes_per_user <= b.bytes_per_user
        assert a.users_per_gpu >= b.users_per_gpu


@settings(max_examples=60, deadline=None)
@given(g=geometries, variant=variants, memory_gb=st.floats(0.0, 400.0), reserve_gb=st.floats(0.0, 8.0),
       wdtype=st.sampled_from(["fp32", "bf16", "int4"]))
def test_users_per_gpu_zero_when_weights_do_not_fit(g, variant, memory_gb, reserve_gb, wdtype):
    gpu = H100.with_overrides(memory_bytes=memory_gb * GB)
    s = Serving(context=1024, weight_dtype=wdtype, reserve_bytes=reserve_gb * GB)
    e = estimate(g, Attention(variant), s, gpu)
    if e.weights_bytes + s.reserve_bytes > gpu.memory_bytes * s.mem_utilisation:
        assert e.users_per_gpu == 0 and not e.fits and e.usd_per_million_tokens is None
    else:
        assert e.users_per_gpu == math.floor(
            (gpu.memory_bytes * s.mem_utilisation - e.weights_bytes - s.reserve_bytes) / e.bytes_per_user)


def test_serving_is_not_modified():
    s = Serving(context=100)
    before = dataclasses.asdict(s)
    estimate(get_preset("gpt2"), Attention(), s, H100)
    assert dataclasses.asdict(s) == before
