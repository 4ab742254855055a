"""Q/K geometry of the weights: the symmetry and directionality of ``M = W_Q W_K^T`` (Saponati et al. 2025;
formulas: ``analysis.qk_geometry``).

Closed-form chance levels (``d = d_model``, ``e = d_head``, ``h = n_heads``, ``g = n_kv_heads``):

* ``qk_symmetry`` (per head and per layer): **(1 + 1/d) / 2**, the ratio of the
  expectations in ``s = (1 + tr(M^2) / ||M||_F^2) / 2``. ``tr(M^2) = tr((K^T Q)^2)``
  is *even* in ``Q``, so the score is not symmetric about 1/2:
  ``E tr(C^2) = e d`` (only ``a = b`` survives) and ``E ||M||^2 = d^2 e``, ratio
  ``1/d``; per layer, with ``Qs`` (entries of variance ``h/g``) and ``Ks`` of
  width ``g e``, the same ``1/d``. Monte Carlo (float64, ``d = 16..128``) puts the
  mean within ``1e-4`` of it and the median within ``1.5e-3`` at ``d = 16, e = 4``,
  ``3e-4`` at ``d = 32``. **Query-free** (``Q_h`` the identity slice ``E_h``) it is
  the exact mean: ``||M_h||^2 = ||K_g||^2`` and ``tr(M_h^2)`` is a quadratic form in
  the isotropic ``vec K_g`` of trace ``e``, so ``E[tr(M^2) / ||M||^2] = 1/d``; per
  layer likewise.
* ``qk_directionality``: **0**. ``M^T = Ks Qs^T`` has the distribution of ``M`` up
  to a scale (the score is scale-free), and transposing swaps the row and column
  outliers, ``d(M^T) = -d(M)``: symmetric about 0. Query-free with ``h = g``:
  ``M = Ks^T``, a square Gaussian matrix, likewise 0. Query-free grouped-query
  layers have no such symmetry: Monte Carlo, from exact draws of the score alone
  (``directionality_null``: one Gaussian ``d_model x n_kv d_head`` matrix per draw,
  about 1/50 of a random layer's cost at the demo's shape), enough of them for a
  median stable to 1% (the distribution has atoms at -1, 0 and +1 and a thin middle:
  about 50,000 draws at ``h 4, g 2, d 64, e 16``). Random layers spread widely about 0:
  over ``[-1, 1]`` at ``d = 32..64``, quartiles about +-0.15 at GPT-2's shapes.
"""
from __future__ import annotations

from analysis.registry import Metric, Values, register

_MC = "median of random Gaussian layers of the same shapes (over draws and heads)"


def directionality_null(geo, query_free: bool, seed: int, batch: int):
    """Exact null draws of the directionality where there is no closed form (query-free grouped-query
    layers: ``analysis.qk_geometry.query_free_directionality_null``, a Gaussian ``d_model x n_kv d_head``
    matrix per draw); None elsewhere."""
    if directionality_chance(geo, query_free) is not None or geo.n_heads * geo.d_head != geo.d_model:
        return None
    from analysis.qk_geometry import query_free_directionality_null   # here: the registry stays torch-free
    return query_free_directionality_null(int(geo.n_heads), int(geo.n_kv_heads), int(geo.d_model),
                                          int(geo.d_head), seed, batch)


def symmetry_chance(geo, query_free: bool) -> float:
    """``(1 + 1/d_model) / 2`` (module docstring)."""
    return (1 + 1 / geo.d_model) / 2


def directionality_chance(geo, query_free: bool) -> float | None:
    """0, except for query-free grouped-query layers (None: Monte Carlo; module docstring)."""
    return 0.0 if not query_free or geo.n_kv_heads == geo.n_heads else None


@register(Metric("qk_symmetry", "weights", "head+layer", "qk_geometry",
                 "symmetry score of M = W_Q W_K^T: ||sym(M)||^2/||M||^2; 1 symmetric, (1 + 1/d_model)/2 random, "
                 "0 antisymmetric (per head; head empty: M summed over heads; Saponati et al. 2025)",
                 "max", "closed", "(1 + 1/d_model)/2, not 1/2 (tr(M^2) is even in Q): E tr(M^2) / E ||M||_F^2 = "
                                  "1/d_model for random Q, K; query-free (identity Q) the exact mean (closed form)",
                 reads=("Q", "K"), fixed_by=("q_eq_k",)),
          closed_form=symmetry_chance)
def qk_symmetry(layer, meta, device):
    layer.need_qk()
    return Values(layer.head_symmetry, layer.layer_scores[0] if layer.whole else None)


@register(Metric("qk_directionality", "weights", "layer", "qk_geometry",
                 "directionality of the layer's M as Saponati et al. 2025 compute it: (e_c - e_r)/(e_c + e_r), e "
                 "the summed excess of the outlier column/row norms over mean + 2 std; >0 key-side dominance",
                 "none", "closed", "0: transposing M swaps row and column outliers, and random Q, K are "
                                   f"exchangeable (closed form); query-free grouped-query layers: {_MC}",
                 reads=("Q", "K"), fixed_by=("q_eq_k", "q_identity")),
          closed_form=directionality_chance, null_draws=directionality_null)
def qk_directionality(layer, meta, device):
    layer.need_qk()
    return layer.layer_scores[1] if layer.whole else None
