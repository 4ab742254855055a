"""``info``'s ``kv_bytes_per_token`` and ``kv_layer_types`` for hybrid stacks, from the config."""
from __future__ import annotations

from loaders.canonical import ModelMeta


def meta(config: dict, **kw) -> ModelMeta:
    fields = dict(architecture="gemma", variant="qkv", n_layers=6, n_heads=4, n_kv_heads=2, d_model=64,
                  d_head=16, norm="rmsnorm", positions="rotary", attn_scale=0.25, dtype="bfloat16",
                  params_total=1, params_attention=1, config=config)
    fields.update(kw)
    return ModelMeta(**fields)


def test_uniform_stack_is_unchanged():
    m = meta({})
    assert m.kv_bytes_per_token == 6 * 2 * 2 * 16 * 2
    assert m.to_json()["kv_layer_types"] == []


def test_gemma4_global_layers_count_their_own_heads_and_width_and_shared_layers_nothing():
    cfg = {"num_hidden_layers": 6, "sliding_window": 512, "num_global_key_value_heads": 1, "global_head_dim": 64,
           "layer_types": ["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2
           + ["full_attention"], "num_kv_shared_layers": 2}
    m = meta(cfg)
    # 4 sliding (1 shared): 3 * 2 * 2 * 16 * 2; 2 global (1 shared): 1 * 2 * 1 * 64 * 2
    assert m.kv_bytes_per_token == 3 * 2 * 2 * 16 * 2 + 1 * 2 * 1 * 64 * 2
    assert m.to_json()["kv_layer_types"] == [
        {"name": "sliding_attention", "n_layers": 4, "window": 512, "n_kv_heads": None, "d_head_k": None,
         "d_head_v": None, "shared": 1, "cached": True},
        {"name": "full_attention", "n_layers": 2, "window": None, "n_kv_heads": 1, "d_head_k": 64,
         "d_head_v": None, "shared": 1, "cached": True}]


def test_sliding_layers_keep_bytes_per_token_the_same():
    """A window caps the tokens, not the bytes one token adds: Gemma 3's 5:1 layout costs what a
    uniform stack costs per token."""
    m = meta({"num_hidden_layers": 6, "sliding_window": 512, "sliding_window_pattern": 6})
    assert m.kv_bytes_per_token == meta({}).kv_bytes_per_token
    assert [t.n_layers for t in m.kv_layer_types] == [5, 1]

