"""Spectra of the projections: effective rank, stable rank, energy ranks.

For each of ``W_Q[h], W_K[g], W_V[g]`` (``[d_model, d_head]``), ``W_O[h]``
(``[d_head, d_model]``) and ``M_h = W_Q[h] W_K[g(h)]^T`` (``d_model x d_model``,
rank <= d_head), the singular values feed ``analysis._linalg.spectrum_stats``:
effective rank (Roy & Vetterli 2007), stable rank ``||A||_F^2 / ||A||_2^2`` and
the 90% / 99% energy ranks.

How: one batched Gram per projection and layer (``[heads, d_head, d_head]``),
one batched float64 eigen-decomposition; ``sv(M_h)^2 = eig(S_k G_q S_k)`` with
``G_q = Q^T Q`` and ``S_k = (K^T K)^{1/2}`` (polar decomposition:
``M = W_q S_q S_k W_k^T`` with partial isometries ``W``, so
``sv(M) = sv(S_q S_k)`` and ``(S_q S_k)^T (S_q S_k) = S_k G_q S_k``), so no
``d_model x d_model`` matrix is formed. The same routine serves the K and V
caches on sample tokens (``[kv_heads, tokens, d_head]``).

Per layer (``stacked_stats``): the layer's stacked ``[d_model, heads*d_head]``
matrix ``[A_0 | ... | A_{H-1}]`` from its ``heads*d_head`` square Gram. That
costs ``O((heads*d_head)^3)``: cheap for the K and V of a grouped-query model,
as dear as a full ``d_model x d_model`` decomposition for W_Q and W_O (the
layer analysis leaves those out and says why).
"""
from __future__ import annotations

import torch

from analysis._linalg import clean_eigh, gram, gram_eigvals, psd_sqrt, spectrum_stats, stack_heads


def gram_stats(g: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rank summaries of each matrix ``A`` whose Gram ``A^T A`` (or ``A A^T``) is in ``g: [..., n, n]``."""
    with torch.inference_mode():
        return spectrum_stats(gram_eigvals(g).sqrt())


def tall_stats(a: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rank summaries of each ``[rows, n]`` matrix in ``a: [heads, rows, n]`` (rows >= n)."""
    with torch.inference_mode():
        return gram_stats(gram(a.float()))


def wide_stats(a: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rank summaries of each ``[n, cols]`` matrix in ``a: [heads, n, cols]`` (W_O)."""
    with torch.inference_mode():
        a32 = a.float()
        return gram_stats(a32 @ a32.mT)


def stacked_stats(a: torch.Tensor) -> dict[str, float]:
    """Rank summaries of the layer's stacked ``[d_model, heads*d_head]`` matrix of
    ``a: [heads, d_model, d_head]`` (e.g. W_K of all kv heads), from its Gram;
    costs an ``O((heads*d_head)^3)`` eigen-decomposition."""
    with torch.inference_mode():
        g = gram(stack_heads(a))                               # [heads*d_head, heads*d_head]
        return {k: float(v) for k, v in gram_stats(g).items()}


def qk_stats(q: torch.Tensor, k: torch.Tensor, kv_of: torch.Tensor, *,
             gq: torch.Tensor | None = None,
             gk: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Rank summaries of ``M_h = Q_h K_{kv_of[h]}^T`` per query head.

    ``gq: [n_heads, d_head, d_head]``, ``gk: [n_kv_heads, d_head, d_head]``: the
    float32 Grams ``Q_h^T Q_h`` and ``K_g^T K_g`` if the caller has them.
    """
    with torch.inference_mode():
        gq = gram(q.float()) if gq is None else gq
        gk = gram(k.float()) if gk is None else gk
        return qk_stats_from(clean_eigh(gq), psd_sqrt(gk)[kv_of])


def qk_stats_from(eigh_q: tuple[torch.Tensor, torch.Tensor],
                  sk: torch.Tensor) -> dict[str, torch.Tensor]:
    """``qk_stats`` from ``clean_eigh(G_q)`` and ``S_k`` already gathered per query head
    (``[n_heads, d_head, d_head]``, float64): ``sv(M_h)^2 = eig(S_k G_q S_k)``.

    ``G_q`` is rebuilt from its cleaned eigenvalues, so a direction float32 cannot
    resolve in ``Q_h`` (or ``K``) gives an exact zero of ``M_h`` as it would in
    ``sv(S_q S_k)``; the product's own float64 round-off is cut at
    ``n * eps64 * lambda_max``.
    """
    with torch.inference_mode():
        lam, u = eigh_q
        gq = (u * lam.unsqueeze(-2)) @ u.mT                     # cleaned G_q, float64
        prod = sk @ gq @ sk                                    # [n_heads, d_head, d_head], PSD
        prod = (prod + prod.mT) / 2
        ev = torch.linalg.eigvalsh(prod)
        tol = prod.shape[-1] * torch.finfo(torch.float64).eps * ev[..., -1:].clamp_min(0)
        ev = torch.where(ev > tol, ev, torch.zeros_like(ev))
        return spectrum_stats(ev.sqrt())
