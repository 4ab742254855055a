"""How alike a head's keys and values are: flat cosine, linear CKA, sharing fit.

All three take stacks ``K, V: [heads, rows, d_head]``: the weights
(``rows = d_model``, one entry per kv head) or the K and V caches on sample
tokens (``rows = tokens``). They return ``[heads]`` float64 tensors; a value is
NaN where the formula divides by zero (an all-zero head), never a made-up 0.

* ``cosine_flat`` = ``<vec K, vec V> / (||K||_F ||V||_F)``: what the
  projection-sharing paper (arXiv 2606.04032) quotes. NOT invariant to a
  rotation of the head's output basis (``K R``, ``V R'``): a model whose K and V
  read the same input directions can score ~0. Label it as such.
* ``linear_cka`` = ``||K^T V||_F^2 / (||K^T K||_F ||V^T V||_F)`` (Kornblith et
  al. 2019, "Similarity of Neural Network Representations Revisited", eq. for
  linear CKA with rows as examples). Invariant to ``K -> K R``, ``V -> V R'``
  for orthogonal ``R, R'`` and to isotropic scaling. On activations the rows
  (tokens) are centred first, as in the paper; on weights they are not.
* ``share_r2`` = ``1 - min_T ||V - K T||_F^2 / ||V||_F^2 = ||P_K V||_F^2 / ||V||_F^2``
  with ``T = K^+ V`` and ``P_K`` the projector onto the columns of ``K``: how
  much of V a K=V tie keeps if the head may re-map its values with ``T``.
  ``||P_K V||^2 = sum_i (u_i^T K^T V)^2 / lambda_i`` over the eigenpairs of
  ``K^T K`` (float64), dropping eigenvalues float32 cannot resolve.
"""
from __future__ import annotations

import torch

from analysis._linalg import EPS32, gram


def _check(k: torch.Tensor, v: torch.Tensor) -> None:
    from analysis.errors import AnalysisError
    if k.dim() != 3 or k.shape != v.shape:
        raise AnalysisError(
            f"K/V similarity: expected K and V of one shape [heads, rows, d_head], "
            f"found {tuple(k.shape)} and {tuple(v.shape)}")


def cosine_flat(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``cos(vec K_h, vec V_h)`` per head, ``[heads]``."""
    _check(k, v)
    with torch.inference_mode():
        k32, v32 = k.float(), v.float()
        dot = (k32 * v32).sum((1, 2)).double()
        nk = k32.square().sum((1, 2)).double().sqrt()
        nv = v32.square().sum((1, 2)).double().sqrt()
        return dot / (nk * nv)


def linear_cka(k: torch.Tensor, v: torch.Tensor, *, center: bool = False) -> torch.Tensor:
    """Linear CKA per head, ``[heads]``; ``center=True`` centres the rows (activations)."""
    _check(k, v)
    with torch.inference_mode():
        k32, v32 = k.float(), v.float()
        if center:
            k32 = k32 - k32.mean(1, keepdim=True)   # [heads, rows, d_head]
            v32 = v32 - v32.mean(1, keepdim=True)
        kv = (k32.mT @ v32).double()                  # [heads, d_head, d_head]
        kk = gram(k32).double()
        vv = gram(v32).double()
        num = kv.square().sum((1, 2))
        return num / (kk.square().sum((1, 2)).sqrt() * vv.square().sum((1, 2)).sqrt())


def share_r2(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``||P_K V||_F^2 / ||V||_F^2`` per head, ``[heads]`` (R^2 of V regressed on K)."""
    _check(k, v)
    with torch.inference_mode():
        k32, v32 = k.float(), v.float()
        g = gram(k32).double()                        # [heads, d_head, d_head]
        c = (k32.mT @ v32).double()                   # K^T V, [heads, d_head, d_head]
        g = (g + g.mT) / 2
        lam, u = torch.linalg.eigh(g)                 # ascending
        tol = g.shape[-1] * EPS32 * lam[..., -1:].clamp_min(0)
        keep = lam > tol
        proj = u.mT @ c                               # [heads, d_head, d_head]
        inv = torch.where(keep, 1.0 / torch.where(keep, lam, torch.ones_like(lam)), torch.zeros_like(lam))
        explained = (proj.square().sum(-1) * inv).sum(-1)
        total = v32.square().sum((1, 2)).double()
        return (explained / total).clamp(max=1.0)
