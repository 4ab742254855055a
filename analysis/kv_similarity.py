"""How alike a head's keys and values are: flat cosine, linear CKA, sharing fit.

All three take stacks ``K, V: [heads, rows, d_head]``: the weights
(``rows = d_model``, one entry per kv head) or the K and V caches on sample
tokens (``rows = tokens``). They return ``[heads]`` float64 tensors; a value is
NaN where the formula divides by zero (an all-zero head), never a made-up 0.

* ``cosine_flat`` = ``<vec K, vec V> / (||K||_F ||V||_F)``: what the
  projection-sharing paper (arXiv 2606.04032) quotes. NOT invariant to a
  rotation of the head's output basis (``K R``, ``V R'``): a model whose K and V
  read the same input directions can score ~0. Label it as such.
* ``cosine_layer`` = ``cos(vec [W_K; b_K], vec [W_V; b_V])`` of a whole layer: every kv head's
  K and V flattened together with the biases, as the projection-sharing paper's
  ``kv_similarity_llm.py`` (``weight_cosine_kv``) computes it; the same caveat as ``cosine_flat``.
* ``linear_cka`` = ``||K^T V||_F^2 / (||K^T K||_F ||V^T V||_F)`` (Kornblith et
  al. 2019, "Similarity of Neural Network Representations Revisited", eq. for
  linear CKA with rows as examples). Invariant to ``K -> K R``, ``V -> V R'``
  for orthogonal ``R, R'`` and to isotropic scaling. On activations the rows
  (tokens) are centred first, as in the paper; on weights they are not.
* ``share_r2`` = ``1 - min_T ||V - K T||_F^2 / ||V||_F^2 = ||P_K V||_F^2 / ||V||_F^2``
  with ``T = K^+ V`` and ``P_K`` the projector onto the columns of ``K``: how
  much of V a K=V tie keeps if the head may re-map its values with ``T``.
  ``||P_K V||^2 = sum_i (u_i^T K^T V)^2 / lambda_i`` over the eigenpairs of
  ``K^T K`` (float64), dropping the eigenvalues the products do not resolve
  (below ``d_head * eps * lambda_max``, ``eps`` of the products' dtype,
  ``_linalg.clean_eigh``).

All three need only the ``d_head x d_head`` products ``K^T K``, ``V^T V`` and
``K^T V`` (``<vec K, vec V> = tr(K^T V)``, ``||K||_F^2 = tr(K^T K)``): a caller
computing several of them forms these once (``products``) and passes them in,
or passes its own ``KVProducts`` (e.g. float64 sufficient statistics summed
over batches of an activation cache).

Precision: ``products`` accumulates in float64 from the (float32) data, so
eigenvalues of ``K^T K`` down to ``~d_head * eps64 * lambda_max`` are kept:
``share_r2`` equals a float64 least-squares fit (QR of ``K``) to ~1e-6
relative at condition number 1e6 of ``K`` (its error grows as
``eps64 * cond(K)^2``; measured 5e-6 at d_model 256, d_head 32). Float32 products
are still accepted, at float32's resolution (``cond(K)`` up to ~1e3).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from analysis._linalg import clean_eigh, grams_and_cross
from analysis.errors import AnalysisError


class KVProducts(NamedTuple):
    """The products of a K/V pair ``[heads, rows, d_head]``, ``[heads, d_head, d_head]`` each.

    float64 as ``products`` makes them; any float dtype is accepted (computed in
    float64, unresolved eigenvalues judged by the dtype's epsilon).
    """

    kk: torch.Tensor      # K^T K
    vv: torch.Tensor      # V^T V
    kv: torch.Tensor      # K^T V


def _check(k: torch.Tensor, v: torch.Tensor) -> None:
    if k.dim() != 3 or k.shape != v.shape:
        raise AnalysisError(
            f"K/V similarity: expected K and V of one shape [heads, rows, d_head], "
            f"found {tuple(k.shape)} and {tuple(v.shape)}")


def products(k: torch.Tensor, v: torch.Tensor) -> KVProducts:
    """``K^T K``, ``V^T V``, ``K^T V`` per head (rows as given, not centred), float64
    from the data as given (converted exactly, never rounded to float32 first)."""
    _check(k, v)
    with torch.inference_mode():
        return KVProducts(*grams_and_cross(k, v))


def cosine_flat(k: torch.Tensor, v: torch.Tensor, *, prod: KVProducts | None = None) -> torch.Tensor:
    """``cos(vec K_h, vec V_h)`` per head, ``[heads]``; ``prod``: ``products(k, v)`` (float64 or
    float32 ``KVProducts``) if the caller has it."""
    _check(k, v)
    with torch.inference_mode():
        p = products(k, v) if prod is None else prod
        dot = torch.diagonal(p.kv, dim1=1, dim2=2).double().sum(1)      # tr(K^T V)
        nk = torch.diagonal(p.kk, dim1=1, dim2=2).double().sum(1).sqrt()
        nv = torch.diagonal(p.vv, dim1=1, dim2=2).double().sum(1).sqrt()
        return dot / (nk * nv)


def cosine_layer(prod: KVProducts, b_k: torch.Tensor | None = None, b_v: torch.Tensor | None = None) -> float:
    """``cos(vec [W_K; b_K], vec [W_V; b_V])`` of a layer (module docstring): ``(sum_g tr(K_g^T V_g)
    + <b_K, b_V>) / sqrt((sum_g tr(K_g^T K_g) + ||b_K||^2) (sum_g tr(V_g^T V_g) + ||b_V||^2))`` from
    the per-head ``prod`` (float64) and the biases ``[n_kv_heads, d_head]`` (None: none); NaN
    where a side is all zero."""
    with torch.inference_mode():
        tr = lambda a: float(torch.diagonal(a, dim1=1, dim2=2).double().sum())   # noqa: E731
        dot, kk, vv = tr(prod.kv), tr(prod.kk), tr(prod.vv)
        if b_k is not None:
            kk += float(b_k.double().square().sum())
        if b_v is not None:
            vv += float(b_v.double().square().sum())
        if b_k is not None and b_v is not None:
            dot += float((b_k.double() * b_v.double()).sum())
        den = (kk * vv) ** 0.5
        return dot / den if den > 0 else float("nan")


def linear_cka(k: torch.Tensor, v: torch.Tensor, *, center: bool = False,
               prod: KVProducts | None = None) -> torch.Tensor:
    """Linear CKA per head, ``[heads]``; ``center=True`` centres the rows (activations).
    ``prod``: ``products`` (float64 or float32) of the (centred, if ``center``) K and V
    if the caller has it; centring is then the caller's."""
    _check(k, v)
    with torch.inference_mode():
        if prod is None:
            if center:                                  # centred in float64: [heads, rows, d_head]
                k, v = k.double(), v.double()
                k, v = k - k.mean(1, keepdim=True), v - v.mean(1, keepdim=True)
            prod = products(k, v)
        kv, kk, vv = prod.kv.double(), prod.kk.double(), prod.vv.double()
        num = kv.square().sum((1, 2))
        return num / (kk.square().sum((1, 2)).sqrt() * vv.square().sum((1, 2)).sqrt())


def share_r2(k: torch.Tensor, v: torch.Tensor, *, prod: KVProducts | None = None,
             eig_k: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """``||P_K V||_F^2 / ||V||_F^2`` per head, ``[heads]`` (R^2 of V regressed on K);
    ``prod = products(k, v)`` (float64 or float32 ``KVProducts``) and
    ``eig_k = _linalg.clean_eigh(prod.kk)`` if the caller has them."""
    _check(k, v)
    with torch.inference_mode():
        p = products(k, v) if prod is None else prod
        c = p.kv.double()                             # K^T V, [heads, d_head, d_head]
        lam, u = clean_eigh(p.kk) if eig_k is None else eig_k   # ascending; unresolved ones are 0
        keep = lam > 0
        proj = u.mT @ c                               # [heads, d_head, d_head]
        inv = torch.where(keep, 1.0 / torch.where(keep, lam, torch.ones_like(lam)), torch.zeros_like(lam))
        explained = (proj.square().sum(-1) * inv).sum(-1)
        total = torch.diagonal(p.vv, dim1=1, dim2=2).double().sum(1)   # ||V||_F^2
        return (explained / total).clamp(max=1.0)
