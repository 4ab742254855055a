"""Symmetry and directionality of the bilinear form ``M = W_Q W_K^T``.

Attention logits are ``x_i M x_j^T`` (times the attention scale), with
``M = Q K^T`` a ``d_model x d_model`` matrix that is never formed here.

* **Symmetry score** (Saponati et al. 2025, arXiv 2502.10927, Def. 3.1):
  ``s = ||(M + M^T)/2||_F^2 / ||M||_F^2 = (1 + tr(M^2) / ||M||_F^2) / 2``
  with ``tr(M^2) = tr((K^T Q)^2)`` and ``||M||_F^2 = tr((Q^T Q)(K^T K))``, all
  ``d_head x d_head`` products. 1: symmetric (Q = K); ~0.5 random; 0: antisymmetric.
* **Per layer**, ``M = sum_h Q_h K_{g(h)}^T`` (g: the head's kv head). Grouping
  the query heads that share a kv head, ``M = Qs Ks^T`` with
  ``Qs = [sum_{h in group j} Q_h]_j`` and ``Ks = [K_j]_j``, both
  ``d_model x (n_kv_heads * d_head)``; the same identities apply.
* **Directionality score** (same paper, Def. 3.2): with ``r_i = ||M[i, :]||``
  (row norms: residual directions read by the query) and ``c_j = ||M[:, j]||``
  (column norms: directions read by the key), ``r_bar`` = sum of the row norms
  above ``mean(r) + gamma * std(r)`` (gamma = 2, std with Bessel's correction),
  ``c_bar`` likewise for columns, and ``d = (c_bar - r_bar) / (c_bar + r_bar)``
  in [-1, 1]; 0 when no row or column stands out. Positive: a few key-side
  directions dominate (the paper's "column dominance", typical of decoders).
  Row norms are ``diag(Qs (Ks^T Ks) Qs^T)``, column norms
  ``diag(Ks (Qs^T Qs) Ks^T)``: ``d_model`` values from thin products.
* **Logit symmetry** (activations): the symmetry score of a head's ``T x T``
  pre-softmax logit matrix on sample tokens, before the causal mask.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from analysis._linalg import gram, stack_heads, sum_groups


def symmetry_per_head(q: torch.Tensor, k: torch.Tensor, kv_of: torch.Tensor, *,
                      gq: torch.Tensor | None = None, gk: torch.Tensor | None = None) -> torch.Tensor:
    """Symmetry score of ``M_h = Q_h K_{kv_of[h]}^T`` per query head, ``[n_heads]`` float64.

    ``q: [n_heads, d_model, d_head]``, ``k: [n_kv_heads, d_model, d_head]``,
    ``kv_of: [n_heads]`` the kv head of each query head; ``gq``, ``gk`` the float32
    Grams ``Q_h^T Q_h`` and ``K_g^T K_g`` if the caller has them.
    """
    with torch.inference_mode():
        q32, k32 = q.float(), k.float()
        if bool((kv_of[1:] >= kv_of[:-1]).all()):           # heads grouped by kv head (kv_index)
            counts = torch.bincount(kv_of, minlength=k32.shape[0]).tolist()
            c = torch.cat([k32[g].mT @ qg for g, qg in enumerate(torch.split(q32, counts))])
        else:                                                # any other map: gather the keys
            c = k32[kv_of].mT @ q32
        c = c.double()                                       # K^T Q, [n_heads, d_head, d_head]
        tr_m2 = (c * c.mT).sum((1, 2))                       # tr(C C)
        gq = (gram(q32) if gq is None else gq).double()
        gk = (gram(k32) if gk is None else gk).double()[kv_of]
        norm2 = (gq * gk).sum((1, 2))                        # tr(Gq Gk), both symmetric
        return (1 + tr_m2 / norm2) / 2


def group_queries(q: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """Sum of the query heads sharing each kv head: ``[n_kv_heads, d_model, d_head]``."""
    return sum_groups(q.float(), n_kv_heads)


class LayerForm(NamedTuple):
    """The layer's ``M = Qs Ks^T`` in thin pieces (float32), shared by its scores."""

    qs: torch.Tensor      # [d_model, n_kv*d_head], grouped query heads side by side
    ks: torch.Tensor      # [d_model, n_kv*d_head], kv heads side by side
    gqs: torch.Tensor     # Qs^T Qs
    gks: torch.Tensor     # Ks^T Ks (also the Gram of the layer's stacked W_K)
    c: torch.Tensor       # Ks^T Qs


def layer_form(q: torch.Tensor, k: torch.Tensor) -> LayerForm:
    """``Qs, Ks: [d_model, n_kv_heads*d_head]`` with ``M = Qs Ks^T`` summed over heads,
    and their three small products."""
    with torch.inference_mode():
        n_kv, d_model, d_head = k.shape
        qs = stack_heads(group_queries(q, n_kv))              # [d_model, n_kv*d_head]
        ks = stack_heads(k)
        return LayerForm(qs, ks, gram(qs), gram(ks), ks.T @ qs)


def symmetry_layer(q: torch.Tensor, k: torch.Tensor, *, form: LayerForm | None = None) -> float:
    """Symmetry score of ``M = sum_h Q_h K_{g(h)}^T`` (float)."""
    with torch.inference_mode():
        f = layer_form(q, k) if form is None else form
        c = f.c.double()                                     # [n_kv*d_head]^2
        norm2 = (f.gqs.double() * f.gks.double()).sum()
        return float((1 + (c * c.T).sum() / norm2) / 2)


def directionality_layer(q: torch.Tensor, k: torch.Tensor, *, gamma: float = 2.0,
                         form: LayerForm | None = None) -> float:
    """Directionality score ``(c_bar - r_bar) / (c_bar + r_bar)`` of the layer's ``M``."""
    with torch.inference_mode():
        f = layer_form(q, k) if form is None else form
        rows = ((f.qs @ f.gks) * f.qs).sum(1).clamp_min(0).double().sqrt()   # [d_model]
        cols = ((f.ks @ f.gqs) * f.ks).sum(1).clamp_min(0).double().sqrt()   # [d_model]
        r_bar = rows[rows > rows.mean() + gamma * rows.std()].sum()
        c_bar = cols[cols > cols.mean() + gamma * cols.std()].sum()
        den = r_bar + c_bar
        if den <= 0:
            return 0.0
        return float((c_bar - r_bar) / den)


def matrix_symmetry(m: torch.Tensor) -> torch.Tensor:
    """Symmetry score of square stacks ``[..., n, n]`` (e.g. logits), float64 ``[...]``."""
    with torch.inference_mode():
        m64 = m.double()
        return (1 + (m64 * m64.mT).sum((-2, -1)) / m64.square().sum((-2, -1))) / 2
