"""Spectra of the projections: effective rank, stable rank, energy ranks.

For each of ``W_Q[h], W_K[g], W_V[g]`` (``[d_model, d_head]``), ``W_O[h]``
(``[d_head, d_model]``) and ``M_h = W_Q[h] W_K[g(h)]^T`` (``d_model x d_model``,
rank <= d_head), the singular values feed ``analysis._linalg.spectrum_stats``:
effective rank (Roy & Vetterli 2007), stable rank ``||A||_F^2 / ||A||_2^2`` and
the 90% / 99% energy ranks.

How: one batched Gram per projection and layer (``[heads, d_head, d_head]``),
one batched eigen-decomposition; ``sv(M_h) = sv(S_q S_k)`` with
``S = (A^T A)^{1/2}`` (polar decomposition: ``M = W_q S_q S_k W_k^T`` with
partial isometries ``W``), so no ``d_model x d_model`` matrix is formed.

Precision: the Grams are accumulated in float64 from the float32 weights
(``_linalg.gram``), the decompositions and the ``d_head x d_head`` SVD of
``S_q S_k`` are float64, and only eigenvalues below ``n * eps64 * lambda_max``
are treated as zero: singular values down to ``~1e-7 sigma_max`` count, and
every statistic equals the float64 SVD of the matrix itself (of ``M_h`` formed
explicitly) to ~1e-9 relative at condition numbers up to 1e6. (Float32 Grams
lost the singular values below ~2e-3 sigma_max: erank 3.6% low at
condition 1300.) The same routine serves the K and V
caches on sample tokens (``[kv_heads, tokens, d_head]``).

Per layer (``stacked_stats``): the layer's stacked ``[d_model, heads*d_head]``
matrix ``[A_0 | ... | A_{H-1}]`` from its ``heads*d_head`` square Gram. That
costs ``O((heads*d_head)^3)``: cheap for the K and V of a grouped-query model,
as dear as a full ``d_model x d_model`` decomposition for W_Q and W_O (the
layer analysis leaves those out and says why).
"""
from __future__ import annotations

import torch

from analysis._linalg import (clean_eigh, gram, gram_eigvals, psd_sqrt, psd_sqrt_from, row_gram, small_svdvals,
                              spectrum_stats, stack_heads)


def gram_stats(g: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rank summaries of each matrix ``A`` whose Gram ``A^T A`` (or ``A A^T``) is in
    ``g: [..., n, n]`` (float64, or float32 at float32's resolution)."""
    with torch.inference_mode():
        return spectrum_stats(gram_eigvals(g).sqrt())


def tall_stats(a: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rank summaries of each ``[rows, n]`` matrix in ``a: [heads, rows, n]`` (rows >= n)."""
    with torch.inference_mode():
        return gram_stats(gram(a))


def wide_stats(a: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rank summaries of each ``[n, cols]`` matrix in ``a: [heads, n, cols]`` (W_O)."""
    with torch.inference_mode():
        return gram_stats(row_gram(a))


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
    Grams ``Q_h^T Q_h`` and ``K_g^T K_g`` (float64, ``_linalg.gram``) if the caller has them.
    """
    with torch.inference_mode():
        gq = gram(q) if gq is None else gq
        gk = gram(k) if gk is None else gk
        return qk_stats_from(clean_eigh(gq), psd_sqrt(gk)[kv_of])


def qk_stats_from(eigh_q: tuple[torch.Tensor, torch.Tensor],
                  sk: torch.Tensor) -> dict[str, torch.Tensor]:
    """``qk_stats`` from ``clean_eigh(G_q)`` and ``S_k`` already gathered per query head
    (``[n_heads, d_head, d_head]``, float64): ``sv(M_h) = sv(S_q S_k)``, one batched
    float64 SVD of ``d_head x d_head`` matrices.

    ``S_q`` is built from ``G_q``'s cleaned eigenvalues, so a direction the Gram does
    not resolve in ``Q_h`` (or ``K``) gives an exact zero of ``M_h``; the SVD's own
    round-off (``~eps64 * sigma_max``) is left as it is.
    """
    with torch.inference_mode():
        sq = psd_sqrt_from(eigh_q)                              # [n_heads, d_head, d_head], float64
        return spectrum_stats(small_svdvals(sq @ sk.to(torch.float64)))
