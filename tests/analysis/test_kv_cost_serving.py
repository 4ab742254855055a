"""Serving figures of the calculator: GPUs needed under a batch cap, cost per month,
prefill / time to first token / time per output token, and the MLA row type.

Every expected value is worked out by hand from the formula in ``analysis.kv_cost``'s docstring.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from analysis.gpus import GB, get_gpu
from analysis.kv_cost import (
    DEFAULT_MAX_BATCH, HOURS_PER_MONTH, LARGER_BETTER, SMALLER_BETTER, VARIANT_LABELS, Attention,
    Geometry, Serving, attention_flops_per_pair, attention_params, causal_pairs, compare, estimate,
    geometry_from_info, kv_bytes_per_token, native_attention, savings, standard_configs,
)
from analysis.presets import get_preset
from analysis.variants import LABELS

H100 = get_gpu("h100-sxm")
LLAMA3_8B_PARAMS = 8_030_261_248
LLAMA3_8B_READ = LLAMA3_8B_PARAMS - 128256 * 4096  # the input embedding table is read one row a token


def deepseek_v3() -> Geometry:
    """DeepSeek-V3's published attention (Hugging Face deepseek-ai/DeepSeek-V3 config.json):
    61 layers, d_model 7168, 128 heads, qk_nope_head_dim = v_head_dim = 128, kv_lora_rank 512,
    qk_rope_head_dim 64, q_lora_rank 1536."""
    return Geometry(name="deepseek-v3", n_layers=61, n_heads=128, n_kv_heads=128, d_model=7168, d_head=128,
                    kv_lora_rank=512, qk_rope_head_dim=64, q_lora_rank=1536, mlp="gated", norm="rmsnorm")


# -- the batch cap and GPUs needed ----------------------------------------------------------

def test_default_batch_cap_is_vllms_max_num_seqs():
    assert DEFAULT_MAX_BATCH == 256 and Serving().max_batch == 256


@pytest.mark.parametrize("variant, users_per_gpu", [("qkv", 100), ("k_eq_v", 201)])
def test_gpus_needed_for_100k_users_is_users_over_the_memory_limited_batch(variant, users_per_gpu):
    g = get_preset("llama-3-8b")
    e = estimate(g, Attention(variant), Serving(context=4096, users=100_000), H100)
    # memory-limited batch: floor((80 GB * 0.9 - weights - 2 GB) / (bytes/token * 4096))
    per_token = 32 * (1 if variant == "k_eq_v" else 2) * 8 * 128 * 2
    weights = (LLAMA3_8B_PARAMS - (32 * 4096 * 8 * 128 if variant == "k_eq_v" else 0)) * 2
    assert e.users_per_gpu == math.floor((72 * GB - weights - 2 * GB) / (per_token * 4096)) == users_per_gpu
    assert e.batch_per_replica == min(256, users_per_gpu) and e.batch_limit == "memory"
    assert e.gpus == math.ceil(100_000 / min(256, users_per_gpu))  # 1000 and 498
    assert e.tokens_per_s_per_gpu == pytest.approx(e.tokens_per_s / e.gpus, rel=1e-12)


def test_a_lower_cap_than_memory_sets_the_batch_and_the_gpus():
    g = get_preset("llama-3-8b")
    e = estimate(g, Attention(), Serving(context=4096, users=100_000, max_batch=64), H100)
    assert (e.users_per_gpu, e.batch_per_replica, e.batch_limit) == (100, 64, "batch cap")
    assert e.gpus == math.ceil(100_000 / 64) == 1563
    assert e.batch == math.ceil(100_000 / 1563) == 64


def test_the_cap_binds_when_memory_holds_thousands():
    """Paper B's 300M with K=V and MQA holds 6,625 users' caches; one replica still decodes 256."""
    g = get_preset("projection-sharing-300m")
    one = estimate(g, Attention("k_eq_v", 1), Serving(), H100)
    assert one.users_per_gpu == 6625
    assert (one.users, one.batch_per_replica, one.batch_limit, one.gpus) == (256, 256, "batch cap", 1)
    many = estimate(g, Attention("k_eq_v", 1), Serving(users=6625), H100)
    assert many.gpus == math.ceil(6625 / 256) == 26
    uncapped = estimate(g, Attention("k_eq_v", 1), Serving(users=6625, max_batch=None), H100)
    assert (uncapped.gpus, uncapped.batch_limit, uncapped.max_batch) == (1, "memory", None)


def test_tensor_parallel_replicas_multiply_the_gpus():
    e = estimate(get_preset("llama-2-70b"), Attention(), Serving(users=1000, gpus_per_replica=4), H100)
    assert e.gpus == math.ceil(1000 / e.batch_per_replica) * 4


def test_cost_per_month_is_price_times_gpus_times_730_hours():
    g = get_preset("llama-3-8b")
    e = estimate(g, Attention(), Serving(users=100_000), H100.with_overrides(price_per_hour=2.5))
    assert HOURS_PER_MONTH == 365 * 24 / 12
    assert e.usd_per_month == 2.5 * 1000 * 730 == 1_825_000


def test_bad_batch_cap_is_refused():
    from analysis.errors import AnalysisError

    with pytest.raises(AnalysisError) as exc:
        estimate(get_preset("gpt2"), Attention(), Serving(max_batch=0), H100)
    assert str(exc.value) == "serving: max_batch must be >= 1 (or None: no cap), got 0"


# -- prefill, TTFT, TPOT --------------------------------------------------------------------

def test_causal_pairs_with_and_without_a_window():
    assert causal_pairs(5, None) == 1 + 2 + 3 + 4 + 5
    assert causal_pairs(5, 2) == 1 + 2 + 2 + 2 + 2
    assert causal_pairs(3, 8) == 6


def test_prefill_is_compute_bound_and_gives_the_time_to_first_token():
    g = get_preset("llama-3-8b")
    s = Serving(context=4096, prompt_len=1000, users=10, compute_efficiency=0.5, bandwidth_efficiency=0.8)
    e = estimate(g, Attention(), s, H100)
    flops = 2 * LLAMA3_8B_READ * 1000 + 4 * 32 * 32 * 128 * (1000 * 1001 // 2)
    compute_time = flops / (989.4e12 * 0.5)
    memory_time = (LLAMA3_8B_READ * 2 + 1000 * 131072) / (3.35e12 * 0.8)
    assert e.prompt_tokens == 1000
    assert e.prefill_flops == flops
    assert compute_time > memory_time and e.prefill_bound == "compute"
    assert e.prefill_time_s == pytest.approx(compute_time, rel=1e-12)
    assert e.ttft_s == e.prefill_time_s
    assert round(e.ttft_s * 1e3, 1) == 30.9


def test_time_per_output_token_is_the_decode_step_memory_bound():
    g = get_preset("llama-3-8b")
    s = Serving(context=4096, users=10, bandwidth_efficiency=1.0, compute_efficiency=1.0)
    e = estimate(g, Attention(), s, H100)
    # (weights read + batch * KV bytes read per step) / bandwidth
    assert e.tpot_s == pytest.approx((LLAMA3_8B_READ * 2 + 10 * 131072 * 4096) / 3.35e12, rel=1e-12)
    assert e.tpot_s == e.step_time_s and e.bound == "memory"


def test_without_a_prompt_length_the_whole_context_is_prefilled():
    e = estimate(get_preset("gpt2"), Attention(), Serving(context=512), H100)
    assert e.prompt_tokens == 512


def test_k_eq_v_lowers_time_per_output_token_at_the_same_batch():
    g = get_preset("llama-3-8b")
    s = Serving(context=4096, users=50)
    assert estimate(g, Attention("k_eq_v"), s, H100).tpot_s < estimate(g, Attention(), s, H100).tpot_s


def test_nothing_fits_gives_no_latency_and_no_monthly_cost():
    e = estimate(get_preset("llama-2-70b"), Attention(), Serving(), get_gpu("l4"))
    assert (e.gpus, e.ttft_s, e.tpot_s, e.usd_per_month, e.batch_limit) == (0, None, None, None, None)


# -- which way is better --------------------------------------------------------------------

def test_every_compared_figure_has_one_direction():
    assert not set(SMALLER_BETTER) & set(LARGER_BETTER)
    assert {"gpus", "usd_per_month", "ttft_s", "tpot_s", "bytes_per_token"} <= set(SMALLER_BETTER)
    assert {"tokens_per_s", "tokens_per_s_per_gpu", "users_per_gpu"} <= set(LARGER_BETTER)


def test_at_100k_users_k_eq_v_needs_half_the_gpus_at_the_same_total():
    g = get_preset("llama-3-8b")
    s = Serving(context=4096, users=100_000)
    out = savings(estimate(g, Attention("k_eq_v"), s, H100), estimate(g, Attention(), s, H100))
    assert out["saving_gpus"] == 1 - 498 / 1000
    assert out["ratio_tokens_per_s"] == pytest.approx(1.0, abs=0.01)
    assert out["ratio_tokens_per_s_per_gpu"] == pytest.approx(1000 / 498, rel=0.01)


def test_without_a_cap_total_throughput_drops_because_fewer_gpus_serve():
    """The issue's case: with no batch cap, K=V + MQA packs ~1,600 users a GPU, so 62 GPUs
    serve what 1,000 do: total tokens/s falls (a drop, worse) while each GPU gives more."""
    g = get_preset("llama-3-8b")
    s = Serving(context=4096, users=100_000, max_batch=None)
    tied, base = estimate(g, Attention("k_eq_v", 1), s, H100), estimate(g, Attention(), s, H100)
    assert (tied.gpus, base.gpus) == (math.ceil(100_000 / tied.users_per_gpu), 1000) == (62, 1000)
    out = savings(tied, base)
    assert out["ratio_tokens_per_s"] < 1 < out["ratio_tokens_per_s_per_gpu"]


def test_no_gpu_saving_when_a_configuration_does_not_fit():
    g = get_preset("llama-2-70b")
    l4 = get_gpu("l4")
    out = savings(estimate(g, Attention("k_eq_v"), Serving(), l4), estimate(g, Attention(), Serving(), l4))
    assert out["saving_gpus"] is None


def test_comparison_table_has_the_new_columns_and_keeps_the_old():
    table = compare(get_preset("gpt2"), standard_configs(get_preset("gpt2")), Serving(users=1000), H100)
    old = {"label", "variant", "n_kv_heads", "params_total", "params_attention", "attention_share",
           "weights_bytes", "bytes_per_token", "bytes_per_user", "bytes_all_users", "users_per_gpu", "users",
           "gpus", "tokens_per_s", "bound", "usd_per_million_tokens"}
    new = {"max_batch", "batch_per_replica", "batch_limit", "tokens_per_s_per_gpu", "usd_per_month",
           "prompt_tokens", "prefill_time_s", "ttft_s", "tpot_s", "saving_gpus", "ratio_tokens_per_s_per_gpu"}
    assert old | new <= set(table.columns)


# -- MLA -----------------------------------------------------------------------------------

def test_deepseek_v3_mla_caches_70272_bytes_per_token_at_bf16():
    g = deepseek_v3()
    assert kv_bytes_per_token(g, native_attention(g), "bf16") == 61 * (512 + 64) * 2 == 70_272
    # against MHA at its 128 heads of 128: 61 * 2 * 128 * 128 * 2
    assert kv_bytes_per_token(g, Attention("qkv"), "bf16") == 3_997_696


def test_mla_attention_parameters_of_deepseek_v3_per_layer():
    g = deepseek_v3()
    per_layer = (7168 * 1536 + 1536 + 1536 * 128 * (128 + 64)  # W_DQ, its norm, W_UQ
                 + 7168 * (512 + 64) + 512                    # W_DKV and W_KR, the latent's norm
                 + 512 * 128 * 128 * 2                        # W_UK, W_UV
                 + 128 * 128 * 7168)                          # W_O
    assert per_layer == 187_107_328
    assert attention_params(g, native_attention(g)) == 61 * per_layer


def test_an_mla_model_gets_an_mla_row_first():
    g = deepseek_v3()
    configs = standard_configs(g)
    assert configs[0] == native_attention(g)
    e = estimate(g, configs[0], Serving(context=4096, gpus_per_replica=8), get_gpu("h200"))
    assert (e.variant, e.label, e.bytes_per_token) == ("mla", "MLA latent 512+rope 64", 70_272)
    steps = {s.name: s for s in e.steps}
    assert steps["KV bytes per token"].filled == "61 * (512 + 64) * 2 = 70,272.0 B (68.625 KiB)"


def test_mla_attention_flops_per_pair():
    g = deepseek_v3()
    mla = native_attention(g)
    assert attention_flops_per_pair(g, mla, "prefill") == 2 * 61 * 128 * (2 * 128 + 64)
    assert attention_flops_per_pair(g, mla, "decode") == 2 * 61 * 128 * (2 * 512 + 64)
    assert attention_flops_per_pair(g, Attention(), "decode") == 4 * 61 * 128 * 128


def test_checkpoint_info_with_mla_dims_makes_an_mla_geometry():
    info = {"n_layers": 61, "n_heads": 128, "n_kv_heads": 128, "d_model": 7168, "d_head": 128,
            "variant": "qkv", "kv_lora_rank": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1536}
    g = geometry_from_info(info, name="v3")
    assert (g.kv_lora_rank, g.qk_rope_head_dim, g.q_lora_rank) == (512, 64, 1536)
    nested = geometry_from_info({**{k: info[k] for k in list(info)[:6]},
                                 "mla": {"kv_lora_rank": 512, "qk_rope_head_dim": 64}}, name="v3")
    assert kv_bytes_per_token(nested, native_attention(nested), "bf16") == 70_272


def tiny_deepseek_v3(nope: int = 16, v: int = 16):
    """A 2-layer transformers DeepseekV3 (4 heads, d_model 64, latent 16, rope 8, q rank 24)."""
    tf = pytest.importorskip("transformers")
    if not hasattr(tf, "DeepseekV3Config"):
        pytest.skip("this transformers has no DeepseekV3")
    cfg = tf.DeepseekV3Config(vocab_size=64, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                              kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=nope,
                              v_head_dim=v, n_routed_experts=4, num_experts_per_tok=2,
                              first_k_dense_replace=1, n_group=1, topk_group=1, max_position_embeddings=64)
    torch.manual_seed(0)
    return tf.DeepseekV3ForCausalLM(cfg).eval()


def test_transformers_deepseek_v3_cache_and_attention_parameters_equal_the_calculator():
    """transformers' DeepseekV3 caches the latent (kv_lora_rank) and the rotary key (rope) per
    layer and token; its attention parameters follow the MLA formula."""
    model = tiny_deepseek_v3()
    with torch.inference_mode():
        cache = model(torch.randint(0, 64, (1, 7)), use_cache=True).past_key_values
    stored = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    g = Geometry(name="tiny-v3", n_layers=2, n_heads=4, n_kv_heads=4, d_model=64, d_head=16,
                 kv_lora_rank=16, qk_rope_head_dim=8, q_lora_rank=24)
    e = estimate(g, native_attention(g), Serving(context=7, kv_dtype="fp32"), H100)
    assert stored == e.bytes_per_user == 2 * 7 * (16 + 8) * 4
    hf_attention = sum(p.numel() for layer in model.model.layers for p in layer.self_attn.parameters())
    assert hf_attention == attention_params(g, native_attention(g))


def test_a_read_deepseek_checkpoint_is_costed_as_mla(tmp_path):
    """The checkpoint reader's ``latent`` (kv_lora_rank, rope_dim, nope_dim, v_dim) makes an MLA
    geometry whose cache is the reader's own kv_bytes_per_token and whose parameters are its
    count; key and value widths that differ (nope 12, v 20) follow through."""
    from loaders.checkpoints import inspect_checkpoint

    model = tiny_deepseek_v3(nope=12, v=20)
    model.save_pretrained(tmp_path / "v3")
    info = inspect_checkpoint(tmp_path / "v3")
    g = geometry_from_info(info)
    assert (g.kv_lora_rank, g.qk_rope_head_dim, g.q_lora_rank, g.qk_nope_head_dim, g.v_head_dim) == (
        16, 8, 24, 12, 20)
    native = native_attention(g)
    assert kv_bytes_per_token(g, native, "fp32") == info["kv_bytes_per_token"] == 2 * (16 + 8) * 4
    assert estimate(g, native, Serving(context=10), H100).params_total == info["params"]["total"]
    hf = sum(p.numel() for layer in model.model.layers for p in layer.self_attn.parameters())
    # the formula (with both norms) against transformers' own modules
    assert attention_params(dataclasses.replace(g, params_total=None, params_attention=None), native) == hf
    assert standard_configs(g)[0] == native


def test_variant_labels_come_from_the_variants_leaf():
    assert VARIANT_LABELS is LABELS
    g = get_preset("llama-3-8b")  # 32 query heads, 8 KV heads: 4 query heads share each
    from analysis.variants import sharing

    assert Attention("k_eq_v", 8).label(g) == f"Q-K=V, {sharing(32, 8)}"


@pytest.mark.parametrize("plus, base", [("q_eq_k_plus", "q_eq_k"), ("q_eq_k_eq_v_plus", "q_eq_k_eq_v")])
def test_plus_variants_cache_and_count_as_their_base(plus, base):
    g = get_preset("llama-3-8b")
    assert kv_bytes_per_token(g, Attention(plus), "bf16") == kv_bytes_per_token(g, Attention(base), "bf16")
    assert attention_params(g, Attention(plus)) == attention_params(g, Attention(base))
    e = estimate(g, Attention(plus), Serving(), H100)
    assert e.label.startswith(LABELS[plus] + ", ")
    info = {"n_layers": 2, "n_heads": 4, "n_kv_heads": 4, "d_model": 32, "d_head": 8, "variant": plus}
    assert geometry_from_info(info).variant == plus
