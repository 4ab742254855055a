"""The activation metrics: what the K and V caches and the logits show on sample tokens.

``analysis.activations`` computes them, with their bootstrap intervals and their chance level (the
same metric of the same captured input through random projections), from the summed statistics of
the captured tokens; here they are declared (``analysis.registry.declare``), so the registry lists them
with the weight metrics. An activation plugin brings its ``compute(stats, d_head)``.
"""
from __future__ import annotations

from analysis.registry import Metric, declare

_RANDOM_PROJECTION = ("the same metric of the same captured layer input projected through random Gaussian "
                      "matrices of the head's shapes (median over draws and heads): it keeps the input's "
                      "anisotropy and the token count")

for _m in (
    Metric("kv_cka_act", "activations", "kv_head", "kv_similarity",
           "linear CKA of the K and V caches over sample tokens (tokens centred; Kornblith et al. 2019)",
           "max", "random_projection", _RANDOM_PROJECTION, reads=("K", "V"), fixed_by=("k_eq_v",)),
    Metric("kv_cosine_act", "activations", "kv_head", "kv_similarity",
           "cosine of the flattened K and V caches on sample tokens",
           "max", "random_projection", _RANDOM_PROJECTION, reads=("K", "V"), fixed_by=("k_eq_v",)),
    Metric("kv_share_r2_act", "activations", "kv_head", "kv_similarity",
           "K=V sharing fit on the caches: 1 - min_T ||V - K T||^2 / ||V||^2 over sample tokens",
           "max", "random_projection", _RANDOM_PROJECTION, reads=("K", "V"), fixed_by=("k_eq_v",)),
    Metric("logit_symmetry", "activations", "head+layer", "qk_geometry",
           "symmetry score of the pre-softmax logit matrix on sample tokens, before the causal mask "
           "(head empty: logits summed over heads)",
           "max", "random_projection", _RANDOM_PROJECTION, reads=("Q", "K"), fixed_by=("q_eq_k",)),
    Metric("erank_kcache", "activations", "kv_head", "spectra",
           "effective rank of the K cache (tokens x d_head) on sample tokens",
           "min", "random_projection", _RANDOM_PROJECTION, reads=("K",)),
    Metric("erank_vcache", "activations", "kv_head", "spectra",
           "effective rank of the V cache (tokens x d_head) on sample tokens",
           "min", "random_projection", _RANDOM_PROJECTION, reads=("V",)),
):
    declare(_m)
