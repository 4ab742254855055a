"""Every metric qkvscope computes: stable name, level, axis, help text.

The CLI, the jobs and the dashboard pages build their lists from ``METRICS``;
a metric that is computed but not registered is a bug (a test checks it).

* ``level``: ``weights`` (from the checkpoint alone) or ``activations``
  (needs a forward pass on sample tokens).
* ``axis``: ``head`` (one value per query head), ``kv_head`` (per kv head),
  ``layer`` (``head`` is None: the whole layer) or ``head+layer`` (both). The
  K and V spectra (``erank_k``, ... ``energy_rank99_v``) are ``kv_head`` and
  also have a whole-layer row (``head`` None) for grouped-query models.

``METRIC_VERSION`` is stored beside every value; bump it when any formula or
its numerics change, so stored results are recomputed instead of reused.
Version 3: every row carries ``chance`` (and activation rows ``n_tokens``,
``ci_low``, ``ci_high``); spectra in float64; activation metrics on a corpus
sample; ``qk_directionality`` as its authors compute it.
Version 2: ``wq_basis_orth_defect`` is ``log(mean sigma^2 / geometric mean sigma^2)``
(was ``sqrt(mean (sigma_i^2 / mean sigma^2 - 1)^2)``); per-layer K and V spectra.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

METRIC_VERSION = 3

#: The columns of every tidy metric frame.
COLUMNS = ["layer", "head", "head_label", "metric", "value"]
#: What a stored or reported result row holds: the tidy columns plus its meaning.
#: ``chance``: the value independent projections of the same shapes give
#: (``analysis.chance``); ``n_tokens``: sample tokens behind an activation value
#: (NA for weight metrics); ``ci_low``/``ci_high``: 95% bootstrap interval over
#: token windows (activation metrics; NA for weight metrics).
RESULT_COLUMNS = COLUMNS + ["chance", "n_tokens", "ci_low", "ci_high"]


@dataclass(frozen=True)
class Metric:
    name: str
    level: str
    axis: str
    family: str
    help: str


_SPECTRAL = {
    "q": ("head", "W_Q[h] (d_model x d_head)"),
    "k": ("kv_head", "W_K[g] (d_model x d_head; head empty: the layer's stacked W_K, "
                     "d_model x n_kv_heads*d_head, grouped-query models only)"),
    "v": ("kv_head", "W_V[g] (d_model x d_head; head empty: the layer's stacked W_V, "
                     "d_model x n_kv_heads*d_head, grouped-query models only)"),
    "o": ("head", "W_O[h] (d_head x d_model)"),
    "qk": ("head", "M_h = W_Q[h] W_K[g(h)]^T"),
}


def _spectral() -> list[Metric]:
    out = []
    for p, (axis, what) in _SPECTRAL.items():
        out += [
            Metric(f"erank_{p}", "weights", axis, "spectra",
                   f"effective rank (Roy & Vetterli 2007) of {what}: exp of the entropy of sigma_i / sum sigma"),
            Metric(f"stable_rank_{p}", "weights", axis, "spectra",
                   f"stable rank ||A||_F^2 / ||A||_2^2 of {what}"),
            Metric(f"energy_rank90_{p}", "weights", axis, "spectra",
                   f"fewest singular values of {what} holding 90% of sum sigma_i^2"),
            Metric(f"energy_rank99_{p}", "weights", axis, "spectra",
                   f"fewest singular values of {what} holding 99% of sum sigma_i^2"),
        ]
    return out


METRICS: list[Metric] = [
    Metric("kv_cosine_flat", "weights", "kv_head", "kv_similarity",
           "cosine of the flattened W_K and W_V (what papers quote; NOT invariant to a rotation of the head basis)"),
    Metric("kv_cka", "weights", "kv_head", "kv_similarity",
           "linear CKA of W_K and W_V: ||K^T V||_F^2 / (||K^T K||_F ||V^T V||_F); rotation-invariant"),
    Metric("kv_share_r2", "weights", "kv_head", "kv_similarity",
           "K=V sharing fit: 1 - min_T ||V - K T||^2 / ||V||^2 (V regressed on K)"),
    Metric("qk_symmetry", "weights", "head+layer", "qk_geometry",
           "symmetry score of M = W_Q W_K^T: ||sym(M)||^2/||M||^2; 1 symmetric, (1 + 1/d_model)/2 random, 0 antisymmetric "
           "(per head; head empty: M summed over heads; Saponati et al. 2025)"),
    Metric("qk_directionality", "weights", "layer", "qk_geometry",
           "directionality of the layer's M as Saponati et al. 2025 compute it: (e_c - e_r)/(e_c + e_r), e the "
           "summed excess of the outlier column/row norms over mean + 2 std; >0 key-side dominance"),
    *_spectral(),
    *[Metric(f"norm_{p}", "weights", "layer", "norms",
             f"Frobenius norm of the layer's {w} (all heads); plotted against weight decay")
      for p, w in (("q", "W_Q"), ("k", "W_K"), ("v", "W_V"), ("o", "W_O"))],
    Metric("wq_condition", "weights", "layer", "query_absorb",
           "condition number sigma_max/sigma_min of the stacked W_Q (d_model x n_heads*d_head)"),
    Metric("wq_basis_orth_defect", "weights", "layer", "query_absorb",
           "normalised models: how far the stacked W_Q (the change of basis a query-free model needs) is from "
           "a scaled orthogonal matrix, log(arithmetic / geometric mean of sigma_i^2) = "
           "log(||A||_F^2/n) - (2/n) log|det A|; 0 = absorbable through the norm, inf = singular"),
    Metric("wq_absorb_error", "weights", "layer", "query_absorb",
           "models without normalisation: max |logit error| / max |logit| after converting to identity queries"),
    Metric("kv_cka_act", "activations", "kv_head", "kv_similarity",
           "linear CKA of the K and V caches over sample tokens (tokens centred; Kornblith et al. 2019)"),
    Metric("kv_cosine_act", "activations", "kv_head", "kv_similarity",
           "cosine of the flattened K and V caches on sample tokens"),
    Metric("kv_share_r2_act", "activations", "kv_head", "kv_similarity",
           "K=V sharing fit on the caches: 1 - min_T ||V - K T||^2 / ||V||^2 over sample tokens"),
    Metric("logit_symmetry", "activations", "head+layer", "qk_geometry",
           "symmetry score of the pre-softmax logit matrix on sample tokens, before the causal mask "
           "(head empty: logits summed over heads)"),
    Metric("erank_kcache", "activations", "kv_head", "spectra",
           "effective rank of the K cache (tokens x d_head) on sample tokens"),
    Metric("erank_vcache", "activations", "kv_head", "spectra",
           "effective rank of the V cache (tokens x d_head) on sample tokens"),
]

BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}


def names(level: str | None = None) -> list[str]:
    """Registered metric names, optionally of one level, in registry order."""
    return [m.name for m in METRICS if level is None or m.level == level]


def describe() -> pd.DataFrame:
    """The registry as a table (name, level, axis, family, help) for pages and docs."""
    return pd.DataFrame([m.__dict__ for m in METRICS], columns=["name", "level", "axis", "family", "help"])
