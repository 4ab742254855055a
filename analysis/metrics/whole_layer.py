"""The projection-sharing paper's own definitions: K-V redundancy of a whole layer, all heads at once.

Paper B (arXiv 2606.04032, repository ``Brainchip-Inc/Do-Transformers-Need-3-Projections``) measures
it per whole layer in ``kv_similarity_llm.py`` (commit ``4585ac0e``), whose output is
``kv_similarity_results.csv``:

* ``weight_cosine_kv``: the cosine of the flattened ``[W_k; b_k]`` and ``[W_v; b_v]`` of the layer's
  fused ``c_attn`` (every head's rows and the biases): ``kv_cosine_layer``. Their results read ~0
  (0.0 for the 300M language model, -0.005 to 0.003 on the synthetic and vision models).
* ``linear_cka`` of the layer's K and V outputs of ``c_attn`` (biases in) on one batch of
  validation tokens, ``[tokens, n_embd]``, tokens centred: ``kv_cka_layer_act``
  (``analysis.layer_caches``). Averaged over layers: 0.6956 for the 300M model, 0.53-0.75 on
  the vision models, 0.65-0.94 on the synthetic tasks. The average over layers is theirs to
  take: qkvscope stores one value per layer.

and its talk deck (slide 6) quotes "similar effective rank (687 vs 702 / 1024)" for K and V of the
300M model (d_model 1024), a whole-layer figure: ``erank_kcache_layer``, ``erank_vcache_layer``
(effective rank of the ``[tokens, n_kv_heads * d_head]`` caches).

Chance: ``kv_cosine_layer`` **0** in closed form (``V -> -V`` leaves independent Gaussian
projections' distribution unchanged and flips the sign), its null band from the random layers of
``analysis.chance`` (no biases); the activation metrics the same captured input through random
projections of the layer's shapes (``analysis.activations``): the plain CKA's small-sample floor
and the eranks' sampling spread are in the chance level as they are in the value.
"""
from __future__ import annotations

from analysis.registry import Metric, declare, register

_RANDOM_PROJECTION = ("the same metric of the same captured layer input projected through random Gaussian "
                      "matrices of the layer's shapes, all kv heads side by side, no biases (median over draws)")
_SCRIPT = "Brainchip-Inc/Do-Transformers-Need-3-Projections kv_similarity_llm.py"


@register(Metric("kv_cosine_layer", "weights", "layer", "kv_similarity",
                 "cosine of the layer's flattened [W_K; b_K] and [W_V; b_V], all kv heads and the biases (the "
                 f"projection-sharing paper's weight_cosine_kv, {_SCRIPT}; NOT invariant to a rotation of a "
                 "head's basis)", "max", "closed",
                 "0: independent K and V have a flat cosine symmetric about 0 (closed form; band of random "
                 "layers without biases)", reads=("K", "V"), fixed_by=("k_eq_v",)),
          closed_form=lambda geo, query_free: 0.0)
def kv_cosine_layer(layer, meta, device):
    from analysis import kv_similarity   # here: torch loads where a layer is measured (the registry stays torch-free)

    return kv_similarity.cosine_layer(layer.kvp, layer.b_K, layer.b_V)


for _m in (
    Metric("kv_cka_layer_act", "activations", "layer", "kv_similarity",
           "linear CKA of the whole layer's K and V caches, all n_kv_heads*d_head columns, biases in, tokens "
           f"centred, not debiased (the projection-sharing paper's linear_cka, {_SCRIPT}; averaged over layers "
           "there)", "max", "random_projection", _RANDOM_PROJECTION, reads=("K", "V"), fixed_by=("k_eq_v",)),
    Metric("erank_kcache_layer", "activations", "layer", "spectra",
           "effective rank of the whole layer's K cache (tokens x n_kv_heads*d_head, biases in) on sample tokens",
           "min", "random_projection", _RANDOM_PROJECTION, reads=("K",)),
    Metric("erank_vcache_layer", "activations", "layer", "spectra",
           "effective rank of the whole layer's V cache (tokens x n_kv_heads*d_head, biases in) on sample tokens",
           "min", "random_projection", _RANDOM_PROJECTION, reads=("V",)),
):
    declare(_m)
