"""The variant model: shapes, parameter counts, causality, cache, known-answer equivalences."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

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


# ---- nanoGPT and the query-free fork, against a float64 reference --------------------

def _reference_nanogpt(sd: dict, idx: torch.Tensor, n_head: int, query_free: bool,
                       scale: float | None) -> torch.Tensor:
    """nanoGPT's forward written out with plain float64 ops (LayerNorm with bias, exact GELU)."""
    sd = {k: v.double() for k, v in sd.items()}
    d = sd["transformer.wte.weight"].shape[1]
    dh = d // n_head
    B, T = idx.shape
    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][:T]
    n_layer = 1 + max(int(k.split(".")[2]) for k in sd if k.startswith("transformer.h."))

    def ln(x, p):
        return F.layer_norm(x, (d,), sd[p + ".weight"], sd[p + ".bias"], 1e-5)

    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        h = ln(x, p + "ln_1")
        qkv = h @ sd[p + "attn.c_attn.weight"].T + sd[p + "attn.c_attn.bias"]
        if query_free:
            k, v = qkv.split(d, -1)
            q = h
        else:
            q, k, v = qkv.split(d, -1)
        q, k, v = (t.view(B, T, n_head, dh).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(dh))
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, d)
        x = x + y @ sd[p + "attn.c_proj.weight"].T + sd[p + "attn.c_proj.bias"]
        h = ln(x, p + "ln_2")
        h = F.gelu(h @ sd[p + "mlp.c_fc.weight"].T + sd[p + "mlp.c_fc.bias"])
        x = x + h @ sd[p + "mlp.c_proj.weight"].T + sd[p + "mlp.c_proj.bias"]
    return ln(x, "transformer.ln_f") @ sd["transformer.wte.weight"].T


def _nanogpt_sd(d=16, n_layer=2, vocab=40, block=12, rows=3) -> dict:
    g = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=g) * 0.2  # noqa: E731
    sd = {"transformer.wte.weight": r(vocab, d), "transformer.wpe.weight": r(block, d),
          "transformer.ln_f.weight": 1 + r(d), "transformer.ln_f.bias": r(d)}
    for i in range(n_layer):
        p = f"_orig_mod.transformer.h.{i}."
        sd.update({p + "ln_1.weight": 1 + r(d), p + "ln_1.bias": r(d),
                   p + "attn.c_attn.weight": r(rows * d, d), p + "attn.c_attn.bias": r(rows * d),
                   p + "attn.c_proj.weight": r(d, d), p + "attn.c_proj.bias": r(d),
                   p + "ln_2.weight": 1 + r(d), p + "ln_2.bias": r(d),
                   p + "mlp.c_fc.weight": r(4 * d, d), p + "mlp.c_fc.bias": r(4 * d),
                   p + "mlp.c_proj.weight": r(d, 4 * d), p + "mlp.c_proj.bias": r(d)})
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    return sd


@pytest.mark.parametrize("query_free, scale", [(False, None), (True, 1 / (2 * math.sqrt(8)))])
def test_from_nanogpt_matches_reference(query_free, scale):
    sd = _nanogpt_sd(rows=2 if query_free else 3)
    before = {k: v.clone() for k, v in sd.items()}
    m = GPT.from_nanogpt(sd, n_head=2, query_mode="identity" if query_free else "standard",
                         attn_scale=scale).eval()
    assert m.cfg.variant == ("wq_identity" if query_free else "qkv")
    idx = torch.randint(0, 40, (2, 12))
    with torch.inference_mode():
        got = m(idx)[0]
    ref = _reference_nanogpt({k.removeprefix("_orig_mod."): v for k, v in sd.items()}, idx, 2,
                             query_free, scale)
    torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4)
    assert all(torch.equal(sd[k], before[k]) for k in sd)


def test_from_nanogpt_wrong_rows_message():
    sd = _nanogpt_sd(rows=3)
    with pytest.raises(ValueError) as e:
        GPT.from_nanogpt(sd, n_head=2, query_mode="identity")
    assert str(e.value) == ("transformer.h.0.attn.c_attn.weight: expected 32 rows for "
                            "query_mode 'identity', found 48")


def test_from_nanogpt_realworld_checkpoint(realworld):
    """sqtian/GPT_by_Hand's nanoGPT ckpt.pt (2 layers, 2 heads, d 16): loads and predicts."""
    ck = torch.load(realworld / "checkpoints/nanogpt-gpt-by-hand/ckpt.pt", weights_only=True,
                    map_location="cpu")
    args = ck["model_args"]
    n_head = args.get("n_head", args.get("num_heads"))
    m = GPT.from_nanogpt(ck["model"], n_head=n_head).eval()
    assert (m.cfg.n_layer, m.cfg.n_head, m.cfg.d_model) == (2, 2, 16)
    idx = torch.randint(0, m.cfg.vocab_size, (1, min(8, m.cfg.block_size)))
    sd = {k.removeprefix("_orig_mod."): v for k, v in ck["model"].items()}
    if "transformer.h.0.attn.c_attn.bias" in sd:
        ref = _reference_nanogpt(sd, idx, n_head, False, None)
        with torch.inference_mode():
            torch.testing.assert_close(m(idx)[0].double(), ref, rtol=1e-4, atol=1e-4)
    else:
        with torch.inference_mode():
            assert torch.isfinite(m(idx)[0]).all()
