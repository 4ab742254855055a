"""Spectra of the projections: effective rank, stable rank, energy ranks.

For each of ``W_Q[h], W_K[g], W_V[g]`` (``[d_model, d_head]``), ``W_O[h]``
(``[d_head, d_model]``) and ``M_h = W_Q[h] W_K[g(h)]^T`` (``d_model x d_model``,
rank <= d_head), the singular values feed ``analysis._linalg.spectrum_stats``:
effective rank (Roy & Vetterli 2007), stable rank ``||A||_F^2 / ||A||_2^2`` and
the 90% / 99% energy ranks.

How: one batched Gram per projection and layer (``[heads, d_head, d_head]``),
one batched float64 ``eigvalsh``; ``sv(M_h) = sv(S_q S_k)`` with
``S = (A^T A)^{1/2}`` (polar decomposition), so no ``d_model x d_model``
matrix is formed. Also the K and V caches on sample tokens
(``[kv_heads, tokens, d_head]``, same routine).
"""
from __future__ import annotations

import torch

from analysis._linalg import gram, gram_eigvals, psd_sqrt, spectrum_stats


def tall_stats(a: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rank summaries of each ``[rows, n]`` matrix in ``a: [heads, rows, n]`` (rows >= n)."""
    with torch.inference_mode():
        return spectrum_stats(gram_eigvals(gram(a.float())).sqrt())


def wide_stats(a: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rank summaries of each ``[n, cols]`` matrix in ``a: [heads, n, cols]`` (W_O)."""
    with torch.inference_mode():
        a32 = a.float()
        return spectrum_stats(gram_eigvals(a32 @ a32.mT).sqrt())


def qk_stats(q: torch.Tensor, k: torch.Tensor, kv_of: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rank summaries of ``M_h = Q_h K_{kv_of[h]}^T`` per query head."""
    with torch.inference_mode():
        sq = psd_sqrt(gram(q.float()))                         # [n_heads, d_head, d_head]
        sk = psd_sqrt(gram(k.float()))[kv_of]                  # [n_heads, d_head, d_head]
        prod = sq @ sk                                         # float64, sv(prod) = sv(M_h)
        sv = torch.linalg.svdvals(prod)
        return spectrum_stats(sv)
