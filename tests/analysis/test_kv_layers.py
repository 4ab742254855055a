"""Layer types: typed by hand, read from the config spellings of each family, and their cache rules."""
from __future__ import annotations

import pytest

from analysis.errors import AnalysisError
from analysis.kv_layers import (
    LayerType, cached_tokens_for, describe, layer_types_from_config, parse_layer_types, per_layer_kinds,
)


def test_a_pattern_repeats_in_order_to_fill_the_layers():
    # Gemma 3 27B: 62 layers, global when (i + 1) % 6 == 0: 10 global, 52 local
    assert parse_layer_types("5xlocal:512,1xglobal", 62) == (
        LayerType("local", 52, window=512), LayerType("global", 10))
    assert parse_layer_types("5xlocal:512,1xglobal", 6) == (
        LayerType("local", 5, window=512), LayerType("global", 1))


def test_per_type_heads_widths_shared_layers_and_layers_without_cache():
    types = parse_layer_types("3xlocal:512:shared=2,1xglobal:kv=2:dh=512:dv=256,none", 10)
    # pattern of 5 twice: 6 local, 2 global, 2 none
    assert types == (LayerType("local", 6, window=512, shared=2),
                     LayerType("global", 2, n_kv_heads=2, d_head_k=512, d_head_v=256),
                     LayerType("none", 2, cached=False))
    assert describe(types) == ("6 x local (window 512, 2 sharing a cache), 2 x global (2 KV heads, "
                               "d_head 512/256), 2 x none (no KV cache)")


@pytest.mark.parametrize("spec, message", [
    ("5xlocal:512,2xglobal", "layer types '5xlocal:512,2xglobal': 7 layers, but the model has 6"),
    ("5xlocal:big", "layer types '5xlocal:big': window must be a whole number, got 'big'"),
    ("1xglobal:heads=two", "layer types '1xglobal:heads=two': n_kv_heads must be a whole number, got 'two'"),
    ("1xglobal:kv=2:rope=64", "layer types '1xglobal:kv=2:rope=64': unknown option 'rope' in "
                              "'1xglobal:kv=2:rope=64'; expected one of kv, heads, dk, dh, dv, shared"),
    ("1xlocal:64,1xglobal:shared=4", "layer type 'global': shared layers must be 0..3, got 4"),
])
def test_bad_specs_name_what_was_expected_and_found(spec, message):
    with pytest.raises(AnalysisError) as exc:
        parse_layer_types(spec, 6)
    assert str(exc.value) == message


def test_an_unreadable_item_quotes_the_format():
    with pytest.raises(AnalysisError) as exc:
        parse_layer_types("5 x 512", 6)
    assert str(exc.value).startswith("layer types '5 x 512': cannot read '5 x 512'; expected comma-separated "
                                     "[COUNTx]NAME[:WINDOW]")


# -- config spellings -----------------------------------------------------------------------------

def test_layer_types_list_gemma3_and_gpt_oss_spelling():
    cfg = {"num_hidden_layers": 4, "sliding_window": 128,
           "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]}
    assert layer_types_from_config(cfg) == (LayerType("sliding_attention", 2, window=128),
                                            LayerType("full_attention", 2))


def test_sliding_window_pattern_gemma3_older_configs_and_cohere2():
    cfg = {"num_hidden_layers": 8, "sliding_window": 1024, "sliding_window_pattern": 4}
    assert per_layer_kinds(cfg) == ["sliding_attention"] * 3 + ["full_attention"] + \
        ["sliding_attention"] * 3 + ["full_attention"]


def test_gemma2_without_layer_types_alternates_starting_with_a_sliding_layer():
    cfg = {"model_type": "gemma2", "num_hidden_layers": 4, "sliding_window": 4096}
    assert per_layer_kinds(cfg) == ["sliding_attention", "full_attention"] * 2


def test_qwen2_slides_from_max_window_layers_only_when_use_sliding_window():
    cfg = {"num_hidden_layers": 4, "sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 2}
    assert per_layer_kinds(cfg) == ["full_attention"] * 2 + ["sliding_attention"] * 2
    assert layer_types_from_config({**cfg, "use_sliding_window": False}) == ()


def test_mistral_sliding_window_alone_is_every_layer():
    assert layer_types_from_config({"num_hidden_layers": 32, "sliding_window": 4096}) == (
        LayerType("sliding_attention", 32, window=4096),)
    assert layer_types_from_config({"num_hidden_layers": 32, "sliding_window": None}) == ()


def test_gemma4_global_heads_and_widths_and_shared_layers_under_text_config():
    kinds = ["sliding_attention"] * 5 + ["full_attention"]
    cfg = {"text_config": {"num_hidden_layers": 12, "sliding_window": 512, "layer_types": kinds * 2,
                           "num_global_key_value_heads": 2, "global_head_dim": 512, "num_kv_shared_layers": 4}}
    # layers 8..11 reuse a cache: sliding 8, 9, 10 and global 11
    assert layer_types_from_config(cfg) == (
        LayerType("sliding_attention", 10, window=512, shared=3),
        LayerType("full_attention", 2, n_kv_heads=2, d_head_k=512, shared=1))


def test_llama4_chunked_and_qwen3_next_linear_layers():
    cfg = {"num_hidden_layers": 4, "attention_chunk_size": 8192,
           "layer_types": ["chunked_attention", "chunked_attention", "chunked_attention", "full_attention"]}
    assert layer_types_from_config(cfg)[0] == LayerType("chunked_attention", 3, window=8192)
    cfg = {"num_hidden_layers": 4, "layer_types": ["linear_attention"] * 3 + ["full_attention"]}
    assert layer_types_from_config(cfg) == (LayerType("linear_attention", 3, cached=False),
                                            LayerType("full_attention", 1))


def test_config_errors_name_the_field():
    with pytest.raises(AnalysisError) as exc:
        layer_types_from_config({"num_hidden_layers": 3, "layer_types": ["full_attention"] * 2})
    assert str(exc.value) == "config: layer_types lists 2 layers, num_hidden_layers is 3"
    with pytest.raises(AnalysisError) as exc:
        layer_types_from_config({"num_hidden_layers": 1, "layer_types": ["sliding_attention"]})
    assert str(exc.value) == "config: layer 0 is sliding_attention but sliding_window is not set"


# -- tokens a layer holds, by engine ------------------------------------------------------------------

@pytest.mark.parametrize("window, context, engine, tokens", [
    (None, 2048, "datasheet", 2048), (512, 2048, "datasheet", 512), (512, 300, "datasheet", 300),
    (512, 2048, "transformers", 511), (512, 511, "transformers", 511), (512, 300, "transformers", 300),
    (None, 8192, "vllm", 8192), (None, 8200, "vllm", 8208),
    # sliding, vLLM: 16 * (ceil(min(C, W - 1 + B) / 16) + 1)
    (512, 32768, "vllm", 16 * (544 + 1)),   # min(32768, 511 + 8192) = 8703 -> 544 blocks
    (512, 300, "vllm", 16 * (19 + 1)),
])
def test_cached_tokens_by_engine(window, context, engine, tokens):
    assert cached_tokens_for(window, context, engine, max_num_batched_tokens=8192) == tokens


def test_unknown_engine():
    with pytest.raises(AnalysisError) as exc:
        cached_tokens_for(None, 10, "sglang")
    assert str(exc.value) == "engine must be one of datasheet, transformers, vllm, got 'sglang'"


def test_gemma4_global_heads_apply_only_with_attention_k_eq_v_as_its_config_class_does():
    kinds = ["sliding_attention", "full_attention"]
    cfg = {"model_type": "gemma4_text", "num_hidden_layers": 2, "sliding_window": 512, "layer_types": kinds,
           "num_global_key_value_heads": 4, "global_head_dim": 512}
    assert layer_types_from_config(cfg)[1] == LayerType("full_attention", 1, d_head_k=512)
    assert layer_types_from_config({**cfg, "attention_k_eq_v": True})[1] == LayerType(
        "full_attention", 1, n_kv_heads=4, d_head_k=512)


def test_per_layer_config_as_transformers_writes_it():
    cfg = {"num_hidden_layers": 2, "sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"],
           "per_layer_config": {"1": {"head_dim": 16, "num_key_value_heads": 1}}}
    assert layer_types_from_config(cfg)[1] == LayerType("full_attention", 1, n_kv_heads=1, d_head_k=16)
