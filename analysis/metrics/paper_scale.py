"""The Q/K geometry on the scale of Saponati et al. 2025's figures and tables.

``qk_symmetry`` and ``qk_directionality`` are computed as the authors' code
(``utils/scores.py``) computes them; every figure and table of the paper plots
``2 s - 1`` (1 symmetric, -1 antisymmetric, about ``1/d_model`` for random
layers) and ``-d`` (the opposite sign: >0 query-side dominance). These two metrics
are those, from the same per-layer scores (no second computation).

For grouped-query layers the authors' ``utils/scores.py`` reshapes W_K as if it
had ``n_heads`` heads, so its ``M`` pairs query heads with the wrong key columns;
qkvscope pairs query head ``h`` with kv head ``h // (n_heads / n_kv_heads)``, the
attention the model computes. Scores of grouped-query models therefore differ from
what the authors' code would print for them.

Chance levels: ``2 c - 1`` of ``qk_symmetry``'s closed form, ``1/d_model``; ``-0 = 0``
for the directionality where its closed form holds, Monte Carlo otherwise (the same exact draws,
negated).
"""
from __future__ import annotations

from analysis.metrics.qk_geometry import directionality_chance, directionality_null, symmetry_chance
from analysis.registry import Metric, Values, register

_GQA = ("; grouped-query layers pair query head h with kv head h // (n_heads / n_kv_heads), where the authors' "
        "utils/scores.py reshapes W_K as if it had n_heads heads")


@register(Metric("qk_symmetry_paper", "weights", "head+layer", "qk_geometry",
                 "qk_symmetry on the paper's scale, 2 s - 1: 1 symmetric, 0 random, -1 antisymmetric (what "
                 "Saponati et al. 2025 plot; per head; head empty: M summed over heads)" + _GQA,
                 "max", "closed", "1/d_model: 2 (1 + 1/d_model)/2 - 1 from qk_symmetry's closed form",
                 reads=("Q", "K"), fixed_by=("q_eq_k",)),
          closed_form=lambda geo, query_free: 2 * symmetry_chance(geo, query_free) - 1)
def qk_symmetry_paper(layer, meta, device):
    layer.need_qk()
    return Values(2 * layer.head_symmetry - 1, 2 * layer.layer_scores[0] - 1 if layer.whole else None)


def _directionality_paper_chance(geo, query_free: bool) -> float | None:
    base = directionality_chance(geo, query_free)
    return None if base is None else -base + 0.0        # + 0.0: no -0.0


@register(Metric("qk_directionality_paper", "weights", "layer", "qk_geometry",
                 "qk_directionality on the paper's scale, -d: >0 query-side (row) dominance, as Saponati et al. "
                 "2025 plot it" + _GQA,
                 "none", "closed", "0 as for qk_directionality (closed form); query-free grouped-query layers: "
                                   "median of random Gaussian layers of the same shapes",
                 reads=("Q", "K"), fixed_by=("q_eq_k", "q_identity")),
          closed_form=_directionality_paper_chance,
          null_draws=lambda geo, query_free, seed, batch: (None if (d := directionality_null(
              geo, query_free, seed, batch)) is None else -d + 0.0))
def qk_directionality_paper(layer, meta, device):
    layer.need_qk()
    return -layer.layer_scores[1] + 0.0 if layer.whole else None
