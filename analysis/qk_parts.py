"""Routing and filtering: the symmetric and skew-symmetric parts of each head's ``M_h = Q_h K_{g(h)}^T``.

Attention logits are ``x_i M x_j^T`` with ``M = Q K^T`` (``Q, K``: one head's
``[d_model, d_head]`` matrices; for GQA query head ``h`` reads kv head
``g(h) = h // (n_heads / n_kv_heads)``; a query-free head's ``Q`` is its identity
slice ``E_h``). ``M`` splits into two parts that are orthogonal in the
Frobenius inner product:

* ``S = (M + M^T) / 2``, symmetric: ``x_i S x_j = x_j S x_i``, the score two
  tokens give each other alike ("filtering": it scales mutual relevance);
* ``A = (M - M^T) / 2``, skew-symmetric: ``x_i A x_j = -x_j A x_i``, a
  preference of one direction over the other ("routing": it moves information
  from one position to another).

Source: Jamil & Kapadia 2026, "The Routing and Filtering Structure of
Attention", arXiv 2605.18826 (the words "routing" and "filtering" for these
two parts; they report routing at low effective rank, about 2 in the first
layer). Only the paper's abstract was available here, not its own formulas
for the effective rank and the energy share, so the metrics use qkvscope's:

* ``erank_qk_sym = erank(S)``, ``erank_qk_skew = erank(A)``: the effective rank
  of every qkvscope spectrum (Roy & Vetterli 2007; ``p_i = sigma_i / sum sigma``,
  ``exp(-sum p_i log p_i)``, ``analysis._linalg.spectrum_stats``). A real skew
  matrix has eigenvalues ``+-i sigma``, so ``A``'s singular values come in equal
  pairs, one pair per plane it rotates: a routing part of one plane reads
  exactly 2, of ``r`` equal planes ``2r``.
* ``energy_qk_skew = ||A||_F^2 / ||M||_F^2``. As ``<S, A>_F = 0``,
  ``||M||^2 = ||S||^2 + ||A||^2``, so it is ``1 - qk_symmetry`` (Saponati et
  al.'s symmetry score ``||S||^2 / ||M||^2``, ``analysis.qk_geometry``)
  ``= (1 - tr(M^2) / ||M||_F^2) / 2``: 0 symmetric (Q = K), ``(1 - 1/d_model) / 2``
  random, 1 antisymmetric. It is computed from the same float64 traces.

**In the head's subspace** (no ``d_model x d_model`` matrix): with
``X = [t Q, K / t]`` (``d_model x 2 d_head``; ``t^2 = sqrt(||K||_F^2 / ||Q||_F^2)``
balances the two halves, which leaves ``M`` unchanged and keeps the round-off of
both at the same scale), ``M = X J X^T`` with ``J = [[0, I], [0, 0]]``. For any
``F`` with ``F F^T = G = X^T X`` (``2 d_head`` square), ``X = W F^T`` with ``W``
an isometry on ``X``'s range, so ``S`` and ``A`` have the nonzero singular
values of the symmetric and skew parts of ``B = F^T J F = F_1^T F_2`` (``F_1``,
``F_2``: ``F``'s first and last ``d_head`` rows), ``2 d_head`` square; ``B``
itself has ``M``'s. ``G``'s blocks, ``t^2 Q^T Q``, ``Q^T K``, ``K^T K / t^2``,
are the float64 Grams and cross products the other metrics of ``M`` share
(``analysis.products``), so this costs nothing of size ``d_model``. ``F``: the
Cholesky factor of ``G``; where ``G`` is singular to working precision (``Q``
and ``K`` spanning common directions: Q = K, an identity query inside K's
span), its cleaned eigen-decomposition ``U diag(sqrt(lam))``
(``_linalg.clean_eigh``). Then ``eigvalsh`` of ``sym(B)`` and of the Gram
``skew(B)^T skew(B)`` (one batched call; the Gram keeps ``A``'s singular values down to
``~1e-8`` of its largest, as every Gram-based spectrum here does, at 0.6x the cost of
``svdvals``).

**Cost** per query head: one Cholesky, two ``eigvalsh`` and a product of
``2 d_head x 2 d_head`` float64 matrices, 2-3x the ``d_head``-sized eigen-decomposition
and SVD behind ``erank_qk``.

**Precision**: the Grams are float64 from the float32 weights, the
factorisations float64. A singular value of ``S`` or ``A`` below
``2 d_head * eps64 * tr(G)`` is round-off of ``B``'s entries and set to 0 (``1e-13``
to ``1e-11`` of ``M``'s largest singular value for ``d_head`` 16 to 128): a Q = K head's
``A`` is exactly 0, its ``erank_qk_skew`` undefined (NaN, flagged degenerate), and
likewise an antisymmetric head's ``S`` and ``erank_qk_sym``.
``tests/analysis/test_precision.py`` holds all three to 1e-3 of a float64
reference on explicit ``d_model x d_model`` matrices at condition numbers up to 1e6.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from analysis._linalg import EPS64, clean_eigh, small_eigvalsh, spectrum_stats


class Parts(NamedTuple):
    """Per query head: the rank summaries (``spectrum_stats``) of ``S`` and ``A``, and whether ``S``
    (``M_h`` antisymmetric: no filtering part) or ``A`` (``M_h`` symmetric: no routing part) is 0 to
    working precision."""

    sym: dict[str, torch.Tensor]
    skew: dict[str, torch.Tensor]
    no_sym: torch.Tensor
    no_skew: torch.Tensor


def head_space(gq: torch.Tensor, gk: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``G = X^T X`` of ``X = [t Q, K / t]`` per head (module docstring), ``[n, 2e, 2e]`` float64.

    ``gq = Q_h^T Q_h``, ``gk = K_{g(h)}^T K_{g(h)}`` (gathered per query head) and
    ``c = K_{g(h)}^T Q_h``, each ``[n, e, e]`` float64.
    """
    tq = torch.diagonal(gq, dim1=-2, dim2=-1).sum(-1)              # ||Q||_F^2, [n]
    tk = torch.diagonal(gk, dim1=-2, dim2=-1).sum(-1)              # ||K||_F^2
    t2 = (tk / tq).sqrt()
    t2 = torch.where(torch.isfinite(t2) & (t2 > 0), t2, torch.ones_like(t2))[:, None, None]
    top = torch.cat([gq * t2, c.mT], -1)                          # [n, e, 2e]: t^2 Q^T Q, Q^T K
    bottom = torch.cat([c, gk / t2], -1)                          # [n, e, 2e]: K^T Q, K^T K / t^2
    return torch.cat([top, bottom], -2)


def factor(g: torch.Tensor) -> torch.Tensor:
    """``F`` with ``F F^T = g`` for PSD stacks ``[n, m, m]`` (float64): the Cholesky factor, or, for
    the matrices whose Cholesky fails (singular to working precision), ``U diag(sqrt(lam))`` of
    their cleaned eigen-decomposition."""
    f, info = torch.linalg.cholesky_ex(g)
    bad = info != 0
    if bool(bad.any()):
        lam, u = clean_eigh(g[bad])
        f = f.clone()
        f[bad] = u * lam.sqrt().unsqueeze(-2)
    return f


def part_values(gq: torch.Tensor, gk: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Singular values of ``S_h`` and of ``A_h`` per head (each ``[n, 2e]`` float64, ascending for ``A``), the
    unresolved ones 0 (module docstring); inputs as ``head_space``."""
    with torch.inference_mode():
        e = gq.shape[-1]
        g = head_space(gq, gk, c)                                   # [n, 2e, 2e]
        f = factor(g)
        b = f[:, :e].mT @ f[:, e:]                                  # F_1^T F_2: M in the head's subspace
        a = (b - b.mT) / 2
        # S symmetric: |eigenvalues|; A skew: sqrt of the eigenvalues of A^T A = -A^2; one batched call
        lam = small_eigvalsh(torch.cat([(b + b.mT) / 2, a.mT @ a]))  # [2n, 2e]
        sym, skew = lam[:len(b)].abs(), lam[len(b):].clamp_min(0).sqrt()
        tol = 2 * e * EPS64 * torch.diagonal(g, dim1=-2, dim2=-1).sum(-1, keepdim=True)   # round-off of B
        keep = lambda s: torch.where(s > tol, s, torch.zeros_like(s))   # noqa: E731
        return keep(sym), keep(skew)


def parts(gq: torch.Tensor, gk: torch.Tensor, c: torch.Tensor) -> Parts:
    """``Parts`` per query head from the float64 products (inputs as ``head_space``)."""
    sym, skew = part_values(gq, gk, c)
    return Parts(spectrum_stats(sym), spectrum_stats(skew), sym.amax(-1) <= 0, skew.amax(-1) <= 0)
