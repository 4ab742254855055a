"""Cross-layer maps: how alike two layers' keys (values) are, for every pair of layers ``(l, l2)``.

Axis ``layer_pair``: one row per pair ``l < l2`` (each metric is symmetric; a layer with itself is
no row), ``head`` NA, ``layer2`` the second layer. They read every layer at once, so
``weight_metrics`` (per layer) skips them and the model-level pass ``analysis.cross_layer`` computes
them: ``WeightPairs`` over the checkpoint's layers (``app.jobs.weight_frame``),
``CacheSample`` over the captured inputs of every layer (``experiments.runnable.feed``). Formulas,
estimators, the token and row subsamples and their error: ``analysis.cross_layer``.

A weight metric's ``compute(layer, rows)`` here is the layer's part of the pair: the centred row-space
Gram of its stacked ``W_K`` (``W_V``) over the sampled input dimensions ``rows``
(``analysis.cross_layer.row_gram``); the pass pairs the Grams by linear CKA.
"""
from __future__ import annotations

from analysis.registry import Metric, declare, register

_MC = ("median linear CKA of pairs of independent random Gaussian layers of the same shapes (the same "
       "sampled input dimensions); the null band over those pairs")
_RP = ("the same metric of the same captured layer inputs through independent random Gaussian projections "
       "of each layer's kv shapes (median over draws, per pair: it keeps how alike the two layers' inputs are)")


@register(Metric("xlayer_cka_wk", "weights", "layer_pair", "cross_layer",
                 "linear CKA of two layers' W_K as d_model x (n_kv_heads*d_head) matrices (input dimensions as "
                 "samples, centred over them; Kornblith et al. 2019): the same key subspace read the same way",
                 "max", "monte_carlo", _MC, reads=("K",)))
def xlayer_cka_wk(layer, rows):
    from analysis.cross_layer import row_gram   # here: torch loads where a layer is measured

    return row_gram(layer.W_K, rows)


@register(Metric("xlayer_cka_wv", "weights", "layer_pair", "cross_layer",
                 "linear CKA of two layers' W_V as d_model x (n_kv_heads*d_head) matrices (input dimensions as "
                 "samples, centred over them; Kornblith et al. 2019)",
                 "max", "monte_carlo", _MC, reads=("V",)))
def xlayer_cka_wv(layer, rows):
    from analysis.cross_layer import row_gram   # here: torch loads where a layer is measured

    return row_gram(layer.W_V, rows)


for _m in (
    Metric("xlayer_cka_kcache", "activations", "layer_pair", "cross_layer",
           "linear CKA of two layers' K caches (all kv columns) over the same sample tokens, debiased "
           "(as kv_cka_act); what cross-layer KV sharing (CLA, YOCO) needs to be high",
           "max", "random_projection", _RP, reads=("K",)),
    Metric("xlayer_cka_vcache", "activations", "layer_pair", "cross_layer",
           "linear CKA of two layers' V caches (all kv columns) over the same sample tokens, debiased",
           "max", "random_projection", _RP, reads=("V",)),
    Metric("xlayer_cos_adjacent", "activations", "layer_pair", "cross_layer",
           "MiniCache's similarity of adjacent layers (l2 = l+1): the cosine of a token's K (and V) cache "
           "vectors in the two layers, averaged over tokens, the K and V means averaged",
           "max", "random_projection", _RP, reads=("K", "V")),
):
    declare(_m)
