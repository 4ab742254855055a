"""Activation-level metrics of one layer from tensors captured in a forward pass.

``activation_metrics(layer, k_cache, v_cache, logits)`` takes
``k_cache, v_cache: [n_kv_heads, tokens, d_head]`` (the K and V a KV cache
would hold for the sample tokens) and ``logits: [n_heads, tokens, tokens]``
(pre-softmax, before the causal mask; None when they could not be captured).
The capture itself (hooks on a model) lives in the app; this is pure math:

* ``kv_cka_act`` (tokens centred), ``kv_cosine_act``, ``kv_share_r2_act``:
  the formulas of ``analysis.kv_similarity`` with rows = tokens.
* ``logit_symmetry``: ``analysis.qk_geometry.matrix_symmetry`` per head and
  of the logits summed over heads (head None).
* ``erank_kcache``, ``erank_vcache``: effective rank (Roy & Vetterli 2007)
  of each ``[tokens, d_head]`` cache (``tokens >= d_head`` for a full count).

Returns the same ``(frame, notes)`` pair as ``analysis.weights.weight_metrics``.
"""
from __future__ import annotations

import pandas as pd
import torch

from analysis import kv_similarity, qk_geometry
from analysis._linalg import as_float32, singular_values, spectrum_stats
from analysis.errors import AnalysisError
from analysis.weights import _Rows, default_device


def activation_metrics(layer: int, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       logits: torch.Tensor | None, *, logits_reason: str | None = None,
                       device: str | torch.device | None = None) -> tuple[pd.DataFrame, dict[str, str]]:
    """Activation metrics of one layer (see module docstring)."""
    if k_cache.dim() != 3 or k_cache.shape != v_cache.shape:
        raise AnalysisError(
            f"layer {layer}: expected K and V caches of one shape [n_kv_heads, tokens, d_head], "
            f"found {list(k_cache.shape)} and {list(v_cache.shape)}")
    dev = torch.device(device or default_device())
    out = _Rows(layer)
    notes: dict[str, str] = {}
    with torch.inference_mode():
        k = as_float32(k_cache, dev)                 # [g, T, e]
        v = as_float32(v_cache, dev)
        out.heads("kv_cka_act", kv_similarity.linear_cka(k, v, center=True), kv=True)
        out.heads("kv_cosine_act", kv_similarity.cosine_flat(k, v), kv=True)
        out.heads("kv_share_r2_act", kv_similarity.share_r2(k, v), kv=True)
        for name, t in (("erank_kcache", k), ("erank_vcache", v)):
            if t.shape[1] >= t.shape[2]:
                sv = singular_values(t)
            else:                                     # fewer tokens than d_head: wide matrices
                sv = singular_values(t.mT)
            out.heads(name, spectrum_stats(sv)["erank"], kv=True)
        if logits is None:
            notes["logit_symmetry"] = logits_reason or "pre-softmax logits were not captured"
        else:
            lg = as_float32(logits, dev)             # [H, T, T]
            out.heads("logit_symmetry", qk_geometry.matrix_symmetry(lg))
            out.whole("logit_symmetry", float(qk_geometry.matrix_symmetry(lg.sum(0))))
    return out.frame(), notes
