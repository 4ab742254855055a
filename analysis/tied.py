"""Which projections are tied, read from the tensors themselves (not from the layout).

A layout names a checkpoint's ``variant`` from its tensor names (``qkv`` for
``q_proj/k_proj/v_proj``); a model trained with ``q_proj = I`` or with
``v_proj`` copied from ``k_proj`` still has those names. This module compares
one layer's canonical tensors (``W_Q [n_heads, d_model, d_head]`` or None,
``W_K``, ``W_V [n_kv_heads, d_model, d_head]``):

* ``q_identity``: ``W_Q`` is None, or equals the identity slice (head ``h``
  reads ``x[:, h*d_head:(h+1)*d_head]``: ``W_Q[h][h*d_head + i, i] = 1``, else 0;
  needs ``n_heads * d_head == d_model``).
* ``q_eq_k``: ``W_Q[h] == W_K[h // group]`` for every query head (``group =
  n_heads / n_kv_heads``; MHA: head by head). ``q_eq_v`` likewise with ``W_V``.
  With ``W_Q`` None the query is the identity slice and is compared as such.
* ``k_eq_v``: ``W_K == W_V``.

**Equal to float tolerance**: ``||A - B||_F <= tol * max(||A||_F, ||B||_F)`` with
``tol = 8 * eps(dtype)`` of the stored dtype (float32: 9.5e-7, float16:
7.8e-3, bfloat16: 6.3e-2; two independent matrices differ by ~1.4). Sums are
float64 and run head by head (no float64 copy of a whole projection); two
all-zero matrices are equal. Each projection's norm is summed once per layer
for all four comparisons, and a comparison stops at the first head after which
the difference's partial sum is already past the tolerance (a sum of squares
only grows, so the decision is the whole difference's): untied projections are
told apart after one head.

``analysis.tie_names`` names a layer's ties and a checkpoint's with ``analysis.variants.VARIANTS``
(torch-free, so the dashboard names stored ties without importing torch).
"""
from __future__ import annotations

import math

import torch

#: Relative tolerance in units of the stored dtype's machine epsilon.
EPS_FACTOR = 8.0


def tolerance(dtype: str | torch.dtype) -> float:
    """``EPS_FACTOR * eps`` of a floating dtype (named as torch names it, ``"bfloat16"``)."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.replace("torch.", ""), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        dtype = torch.float32                                # the loaders' default storage
    return EPS_FACTOR * float(torch.finfo(dtype).eps)


def _identity_slice(h: int, d_model: int, d_head: int, device) -> torch.Tensor:
    """Head ``h``'s query-free W_Q: ``[d_model, d_head]`` with ``E[h*d_head + i, i] = 1``."""
    e = torch.zeros(d_model, d_head, dtype=torch.float64, device=device)
    e[h * d_head:(h + 1) * d_head] = torch.eye(d_head, dtype=torch.float64, device=device)
    return e


def _norm2(t: torch.Tensor) -> float:
    """``||t||_F^2`` summed in float64 (the stored dtype cast element by element, no copy kept)."""
    return float(torch.linalg.vector_norm(t, dtype=torch.float64)) ** 2


def _rel_diff(pairs, norms: tuple[float, float], stop_above: float | None = None) -> float:
    """``||A - B||_F / max(||A||_F, ||B||_F)`` over matrix pairs ``(A_i, B_i)`` taken
    together (one stacked A against one stacked B); 0 when both are zero, NaN when either holds
    a NaN. ``norms``:
    ``(sum_i ||A_i||_F^2, sum_i ||B_i||_F^2)``, which ``tied_layer`` computes once per projection
    (``_norm2``) for all its comparisons; ``pairs`` is read once, as far as needed.

    ``stop_above``: stop at the first pair after which the difference's partial sum already
    exceeds ``stop_above`` (it only grows), returning that partial value, which is above
    ``stop_above`` as the whole one is. So two untied projections are told apart after their
    first head (at a Llama-7B-shaped layer the four comparisons took 0.18-0.26 s, forming every
    head's difference in float64; now a few ms each).
    """
    if any(math.isnan(n) for n in norms):      # a NaN is equal to nothing (max() would drop it)
        return math.nan
    top2 = max(norms)
    if top2 == 0:
        return 0.0
    limit = math.inf if stop_above is None else stop_above ** 2 * top2
    diff2 = 0.0
    for a, b in pairs:
        diff2 += _norm2(a.to(torch.float64) - b.to(torch.float64))
        if diff2 > limit:
            break
    return diff2 ** 0.5 / top2 ** 0.5


def tied_layer(layer, meta, *, device: torch.device | str | None = None) -> dict:
    """Ties of one layer: ``{"layer", "q_identity", "q_eq_k", "k_eq_v", "q_eq_v"}`` (bools).

    ``layer``: canonical ``AttentionWeights`` (``W_Q`` may be None); ``meta``: its
    ``ModelMeta`` (``n_heads``, ``n_kv_heads``, ``d_model``, ``d_head``, ``dtype``; a
    ``query_module``, a nonlinear query, ties no query: all three query ties false).
    ``device``: where the comparisons run (default: where the tensors are).
    """
    tol = tolerance(meta.dtype)
    n_heads, n_kv, d_model, d_head = meta.n_heads, meta.n_kv_heads, meta.d_model, meta.d_head
    group = n_heads // n_kv
    with torch.inference_mode():
        k = layer.W_K if device is None else layer.W_K.to(device)   # [n_kv, d_model, d_head]
        v = layer.W_V if device is None else layer.W_V.to(device)   # [n_kv, d_model, d_head]
        dev = k.device
        slices = n_heads * d_head == d_model
        eye = lambda h: _identity_slice(h, d_model, d_head, dev)     # noqa: E731  (made when compared)
        k2, v2 = [_norm2(x) for x in k], [_norm2(x) for x in v]       # per kv head
        if getattr(meta, "query_module", None):                      # a nonlinear query: no W_Q to tie
            q_head, q2, q_identity = None, None, False
        elif layer.W_Q is None:
            q_head, q2 = (eye, [float(d_head)] * n_heads) if slices else (None, None)   # ||E_h||^2 = d_head
            q_identity = True
        else:
            q = layer.W_Q if device is None else layer.W_Q.to(device)   # [n_heads, d_model, d_head]
            q_head, q2 = q.__getitem__, [_norm2(x) for x in q]
            q_identity = slices and _rel_diff(((q[h], eye(h)) for h in range(n_heads)),
                                              (sum(q2), float(n_heads * d_head)), tol) <= tol
        out = {"layer": int(layer.layer), "q_identity": bool(q_identity)}
        for name, other, o2 in (("q_eq_k", k, k2), ("q_eq_v", v, v2)):
            out[name] = q_head is not None and _rel_diff(
                ((q_head(h), other[h // group]) for h in range(n_heads)),
                (sum(q2), sum(o2[h // group] for h in range(n_heads))), tol) <= tol
        out["k_eq_v"] = _rel_diff(zip(k, v), (sum(k2), sum(v2)), tol) <= tol
        # order the keys as documented
        return {key: out[key] for key in ("layer", "q_identity", "q_eq_k", "k_eq_v", "q_eq_v")}
