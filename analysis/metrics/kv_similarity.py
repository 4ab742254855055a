"""K/V similarity of the weights: how alike each kv head's W_K and W_V are (formulas: ``analysis.kv_similarity``).

Closed-form chance levels (``analysis.chance`` checks them against Monte Carlo):

* ``kv_cosine_flat``: **0**. ``V -> -V`` leaves the distribution of independent
  Gaussian projections unchanged and flips the sign, so it is symmetric about 0.
* ``kv_share_r2``: **e / d**. ``P_K`` (the projector onto K's columns, rank ``e``)
  is independent of ``V``, and ``vec V`` is isotropic in ``R^{d e}``;
  ``||P_K V||^2 / ||V||^2`` is the squared length of an isotropic vector's
  projection onto a fixed ``e^2``-dimensional subspace: exactly
  ``Beta(e^2/2, e(d-e)/2)``, mean ``e/d``, median within ``1/(d e)`` of it
  (``min(1, e/d)``: for ``e >= d`` the fit is exact).
"""
from __future__ import annotations

from analysis.registry import Metric, register

_MC = "median of random Gaussian layers of the same shapes (over draws and heads)"


@register(Metric("kv_cosine_flat", "weights", "kv_head", "kv_similarity",
                 "cosine of the flattened W_K and W_V (what papers quote; NOT invariant to a rotation of the "
                 "head basis)", "max", "closed",
                 "0: independent K and V have a flat cosine symmetric about 0 (closed form)",
                 reads=("K", "V"), fixed_by=("k_eq_v",)),
          closed_form=lambda geo, query_free: 0.0)
def kv_cosine_flat(layer, meta, device):
    from analysis import kv_similarity   # here: torch loads where a layer is measured (the registry stays torch-free)

    return kv_similarity.cosine_flat(layer.W_K, layer.W_V, prod=layer.kvp)


@register(Metric("kv_cka", "weights", "kv_head", "kv_similarity",
                 "linear CKA of W_K and W_V: ||K^T V||_F^2 / (||K^T K||_F ||V^T V||_F); rotation-invariant",
                 "max", "monte_carlo", f"{_MC}; about d_head / (d_model + d_head + 1)",
                 reads=("K", "V"), fixed_by=("k_eq_v",)))
def kv_cka(layer, meta, device):
    from analysis import kv_similarity   # here: torch loads where a layer is measured (the registry stays torch-free)

    return kv_similarity.linear_cka(layer.W_K, layer.W_V, prod=layer.kvp)


@register(Metric("kv_share_r2", "weights", "kv_head", "kv_similarity",
                 "K=V sharing fit: 1 - min_T ||V - K T||^2 / ||V||^2 (V regressed on K)",
                 "max", "closed", "d_head / d_model: the exact mean of R^2 for V independent of K, "
                                  "Beta(e^2/2, e(d-e)/2) (closed form)",
                 reads=("K", "V"), fixed_by=("k_eq_v",)),
          closed_form=lambda geo, query_free: min(1.0, geo.d_head / geo.d_model))
def kv_share_r2(layer, meta, device):
    # here: torch loads where a layer is measured (the registry stays torch-free)
    from analysis import kv_similarity
    from analysis.degenerate import add_note, rank_deficient, stored_eps

    # a rank-deficient W_K[g] leaves the share fit underdetermined (analysis.degenerate)
    low_rank = rank_deficient(layer.eig_k[0].clamp_min(0).sqrt(),
                              stored_eps(getattr(meta, "dtype", None), layer.source.W_K.dtype))
    bad = [i for i, b in enumerate(low_rank.tolist()) if b]
    if bad:
        layer.degenerate |= {("kv_share_r2", i) for i in bad}
        add_note(layer.notes, "kv_share_r2", "degenerate where W_K[g] is rank-deficient at its stored precision "
                                             "(rows flagged): the fit of V on its columns is underdetermined")
    return kv_similarity.share_r2(layer.W_K, layer.W_V, prod=layer.kvp, eig_k=layer.eig_k)
