"""Hugging Face DeepSeek-V2 / V3 multi-head latent attention (MLA:
``DeepseekV2Attention``, ``DeepseekV3Attention``; also Kimi K2, a ``deepseek_v3``).

Keys (prefix ``model.`` or none), per layer ``layers.{i}.self_attn.``:

=====================================  ====================================  ==========
key                                    shape                                 symbol
=====================================  ====================================  ==========
``q_proj.weight`` (no q_lora_rank)     ``[n*(nope+rope), d]``                W_q
``q_a_proj.weight`` (+ ``.bias``)      ``[q_lora_rank, d]``                  W_dq
``q_a_layernorm.weight``               ``[q_lora_rank]``                     g_q
``q_b_proj.weight``                    ``[n*(nope+rope), q_lora_rank]``      W_uq
``kv_a_proj_with_mqa.weight`` (+bias)  ``[kv_lora_rank + rope, d]``          [W_dkv; W_kr]
``kv_a_layernorm.weight``              ``[kv_lora_rank]``                    g_kv
``kv_b_proj.weight``                   ``[n*(nope+v), kv_lora_rank]``        per head [W_uk; W_uv]
``o_proj.weight`` (+ ``.bias``)        ``[d, n*v]``                          W_o
=====================================  ====================================  ==========

The layer computes (x a row, rms(c) = sqrt(mean(c^2) + eps)):
``c = x W_dkv^T`` (the cached latent, before its norm), ``k_rope = x W_kr^T`` (one
rotary key of ``rope`` dims shared by every head, cached beside c),
``k_h = [(g_kv * c / rms(c)) W_uk_h^T | rope(k_rope)]``,
``v_h = (g_kv * c / rms(c)) W_uv_h^T``; the query likewise through ``W_dq``, ``g_q``,
``W_uq`` (or ``W_q``), split per head into ``[nope | rope]``.

Canonical form (the composed maps, n_kv_heads = n_heads):

* ``W_K[h] = [W_dkv^T diag(g_kv) W_uk_h^T | W_kr^T]`` ``[d, nope+rope]``: the
  position-free part composed through the latent, then the shared rotary key
  un-rotated (the same ``rope`` columns in every head), as every rotary layout
  here keeps keys before rotation (DeepSeek-V3's ``rope_interleave`` permutes
  q_rope and k_rope alike, so q.k is unchanged).
* ``W_V[h] = W_dkv^T diag(g_kv) W_uv_h^T`` ``[d, v]``; ``W_Q[h] = W_dq^T diag(g_q)
  W_uq_h^T`` (or ``W_q`` per head) ``[d, nope+rope]``; ``W_O[h] = W_o[:, h*v:(h+1)*v]^T``.
* The latent RMSNorms are folded in as their gains; their per-token ``1/rms``
  is left out: it is one positive number per token shared by every head's K and
  V (and, for ``g_q``, every query), so x W_K[h] is the model's key times
  rms(c) exactly. Biases of ``q_a_proj``/``kv_a_proj_with_mqa`` go through the same
  maps (``b_K[h] = [(b_dkv * g_kv) W_uk_h^T | b_kr]``).
* ``d_head = max(nope + rope, v)``: the narrower side is zero-padded (``W_V``
  and ``W_O``'s rows when v is narrower, ``W_Q``/``W_K`` otherwise). Zero columns
  change no CKA, R^2, rank, norm or logit; the flat cosine and the chance levels
  (drawn at the padded width) are noted.
* Composed in float32 (float64 for a float64 source), one layer at a time.

``meta.latent`` records the real geometry; ``kv_bytes_per_token`` is what MLA
caches, ``n_layers * (kv_lora_rank + rope) * bytes``, and ``meta.notes`` says which
metrics are computed on the composed maps. ``attn_scale = (nope+rope) ** -0.5``,
times ``mscale ** 2`` under YaRN (``0.1 * mscale_all_dim * ln(factor) + 1``,
``yarn_get_mscale``).
Source: transformers ``models/deepseek_v3/modeling_deepseek_v3.py`` (``DeepseekV3Attention``),
DeepSeek-V2 (arXiv 2405.04434) section 2.1.
"""
from __future__ import annotations

import math

import torch

from loaders.canonical import AttentionWeights, Latent
from loaders.layouts import _common as C

NAME = "deepseek_mla"
PRIORITY = 30
MODEL_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "kimi_k2"})
ARCHITECTURES = ("DeepseekV2", "DeepseekV3")

_RX = r"^(?P<p>(?:.*\.)?)layers\.(?P<i>\d+)\.self_attn\.kv_a_proj_with_mqa\.weight$"


def detect(source) -> bool:
    return C.keys_match(source, MODEL_TYPES, _RX)


def _notes(lat: Latent, dh: int) -> dict[str, str]:
    comp = ("computed on the composed maps W_K[h] = W_dkv^T diag(g_kv) W_uk[h]^T with the shared "
            "rotary key W_kr^T appended (columns {nope}..{qk}, equal in every head) and W_V[h] = "
            "W_dkv^T diag(g_kv) W_uv[h]^T, from one latent of rank {r} (the latent norm's per-token "
            "1/rms left out)").format(nope=lat.nope_dim, qk=lat.nope_dim + lat.rope_dim - 1,
                                      r=lat.kv_lora_rank)
    pad = (f"; zero-padded to d_head {dh} (value width {lat.v_dim}, key width "
           f"{lat.nope_dim + lat.rope_dim}): the chance level is drawn at the padded width")
    notes = {m: comp + pad for m in C.metrics_reading("K", "V")}
    q = (f"computed on the composed W_Q[h] = W_dq^T diag(g_q) W_uq[h]^T (q_lora_rank "
         f"{lat.q_lora_rank})" if lat.q_lora_rank else "computed on W_Q = q_proj per head")
    for m in C.metrics_reading("Q"):
        notes[m] = q + " and the composed W_K (see kv_cka)"
    notes["kv_cosine_flat"] += "; the flat cosine also compares K's rotary columns with V's padding"
    return notes


def _mscale(source) -> float:
    rope = C.cfg(source, "rope_parameters", "rope_scaling", default=None)
    if not isinstance(rope, dict) or rope.get("rope_type", rope.get("type", "default")) == "default":
        return 1.0
    m, factor = rope.get("mscale_all_dim") or 0, rope.get("factor") or 1.0
    return (0.1 * float(m) * math.log(float(factor)) + 1.0) if m and factor > 1 else 1.0


def convert(source):
    keys = source.keys()
    have = set(keys)
    p, layers = C.find_layers(source, _RX, keys)
    C.check_layers(source, len(layers), C.cfg(source, "num_hidden_layers"))
    first = f"{p}layers.0.self_attn.kv_a_proj_with_mqa.weight"
    d = C.cfg_int(source, "hidden_size", default=source.shape(first)[1])
    n = C.need_int(source, C.cfg(source, "num_attention_heads"), "head count", ("num_attention_heads",))
    need = {f: C.need_int(source, C.cfg(source, f), f, (f,))
            for f in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")}
    r, rope, nope, v = (need[f] for f in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                                          "v_head_dim"))
    q_rank = C.cfg_int(source, "q_lora_rank")
    qk = nope + rope
    dh = max(qk, v)
    lat = Latent(kv_lora_rank=r, q_lora_rank=q_rank, rope_dim=rope, nope_dim=nope, v_dim=v)
    why = (f"d_model {d}, {n} heads, kv_lora_rank {r}, q_lora_rank {q_rank}, "
           f"nope/rope/v dims {nope}/{rope}/{v}")

    def k(i, name):
        return f"{p}layers.{i}.self_attn.{name}"

    q_parts = ({"q_a_proj.weight": (q_rank, d), "q_a_layernorm.weight": (q_rank,),
                "q_b_proj.weight": (n * qk, q_rank)} if q_rank else {"q_proj.weight": (n * qk, d)})
    shapes = {**q_parts, "kv_a_proj_with_mqa.weight": (r + rope, d), "kv_a_layernorm.weight": (r,),
              "kv_b_proj.weight": (n * (nope + v), r), "o_proj.weight": (d, n * v)}
    biases = {"q_a_proj.bias": (q_rank,), "kv_a_proj_with_mqa.bias": (r + rope,), "o_proj.bias": (d,)}
    C.require(source, [k(i, s) for i in layers for s in shapes], have, NAME)
    attn_keys = []
    for i in layers:
        for s, shape in shapes.items():
            C.expect_shape(source, k(i, s), shape, i, why)
            if "norm" not in s:
                attn_keys.append(k(i, s))
        for s, shape in biases.items():
            if k(i, s) in have:
                C.expect_shape(source, k(i, s), shape, i, why)
                attn_keys.append(k(i, s))
    geom = C.Geometry(len(layers), n, n, d, dh)
    meta = C.make_meta(source, architecture=NAME, variant="qkv", geom=geom, norm="rmsnorm",
                       positions="rotary", attn_scale=qk ** -0.5 * _mscale(source) ** 2,
                       dtype_key=first, attention_keys=attn_keys, latent=lat, notes=_notes(lat, dh))
    get = C.getter(source, have)

    def build(i: int) -> AttentionWeights:
        # float32 products (float64 for a float64 source): a V3 layer's composed maps are
        # 128 heads x 7168 x 192, 0.7 GB each in float32
        wdt = out = torch.float64 if source.dtype(first) == "float64" else torch.float32
        kva = get(k(i, "kv_a_proj_with_mqa.weight")).to(wdt)          # [r + rope, d]
        w_dkv, w_kr = kva[:r], kva[r:]                                 # [r, d], [rope, d]
        g_kv = get(k(i, "kv_a_layernorm.weight")).to(wdt)              # [r]
        kvb = get(k(i, "kv_b_proj.weight")).to(wdt).reshape(n, nope + v, r)   # (n, nope+v, r)
        w_uk, w_uv = kvb[:, :nope], kvb[:, nope:]                      # (n, nope, r), (n, v, r)
        down = w_dkv.T * g_kv                                          # (d, r): W_dkv^T diag(g)
        k_nope = torch.einsum("dr,hnr->hdn", down, w_uk)               # (n, d, nope)
        w_k = torch.cat([k_nope, w_kr.T.expand(n, d, rope)], dim=2)    # (n, d, nope+rope)
        w_v = torch.einsum("dr,hvr->hdv", down, w_uv)                  # (n, d, v)
        if q_rank:
            g_q = get(k(i, "q_a_layernorm.weight")).to(wdt)
            q_down = get(k(i, "q_a_proj.weight")).to(wdt).T * g_q      # (d, q_rank)
            w_uq = get(k(i, "q_b_proj.weight")).to(wdt).reshape(n, qk, q_rank)
            w_q = torch.einsum("dr,hqr->hdq", q_down, w_uq)            # (n, d, qk)
        else:
            w_q = C.rows_to_heads(get(k(i, "q_proj.weight")).to(wdt), n, qk)
        w_o = C.cols_to_heads(get(k(i, "o_proj.weight")).to(wdt), n, v)   # (n, v, d)
        b_q = b_k = b_v = None
        b_kva = get(k(i, "kv_a_proj_with_mqa.bias"))
        if b_kva is not None:
            b_kva = b_kva.to(wdt)
            b_c = b_kva[:r] * g_kv                                     # [r]
            b_k = torch.cat([torch.einsum("r,hnr->hn", b_c, w_uk),
                             b_kva[r:].expand(n, rope)], dim=1)        # (n, nope+rope)
            b_v = torch.einsum("r,hvr->hv", b_c, w_uv)                 # (n, v)
        b_qa = get(k(i, "q_a_proj.bias")) if q_rank else None
        if b_qa is not None:
            b_q = torch.einsum("r,hqr->hq", b_qa.to(wdt) * g_q, w_uq)  # (n, qk)
        bo = get(k(i, "o_proj.bias"))

        def pad(t, width, dim):                                        # zero columns up to d_head
            if t is None or t.shape[dim] == dh:
                return None if t is None else t.to(out).contiguous()
            shape = list(t.shape)
            shape[dim] = dh - width
            return torch.cat([t, t.new_zeros(shape)], dim=dim).to(out)

        return AttentionWeights(
            layer=i, W_Q=pad(w_q, qk, 2), W_K=pad(w_k, qk, 2), W_V=pad(w_v, v, 2),
            W_O=pad(w_o, v, 1), b_Q=pad(b_q, qk, 1), b_K=pad(b_k, qk, 1), b_V=pad(b_v, v, 1),
            b_O=None if bo is None else C.fresh(bo))

    return meta, C.layer_fn(build)
