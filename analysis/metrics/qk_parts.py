"""Routing and filtering: the skew-symmetric ("routing") and symmetric ("filtering") parts of each head's
``M_h = W_Q[h] W_K[g(h)]^T`` (Jamil & Kapadia 2026, arXiv 2605.18826; formulas, the head-subspace
computation and its precision: ``analysis.qk_parts``). Per query head; a grouped-query head reads kv head
``h // (n_heads / n_kv_heads)``, a query-free head its identity slice, as ``qk_symmetry`` does; a layer
without an ``M`` (a query that is not a linear map of x, or no W_Q with ``n_heads * d_head != d_model``)
has none of them, with ``qk_symmetry``'s note.

Chance (``d = d_model``):

* ``energy_qk_skew = 1 - qk_symmetry`` exactly, so its closed form is **(1 - 1/d) / 2**, one minus
  ``qk_symmetry``'s ``(1 + 1/d) / 2`` (``analysis.metrics.qk_geometry`` derives it: the ratio of the
  expectations of ``tr(M^2)`` and ``||M||_F^2``; the exact mean for query-free heads). Its null band is
  that of the symmetry reflected.
* ``erank_qk_sym``, ``erank_qk_skew``: Monte Carlo, the median over random Gaussian layers of the same
  shapes (no closed form: the spectra of the symmetric and skew parts of a product of two Gaussian
  ``d x e`` matrices have no known law). Both sit a little below ``2 e``, their largest value: 13.5 and 13.7
  of 16 at ``d = 32, e = 8``, 27.1 and 27.4 of 32 at ``d = 64, e = 16``.

Ties: Q = K makes ``M = K K^T`` symmetric, so ``A = 0``: ``energy_qk_skew`` is 0 and
``erank_qk_skew`` undefined (NaN) by construction (``fixed_by``); ``erank_qk_sym`` is then
``erank_qk``, still a measurement of W_K. Any head whose ``A`` is 0 to working precision (a Q = K
head the tie detection does not see, e.g. one head of a layer) has its ``erank_qk_skew`` flagged
degenerate with a note, and an antisymmetric head (``S = 0``) its ``erank_qk_sym``.
"""
from __future__ import annotations

from analysis.registry import Metric, register

_MC = "median of random Gaussian layers of the same shapes (over draws and heads)"
#: The note of the rows whose part is 0 to working precision, by metric.
_NO_PART = {"erank_qk_skew": ("degenerate where M_h is symmetric to working precision (rows flagged): it has no "
                              "skew-symmetric part, whose effective rank is then undefined (NaN)"),
            "erank_qk_sym": ("degenerate where M_h is antisymmetric to working precision (rows flagged): it has "
                             "no symmetric part, whose effective rank is then undefined (NaN)")}


def skew_energy_chance(geo, query_free: bool) -> float:
    """``(1 - 1/d_model) / 2``: one minus ``qk_symmetry``'s (module docstring)."""
    return (1 - 1 / geo.d_model) / 2


@register(Metric("erank_qk_sym", "weights", "head", "qk_parts",
                 "effective rank (Roy & Vetterli 2007) of the symmetric part (M + M^T)/2 of M_h = W_Q[h] "
                 "W_K[g(h)]^T, 'filtering' (Jamil & Kapadia 2026), computed in the head's 2*d_head subspace",
                 "min", "monte_carlo", _MC, reads=("Q", "K")))
def erank_qk_sym(layer, meta, device):
    return _erank(layer, "erank_qk_sym")


@register(Metric("erank_qk_skew", "weights", "head", "qk_parts",
                 "effective rank (Roy & Vetterli 2007) of the skew-symmetric part (M - M^T)/2 of M_h = "
                 "W_Q[h] W_K[g(h)]^T, 'routing' (Jamil & Kapadia 2026): singular values in pairs, 2 per "
                 "rotation plane; NaN where M_h is symmetric",
                 "min", "monte_carlo", _MC, reads=("Q", "K"), fixed_by=("q_eq_k",)))
def erank_qk_skew(layer, meta, device):
    return _erank(layer, "erank_qk_skew")


def _erank(layer, name: str):
    """The effective rank of ``name``'s part per head, the heads where that part is 0 flagged with the note."""
    from analysis.degenerate import add_note   # here: torch loads where a layer is measured

    layer.need_qk()
    if not layer.heads:
        return None
    parts = layer.qk_parts
    sym = name == "erank_qk_sym"
    bad = [h for h, b in enumerate((parts.no_sym if sym else parts.no_skew).tolist()) if b]
    if bad:
        layer.degenerate |= {(name, h) for h in bad}
        add_note(layer.notes, name, _NO_PART[name])
    return (parts.sym if sym else parts.skew)["erank"]


@register(Metric("energy_qk_skew", "weights", "head", "qk_parts",
                 "energy share of the skew-symmetric ('routing') part of M_h = W_Q[h] W_K[g(h)]^T: "
                 "||(M - M^T)/2||_F^2 / ||M||_F^2 = 1 - qk_symmetry; 0 symmetric, (1 - 1/d_model)/2 random, "
                 "1 antisymmetric (Jamil & Kapadia 2026)",
                 "min", "closed", "(1 - 1/d_model)/2: one minus qk_symmetry's (1 + 1/d_model)/2 (closed form)",
                 reads=("Q", "K"), fixed_by=("q_eq_k",)),
          closed_form=skew_energy_chance)
def energy_qk_skew(layer, meta, device):
    layer.need_qk()
    return (1 - layer.head_symmetry).clamp(0, 1) if layer.heads else None
