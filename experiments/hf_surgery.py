"""A Hugging Face causal LM's attention read as canonical layers and written back in place, for
``experiments.whatif``.

Two module families:

* GPT-2 (``GPT2Attention``): ``c_attn`` a Conv1D ``[d_model, 3 d_model]`` (``x @ W``: the
  OpenAI checkpoints use Conv1D, so no transpose), columns ``[Q | K | V]``, head ``h`` the
  columns ``h d_head .. (h+1) d_head`` of each; ``c_proj`` ``[d_model, d_model]``, rows per head.
* Llama-style (Llama, Mistral, Qwen2, ...: ``q_proj``/``k_proj``/``v_proj``/``o_proj``
  ``nn.Linear`` ``[out, in]``): ``W_K[g] = k_proj.weight.view(n_kv, d_head, d_model)[g].T``.

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
    """The per-layer attention modules of a GPT-2 or Llama-style causal LM, in layer order."""
    found = [m for m in model.modules() if hasattr(m, "c_attn") and hasattr(m, "c_proj")
             or all(hasattr(m, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))]
    normed = [type(m).__name__ for m in found if hasattr(m, "q_norm") or hasattr(m, "k_norm")]
    if normed:
        raise Unsupported(f"{normed[0]} normalises q and k (QK-norm), which these conversions do not carry")
    if not found:
        raise Unsupported(f"{type(model).__name__}: no GPT-2 (c_attn/c_proj) or Llama-style "
                          "(q_proj/k_proj/v_proj/o_proj) attention modules")
    return found


def geometry(model) -> tuple[int, int, int]:
    """``(n_heads, n_kv_heads, d_head)`` from the model's config."""
    c = model.config
    h = int(getattr(c, "num_attention_heads", None) or c.n_head)
    kv = int(getattr(c, "num_key_value_heads", None) or h)
    d = int(getattr(c, "hidden_size", None) or c.n_embd)
    dh = int(getattr(c, "head_dim", None) or d // h)
    return h, kv, dh


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

    def heads(lin, n):
        d = lin.weight.shape[1]
        w = lin.weight.detach().view(n, dh, d).transpose(1, 2).clone()     # [n, d, dh]
        return w, None if lin.bias is None else lin.bias.detach().view(n, dh).clone()

    (q, bq), (k, bk), (v, bv) = heads(mod.q_proj, H), heads(mod.k_proj, G), heads(mod.v_proj, G)
    wo = mod.o_proj.weight.detach().T.reshape(H, dh, -1).clone()              # [H, dh, d]
    bo = None if mod.o_proj.bias is None else mod.o_proj.bias.detach().clone()
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

        def put(lin, w, b):
            lin.weight.copy_(w.transpose(1, 2).reshape(-1, w.shape[1]))
            if lin.bias is not None:
                lin.bias.copy_(torch.zeros(lin.bias.shape) if b is None else b.reshape(-1))

        put(mod.q_proj, layer.W_Q, layer.b_Q)
        put(mod.k_proj, wk, bk)
        put(mod.v_proj, wv, bv)
        mod.o_proj.weight.copy_(layer.W_O.reshape(H * dh, -1).T)
