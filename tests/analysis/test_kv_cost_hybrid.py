"""Hybrid stacks in the calculator: sliding layers priced by their window, per-type heads and
widths, shared caches; the per-type breakdown, with the old figures keeping their meaning."""
from __future__ import annotations

import dataclasses

import pytest

from analysis.gpus import get_gpu
from analysis.kv_cost import (
    Attention, Geometry, Serving, estimate, geometry_from_info, kv_bytes_per_token, kv_bytes_per_user,
    kv_layer_rows,
)
from analysis.kv_layers import LayerType, parse_layer_types
from analysis.presets import PRESETS

H100 = get_gpu("h100-sxm")


def gemma3_layout() -> Geometry:
    """Six layers, five sliding (window 512) per global, one KV head of 16: 2 * 16 * 4 = 128 fp32
    bytes a token and layer."""
    return Geometry(name="g3", n_layers=6, n_heads=4, n_kv_heads=1, d_model=64, d_head=16,
                    layer_types=parse_layer_types("5xlocal:512,1xglobal", 6))


def test_a_gemma3_layout_as_transformers_caches_it_after_2048_tokens():
    g = gemma3_layout()
    # global: 2048 tokens; sliding: transformers keeps window - 1 = 511
    assert kv_bytes_per_user(g, Attention(), 2048, "fp32", engine="transformers") == 128 * (2048 + 5 * 511) == 589_184
    # priced as global, as before: 6 * 128 * 2048
    assert kv_bytes_per_user(g, Attention(window=0), 2048, "fp32") == 1_572_864


def test_bytes_per_token_is_every_layer_and_bytes_per_user_the_true_total():
    g = gemma3_layout()
    e = estimate(g, Attention(), Serving(context=32768, kv_dtype="fp32"), H100)
    assert e.bytes_per_token == 6 * 128
    assert e.bytes_per_user == 128 * (32768 + 5 * 512)
    assert e.cached_tokens == e.bytes_per_user / e.bytes_per_token
    assert [(r["name"], r["n_layers"], r["cache_layers"], r["n_kv_heads"], r["d_head_k"], r["d_head_v"],
             r["window"], r["tokens"], r["bytes_per_token"], r["bytes"]) for r in e.layer_types] == [
        ("local", 5, 5, 1, 16, 16, 512, 512, 640, 640 * 512),
        ("global", 1, 1, 1, 16, 16, None, 32768, 128, 128 * 32768)]
    # 32k tokens: the uniform price was 6x the global layer's, here (32768 + 2560) / (6 * 32768) of it
    assert e.bytes_per_user / (6 * 128 * 32768) == pytest.approx((32768 + 2560) / (6 * 32768))


def test_uniform_models_are_unchanged():
    g = PRESETS["llama-3-8b"]
    e = estimate(g, Attention(), Serving(context=4096), H100)
    assert e.bytes_per_user == 131072 * 4096 and e.layer_types[0]["window"] is None
    m = PRESETS["mistral-7b"]
    assert estimate(m, Attention(), Serving(context=8192), H100).bytes_per_user == 131072 * 4096


def test_every_hybrid_preset_prices_its_local_layers_by_their_window():
    hybrid = [g for g in PRESETS.values() if len(g.layer_types) > 1]
    assert {g.name for g in hybrid} == {"gemma-2-9b", "gemma-3-27b"}
    for g in hybrid:
        rows = kv_layer_rows(g, Attention(), 131072)
        for r in rows:
            assert r["tokens"] == (r["window"] or 131072)
    # Gemma 3 27B at 32k: 52 sliding layers of 1024 tokens, 10 global: 2 * 16 * 128 * 2 = 8192 B a layer
    g = PRESETS["gemma-3-27b"]
    assert kv_bytes_per_user(g, Attention(), 32768) == 8192 * (52 * 1024 + 10 * 32768)
    # Gemma 2 9B: 21 sliding of 4096, 21 global; 2 * 8 * 256 * 2 = 8192 B a layer
    assert kv_bytes_per_user(PRESETS["gemma-2-9b"], Attention(), 32768) == 8192 * 21 * (4096 + 32768)


def test_per_type_heads_widths_and_shared_layers():
    # Gemma-4-like: 10 sliding (kv 4, d 32) of which 3 share; 2 global with 1 KV head of 64, 1 sharing
    g = Geometry(name="g4", n_layers=12, n_heads=8, n_kv_heads=4, d_model=128, d_head=32,
                 layer_types=(LayerType("sliding", 10, window=256, shared=3),
                              LayerType("global", 2, n_kv_heads=1, d_head_k=64, shared=1)))
    assert kv_bytes_per_token(g, Attention(), "bf16") == 7 * 2 * 4 * 32 * 2 + 1 * 2 * 1 * 64 * 2
    # K = V caches the K-wide tensor once
    assert kv_bytes_per_token(g, Attention("k_eq_v"), "bf16") == 7 * 4 * 32 * 2 + 1 * 1 * 64 * 2
    # K and V of their own widths
    g2 = dataclasses.replace(g, layer_types=(LayerType("all", 12, d_head_k=48, d_head_v=32),))
    assert kv_bytes_per_token(g2, Attention(), "bf16") == 12 * 4 * (48 + 32) * 2


def test_attention_overrides_on_a_hybrid_stack():
    g = gemma3_layout()
    # another window applies to the sliding layers only; n_kv_heads other than the model's to every type
    assert kv_bytes_per_user(g, Attention(window=128), 4096, "fp32") == 128 * (4096 + 5 * 128)
    g2 = dataclasses.replace(g, n_heads=4, n_kv_heads=2, d_head=8)
    assert kv_bytes_per_token(g2, Attention(n_kv_heads=4), "fp32") == 6 * 2 * 4 * 8 * 4


def test_vllm_engine_rounds_each_type_to_blocks():
    g = gemma3_layout()
    rows = kv_layer_rows(g, Attention(), 1000, "fp32", engine="vllm", max_num_batched_tokens=2048)
    assert [r["tokens"] for r in rows] == [16 * (63 + 1), 16 * 63]   # min(1000, 511 + 2048) -> 63 blocks


def test_checkpoint_config_gives_the_layer_types():
    info = {"n_layers": 6, "n_heads": 4, "n_kv_heads": 1, "d_model": 64, "d_head": 16,
            "config": {"num_hidden_layers": 6, "sliding_window": 512, "sliding_window_pattern": 6}}
    g = geometry_from_info(info)
    assert g.layer_types == (LayerType("sliding_attention", 5, window=512), LayerType("full_attention", 1))
    assert kv_bytes_per_user(g, Attention(), 2048, "fp32", engine="transformers") == 589_184


# -- more shapes: 4-bit floats, YOCO, SVFormer, K and V widths apart -------------------------------

@pytest.mark.parametrize("dtype, per_elem", [("fp4", 0.5 + 1 / 32), ("nvfp4", 0.5 + 1 / 16)])
def test_4bit_float_caches_carry_their_block_scale(dtype, per_elem):
    from analysis.kv_cost import bytes_per_element
    assert bytes_per_element(dtype) == per_elem
    # the group-size knob of int4/int8 does not change a format's fixed block
    assert bytes_per_element(dtype, group_size=128, group_overhead_bytes=8) == per_elem
    g = PRESETS["llama-3-8b"]
    assert kv_bytes_per_token(g, Attention(), dtype) == 32 * 2 * 8 * 128 * per_elem


def test_yoco_one_global_cache_beside_sliding_self_decoder_layers():
    g = Geometry(name="yoco", n_layers=24, n_heads=16, n_kv_heads=4, d_model=1024, d_head=64,
                 layer_types=parse_layer_types("12xself:1024,12xcross:shared=11", 24))
    per_layer = 2 * 4 * 64 * 2
    assert kv_bytes_per_token(g, Attention()) == 13 * per_layer
    assert kv_bytes_per_user(g, Attention(), 65536) == per_layer * (12 * 1024 + 65536)


def test_svformer_caches_v_once_and_k_per_layer():
    g = Geometry(name="svformer", n_layers=12, n_heads=12, n_kv_heads=12, d_model=768, d_head=64,
                 layer_types=parse_layer_types("1xfirst,11xrest:dv=0", 12))
    assert kv_bytes_per_token(g, Attention()) == (12 * 12 * 64 + 1 * 12 * 64) * 2


def test_mla_cached_decompressed_k_and_v_of_their_own_widths():
    # DeepSeek-V3's transformers cache: per head K of nope + rope = 192 and V of 128, 128 heads, 61 layers
    g = Geometry(name="dsv3", n_layers=61, n_heads=128, n_kv_heads=128, d_model=7168, d_head=128,
                 layer_types=parse_layer_types("all:dh=192:dv=128", 61))
    assert kv_bytes_per_token(g, Attention()) == 61 * 128 * (192 + 128) * 2
