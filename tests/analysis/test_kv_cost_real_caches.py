"""The calculator against transformers' real caches, for every hybrid family its config builds offline.

Each test builds a tiny model of the family from its config class (random weights, no
download), runs one forward pass of C tokens with a cache, and sums the bytes of the
``keys`` and ``values`` tensors the returned ``DynamicCache`` holds. The calculator reads
the same config through ``geometry_from_info`` (as ``kv-cost --checkpoint`` does) and, with
``engine="transformers"`` (a sliding layer keeps window - 1 tokens after a forward,
``DynamicSlidingWindowLayer``), must give exactly those bytes. Contexts straddle the window
(16): below it, at it, one past it, far past it.

Families: Gemma 2 (alternating), Gemma 3 text, Cohere 2, EXAONE 4 and OLMo 3 (5 sliding
per global), gpt-oss (alternating, MoE), Mistral and Ministral (a window on every layer),
Llama 4 text (chunked attention, cached as a window), Gemma 3n and Gemma 4 text (the last
4 layers reuse an earlier layer's cache; Gemma 4's global layers with their own KV heads
and head width), Qwen3-Next (linear-attention layers: no KV, their fixed-size recurrent
state is not counted by either side).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from analysis.kv_cost import Attention, geometry_from_info, kv_bytes_per_user  # noqa: E402

BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=4096)
EIGHT = ["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"]
FAMILIES = {
    "gemma2": dict(sliding_window=16),
    "gemma3_text": dict(sliding_window=16),
    "cohere2": dict(sliding_window=16),
    "exaone4": dict(sliding_window=16),
    "olmo3": dict(sliding_window=16),
    "gpt_oss": dict(sliding_window=16, num_local_experts=2, num_experts_per_tok=1),
    "mistral": dict(sliding_window=16),
    "ministral": dict(sliding_window=16),
    "llama4_text": dict(attention_chunk_size=16),
    "gemma3n_text": dict(num_hidden_layers=8, sliding_window=16, layer_types=EIGHT, num_kv_shared_layers=4,
                         vocab_size_per_layer_input=64, hidden_size_per_layer_input=8, laurel_rank=4,
                         altup_num_inputs=2, activation_sparsity_pattern=[0.0] * 8, intermediate_size=[64] * 8),
    "gemma4_text": dict(num_hidden_layers=8, sliding_window=16, layer_types=EIGHT, num_kv_shared_layers=4,
                        num_global_key_value_heads=1, global_head_dim=16, attention_k_eq_v=True,
                        hidden_size_per_layer_input=0),
    "qwen3_next": dict(),
}
CONTEXTS = (5, 15, 16, 17, 40)


def cache_bytes(cache) -> int:
    """Bytes of every K and V tensor the cache holds (a shared layer holds None)."""
    return sum(t.numel() * t.element_size() for layer in cache.layers
               for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if isinstance(t, torch.Tensor))


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    model_type = request.param
    if model_type not in transformers.models.auto.configuration_auto.CONFIG_MAPPING:
        pytest.skip(f"this transformers has no {model_type}")
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(model_type, **{**BASE, **FAMILIES[model_type]})
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    d = config.to_dict()
    info = {"n_layers": d["num_hidden_layers"], "n_heads": d["num_attention_heads"],
            "n_kv_heads": d["num_key_value_heads"], "d_model": d["hidden_size"], "d_head": d["head_dim"],
            "config": d}
    return model_type, model, geometry_from_info(info, name=model_type)


@pytest.mark.parametrize("context", CONTEXTS)
def test_calculator_equals_the_real_cache(family, context):
    model_type, model, geometry = family
    ids = torch.randint(0, 64, (1, context))
    with torch.no_grad():
        out = model(ids, use_cache=True)
    real = cache_bytes(out.past_key_values)
    assert real > 0
    assert kv_bytes_per_user(geometry, Attention(), context, "fp32", engine="transformers") == real


def test_every_family_is_read_as_a_hybrid_or_windowed_stack(family):
    model_type, _, geometry = family
    kinds = {t.name for t in geometry.layer_types}
    assert geometry.layer_types, model_type
    assert kinds & {"sliding_attention", "chunked_attention", "linear_attention"}, model_type
    if model_type in ("gemma3n_text", "gemma4_text"):
        assert sum(t.shared for t in geometry.layer_types) == 4
    if model_type == "gemma4_text":
        glob = [t for t in geometry.layer_types if t.name == "full_attention"][0]
        assert (glob.n_kv_heads, glob.d_head_k) == (1, 16)
