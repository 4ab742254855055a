"""A Hugging Face model's attention (a causal LM's, or a ViT image classifier's) read as canonical layers and
written back in place, for ``experiments.whatif``.

Three module families:

* GPT-2 (``GPT2Attention``): ``c_attn`` a Conv1D ``[d_model, 3 d_model]`` (``x @ W``: the
  OpenAI checkpoints use Conv1D, so no transpose), columns ``[Q | K | V]``, head ``h`` the
  columns ``h d_head .. (h+1) d_head`` of each; ``c_proj`` ``[d_model, d_model]``, rows per head.
* GPT-NeoX (``GPTNeoXAttention``, Pythia): ``query_key_value`` an ``nn.Linear`` ``[3 d_model,
  d_model]`` whose outputs are grouped per head, ``[q_h | k_h | v_h]`` for head h (the forward's
  ``view(..., n_heads, 3 d_head).chunk(3)``): ``W_Q[h] = weight.view(H, 3, d_head, d)[h, 0].T``;
  ``dense`` ``[d_model, d_model]``. Rotary on the first ``rotary_pct`` of each head's dimensions.
* Llama-style (Llama, Mistral, Qwen2, Gemma, Gemma 2, and ViT image classifiers, whose attention
  transformers 5 builds with the same four projections, ...: ``q_proj``/``k_proj``/``v_proj``/``o_proj``
  ``nn.Linear`` ``[out, in]``): ``W_K[g] = k_proj.weight.view(n_kv, d_head, d_model)[g].T``
  (``d_head`` the config's ``head_dim`` where it has one: Gemma's is not ``d_model / n_heads``).

The converted model keeps the checkpoint's module shapes: a layer converted to fewer kv heads
is written with each pooled head repeated over the module's kv heads it replaces (query head h
then reads exactly the pooled head of its group: the same function as the smaller model), and a
K=V layer writes the same tensor twice. What the converted model would cache is counted from
the canonical layers (``experiments.whatif``), not from these shapes. Because the tie lives in
copies, not in one parameter, such a model is not healed or saved.
"""
from __future__ import annotations

import torch

from loaders.canonical import AttentionWeights


class Unsupported(ValueError):
    """A Hugging Face attention module this surgery does not read."""


def modules(model) -> list[torch.nn.Module]:
    """The per-layer attention modules of a GPT-2, GPT-NeoX, ViT or Llama-style model, in layer order."""
    found = [m for m in model.modules() if hasattr(m, "c_attn") and hasattr(m, "c_proj")
             or _neox(m) or all(hasattr(m, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))]
    fused = [type(m).__name__ for m in model.modules() if hasattr(m, "query_key_value") and not _neox(m)]
    if fused:
        raise Unsupported(f"{fused[0]}: a fused query_key_value whose layout is not GPT-NeoX's")
    normed = [type(m).__name__ for m in found if hasattr(m, "q_norm") or hasattr(m, "k_norm")]
    if normed:
        raise Unsupported(f"{normed[0]} normalises q and k (QK-norm), which these conversions do not carry")
    if not found:
        raise Unsupported(f"{type(model).__name__}: no GPT-2 (c_attn/c_proj), GPT-NeoX (query_key_value/dense) "
                          "or Llama-style (q_proj/k_proj/v_proj/o_proj) attention modules")
    return found


def _neox(m) -> bool:
    return type(m).__name__.startswith("GPTNeoX") and hasattr(m, "query_key_value") and hasattr(m, "dense")


def geometry(model) -> tuple[int, int, int]:
    """``(n_heads, n_kv_heads, d_head)`` from the model's config."""
    c = model.config
    h = int(getattr(c, "num_attention_heads", None) or c.n_head)
    kv = int(getattr(c, "num_key_value_heads", None) or h)
    d = int(getattr(c, "hidden_size", None) or c.n_embd)
    dh = int(getattr(c, "head_dim", None) or d // h)
    return h, kv, dh


def _linears(mod) -> tuple:
    """The query, key, value and output ``nn.Linear`` of a Llama-style attention module."""
    return mod.q_proj, mod.k_proj, mod.v_proj, mod.o_proj


def read(mod, i: int, geom: tuple[int, int, int]) -> AttentionWeights:
    """Layer ``i``'s canonical weights (copies, float32 as loaded)."""
    H, G, dh = geom
    if hasattr(mod, "c_attn"):
        w = mod.c_attn.weight.detach()                                       # [d, 3 H dh]
        d = w.shape[0]
        q, k, v = (w[:, j * H * dh:(j + 1) * H * dh].reshape(d, H, dh).transpose(0, 1).clone() for j in range(3))
        b = mod.c_attn.bias.detach() if mod.c_attn.bias is not None else None
        bq, bk, bv = (None,) * 3 if b is None else (b[j * H * dh:(j + 1) * H * dh].reshape(H, dh).clone() for j in range(3))
        wo = mod.c_proj.weight.detach().reshape(H, dh, d).clone()            # rows per head
        bo = None if mod.c_proj.bias is None else mod.c_proj.bias.detach().clone()
        return AttentionWeights(i, q, k, v, wo, bq, bk, bv, bo)
    if _neox(mod):
        w = mod.query_key_value.weight.detach()                               # [3 H dh, d]
        d = w.shape[1]
        w = w.view(H, 3, dh, d).transpose(2, 3)                               # [H, 3, d, dh]
        b = mod.query_key_value.bias
        b = None if b is None else b.detach().view(H, 3, dh)
        q, k, v = (w[:, j].clone() for j in range(3))
        bq, bk, bv = (None,) * 3 if b is None else (b[:, j].clone() for j in range(3))
        wo = mod.dense.weight.detach().T.reshape(H, dh, d).clone()
        bo = None if mod.dense.bias is None else mod.dense.bias.detach().clone()
        return AttentionWeights(i, q, k, v, wo, bq, bk, bv, bo)

    def heads(lin, n):
        d = lin.weight.shape[1]
        w = lin.weight.detach().view(n, dh, d).transpose(1, 2).clone()     # [n, d, dh]
        return w, None if lin.bias is None else lin.bias.detach().view(n, dh).clone()

    qp, kp, vp, op = _linears(mod)
    (q, bq), (k, bk), (v, bv) = heads(qp, H), heads(kp, G), heads(vp, G)
    wo = op.weight.detach().T.reshape(H, dh, -1).clone()                     # [H, dh, d]
    bo = None if op.bias is None else op.bias.detach().clone()
    return AttentionWeights(i, q, k, v, wo, bq, bk, bv, bo)


def write(mod, layer: AttentionWeights, geom: tuple[int, int, int]) -> None:
    """Write ``layer`` into ``mod`` in place (kv heads repeated up to the module's; module docstring)."""
    H, G, dh = geom
    rep = G // layer.W_K.shape[0]
    wk, wv = layer.W_K.repeat_interleave(rep, 0), layer.W_V.repeat_interleave(rep, 0)
    bk = None if layer.b_K is None else layer.b_K.repeat_interleave(rep, 0)
    bv = None if layer.b_V is None else layer.b_V.repeat_interleave(rep, 0)
    with torch.no_grad():
        if hasattr(mod, "c_attn"):
            d = wk.shape[1]
            mod.c_attn.weight.copy_(torch.cat([t.transpose(0, 1).reshape(d, H * dh) for t in (layer.W_Q, wk, wv)], 1))
            if mod.c_attn.bias is not None:
                mod.c_attn.bias.copy_(torch.cat([(torch.zeros(H, dh) if b is None else b).reshape(-1)
                                                 for b in (layer.b_Q, bk, bv)]))
            mod.c_proj.weight.copy_(layer.W_O.reshape(H * dh, d))
            return
        if _neox(mod):
            d = wk.shape[1]
            mod.query_key_value.weight.copy_(torch.stack([layer.W_Q, wk, wv], 1).transpose(2, 3).reshape(3 * H * dh, d))
            if mod.query_key_value.bias is not None:
                zero = torch.zeros(H, dh)
                mod.query_key_value.bias.copy_(torch.stack([zero if b is None else b for b in (layer.b_Q, bk, bv)], 1)
                                               .reshape(-1))
            mod.dense.weight.copy_(layer.W_O.reshape(H * dh, d).T)
            return

        def put(lin, w, b):
            lin.weight.copy_(w.transpose(1, 2).reshape(-1, w.shape[1]))
            if lin.bias is not None:
                lin.bias.copy_(torch.zeros(lin.bias.shape) if b is None else b.reshape(-1))

        qp, kp, vp, op = _linears(mod)
        put(qp, layer.W_Q, layer.b_Q)
        put(kp, wk, bk)
        put(vp, wv, bv)
        op.weight.copy_(layer.W_O.reshape(H * dh, -1).T)
