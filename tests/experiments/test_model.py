"""The variant model: shapes, parameter counts, causality, cache, known-answer equivalences."""
from __future__ import annotations

import math

import pytest
import torch

from experiments.model import GPT, KVCache, GPTConfig, PROJECTIONS, VARIANTS

D, H, L = 32, 4, 2
SHARING = (4, 2, 1)


def tiny(variant="qkv", n_kv=H, **kw) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, block_size=24, n_layer=L, n_head=H, n_kv_heads=n_kv,
                    d_model=D, variant=variant, **kw)
    return GPT(cfg).eval()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n_kv", SHARING)
def test_forward_shapes_and_loss(variant, n_kv):
    m = tiny(variant, n_kv)
    idx = torch.randint(0, 64, (3, 11))
    with torch.inference_mode():
        logits, loss = m(idx, idx)
    assert logits.shape == (3, 11, 64)
    assert loss.shape == () and math.isfinite(loss.item())


@pytest.mark.parametrize("n_kv", SHARING)
def test_parameter_counts(n_kv):
    """Query-free saves d_model^2 per layer (n_head*d_head = d_model); K=V saves
    d_model * n_kv_heads * d_head per layer; q_eq_k saves the query (n_head*d_head*d_model);
    Q=K=V saves both."""
    dh = D // H
    base = tiny("qkv", n_kv).n_params()
    got = {v: tiny(v, n_kv).n_params() for v in VARIANTS}
    assert base - got["wq_identity"] == L * D * D
    assert base - got["k_eq_v"] == L * D * n_kv * dh
    assert base - got["q_eq_k"] == L * D * H * dh
    assert base - got["q_eq_k_eq_v"] == L * (D * H * dh + D * n_kv * dh)
    # the attention projections themselves, by hand: q (H*dh x D), k and v (n_kv*dh x D), o (D x H*dh)
    assert tiny("qkv", n_kv).n_attention_params() == L * (2 * H * dh * D + 2 * n_kv * dh * D)


@pytest.mark.parametrize("variant", VARIANTS)
def test_state_dict_holds_only_the_real_parameters(variant):
    keys = set(tiny(variant, 2).export_state_dict())
    attn = sorted(k.split(".")[3] for k in keys if k.startswith("blocks.0.attn.") and k.endswith(".weight"))
    assert attn == sorted((*PROJECTIONS[variant], "o"))
    assert "lm_head.weight" not in keys  # tied to wte, stored once


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("positions", ("learned", "rotary"))
def test_causal_masking(variant, positions):
    m = tiny(variant, 2, positions=positions)
    a = torch.randint(0, 64, (2, 12))
    b = a.clone()
    b[:, 7:] = (b[:, 7:] + 1) % 64  # change only the future of position 6
    with torch.inference_mode():
        la, _ = m(a)
        lb, _ = m(b)
    torch.testing.assert_close(la[:, :7], lb[:, :7], rtol=0, atol=1e-6)
    assert (la[:, 7:] - lb[:, 7:]).abs().max() > 1e-4


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n_kv, positions", [(4, "learned"), (2, "rotary"), (1, "learned"), (1, "rotary")])
def test_cached_decoding_equals_uncached(variant, n_kv, positions):
    m = tiny(variant, n_kv, positions=positions)
    idx = torch.randint(0, 64, (2, 13))
    with torch.inference_mode():
        full, _ = m(idx)
        cache = KVCache(L)
        parts = [m(idx[:, :5], cache=cache)[0]]          # a prompt chunk, then one token at a time
        parts += [m(idx[:, t:t + 1], cache=cache)[0] for t in range(5, 13)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-5, atol=1e-5)
    assert cache.length == 13


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n_kv", SHARING)
def test_cache_bytes_match_formula(variant, n_kv):
    """bytes/token = n_layers * n_cached * n_kv_heads * d_head * 4 (float32), n_cached 1 for K=V."""
    m = tiny(variant, n_kv)
    cache = KVCache(L)
    with torch.inference_mode():
        m(torch.randint(0, 64, (3, 10)), cache=cache)
    n_cached = 1 if variant in ("k_eq_v", "q_eq_k_eq_v", "q_eq_k_eq_v_plus") else 2
    expected = L * n_cached * n_kv * (D // H) * 4
    assert cache.bytes_per_token() == expected == m.cfg.kv_bytes_per_token(4)
    assert cache.nbytes() == expected * 3 * 10
    assert len(cache.layers[0]) == n_cached


def _copy_into(dst: GPT, src: GPT, mapping: dict[str, torch.Tensor]) -> None:
    sd = {k: v for k, v in src.state_dict().items() if ".attn." not in k or k.endswith("attn.o.weight")}
    sd.update(mapping)
    dst.load_state_dict(sd, strict=False)


@pytest.mark.parametrize("n_kv", (4, 1))
def test_tied_variants_equal_standard_model_with_tied_weights(n_kv):
    """Known answer: a qkv model whose W_Q = I (slice), or W_Q = W_K, or W_V = W_K
    computes exactly what the tied variant computes."""
    idx = torch.randint(0, 64, (2, 9))
    for variant in ("wq_identity", "q_eq_k", "k_eq_v", "q_eq_k_eq_v"):
        tied = tiny(variant, n_kv)
        ref = tiny("qkv", n_kv)
        mapping = {}
        for i, blk in enumerate(tied.blocks):
            a = blk.attn
            k = {"q_eq_k": a.qk.weight if variant == "q_eq_k" else None,
                 "k_eq_v": a.kv.weight if variant == "k_eq_v" else None,
                 "q_eq_k_eq_v": a.qkv.weight if variant == "q_eq_k_eq_v" else None,
                 "wq_identity": a.k.weight if variant == "wq_identity" else None}[variant]
            v = a.v.weight if variant in ("wq_identity", "q_eq_k") else k
            if variant == "wq_identity":
                q = torch.eye(D)
            elif variant in ("q_eq_k", "q_eq_k_eq_v"):
                q = k.view(n_kv, D // H, D).repeat_interleave(H // n_kv, 0).reshape(D, D)
            else:
                q = a.q.weight
            mapping.update({f"blocks.{i}.attn.q.weight": q, f"blocks.{i}.attn.k.weight": k,
                            f"blocks.{i}.attn.v.weight": v})
        _copy_into(ref, tied, mapping)
        with torch.inference_mode():
            torch.testing.assert_close(ref(idx)[0], tied(idx)[0], rtol=1e-5, atol=1e-5)


def test_attn_scale_is_used():
    a, b = tiny("wq_identity", 4), tiny("wq_identity", 4, attn_scale=1 / (2 * math.sqrt(D // H)))
    idx = torch.randint(0, 64, (1, 8))
    with torch.inference_mode():
        assert (a(idx)[0] - b(idx)[0]).abs().max() > 1e-5
    assert b.cfg.attn_scale == pytest.approx(1 / (2 * math.sqrt(8)))


@pytest.mark.parametrize("norm", ("layernorm", "rmsnorm", "none"))
def test_norms_and_mlp_ratio(norm):
    m = tiny("qkv", 4, norm=norm, mlp_ratio=3.5)
    assert m.blocks[0].mlp.fc.weight.shape == (round(3.5 * D), D)
    n_norm = {"layernorm": D, "rmsnorm": D, "none": 0}[norm]
    assert sum(p.numel() for p in m.blocks[0].ln_1.parameters()) == n_norm


def test_model_does_not_modify_inputs():
    m = tiny("k_eq_v", 2)
    idx = torch.randint(0, 64, (2, 6))
    before = idx.clone()
    with torch.inference_mode():
        m(idx, idx)
    assert torch.equal(idx, before)


@pytest.mark.parametrize("kw, message", [
    (dict(variant="qk"), "invalid GPTConfig: variant 'qk' is not one of qkv, wq_identity, q_eq_k, k_eq_v, q_eq_k_eq_v, q_eq_k_plus, q_eq_k_eq_v_plus"),
    (dict(n_kv_heads=3), "invalid GPTConfig: n_kv_heads 3 does not divide n_head 4"),
    (dict(variant="wq_identity", d_head=4),
     "invalid GPTConfig: wq_identity needs n_head * d_head == d_model, found 4 * 4 != 32"),
    (dict(norm="batchnorm"), "invalid GPTConfig: norm 'batchnorm' is not one of layernorm, rmsnorm, none"),
])
def test_invalid_config_messages(kw, message):
    with pytest.raises(ValueError) as e:
        GPTConfig(n_head=4, d_model=32, **kw)
    assert str(e.value) == message


def test_from_state_dict_lists_missing_and_unexpected():
    sd = tiny("qkv", 4).export_state_dict()
    cfg = GPTConfig(vocab_size=64, block_size=24, n_layer=L, n_head=H, d_model=D, variant="k_eq_v")
    with pytest.raises(KeyError) as e:
        GPT.from_state_dict(cfg, sd)
    assert e.value.args[0] == (
        "state dict does not match a k_eq_v model: missing ['blocks.0.attn.kv.weight', "
        "'blocks.1.attn.kv.weight'], unexpected ['blocks.0.attn.k.weight', 'blocks.0.attn.v.weight', "
        "'blocks.1.attn.k.weight', 'blocks.1.attn.v.weight']")


def test_generate_greedy_matches_argmax_of_full_forward():
    m = tiny("k_eq_v", 1, positions="rotary")
    idx = torch.randint(0, 64, (1, 4))
    out = m.generate(idx, 6, temperature=0)
    assert out.shape == (1, 10)
    with torch.inference_mode():
        logits, _ = m(out[:, :-1])
    assert torch.equal(logits[:, 3:].argmax(-1), out[:, 4:])
