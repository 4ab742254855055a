"""The whole layer's K and V caches on sample tokens: linear CKA and effective ranks, from the input's Gram.

The projection-sharing paper (arXiv 2606.04032) measures K-V redundancy per whole layer, not per
head: its ``kv_similarity_llm.py`` (repository ``Brainchip-Inc/Do-Transformers-Need-3-Projections``)
takes the K and V outputs of a layer's fused ``c_attn`` (biases included) on one batch of
validation tokens as ``[tokens, n_embd]`` matrices, all heads side by side, and computes their
linear CKA (Kornblith et al. 2019), averaged over layers; ``kv_similarity_results.csv`` holds the
averages (0.6956 for its 300M language model). This module computes the same on the windows an
``analysis.activations.ActivationAccumulator`` sees, from sums it keeps.

For a layer input ``X`` (``[n, d_model]``, the tokens of all windows), the layer's stacked
projections ``A = [W_K[0] | ... | W_K[g-1]]`` (``[d_model, c]``, ``c = n_kv_heads * d_head``,
head-major, the columns a layer caches per token), ``B`` likewise of ``W_V``, and biases ``b_K``,
``b_V`` (``[c]``), the caches are ``K = X A + 1 b_K^T`` and ``V = X B + 1 b_V^T`` (``[n, c]``). With
``G = X^T X`` and ``s = X^T 1`` (float64):

* ``K^T K = A^T G A + (A^T s) b_K^T + b_K (s^T A) + n b_K b_K^T`` (not centred, the biases in),
  ``V^T V`` likewise;
* centred: ``Kc^T Vc = A^T G B - (A^T s)(s^T B) / n`` (the biases cancel), ``Kc^T Kc``, ``Vc^T Vc``
  likewise.

Metrics (``analysis/metrics/whole_layer.py`` declares them):

* ``kv_cka_layer_act = ||Kc^T Vc||_F^2 / (||Kc^T Kc||_F ||Vc^T Vc||_F)``: the paper's statistic
  (its ``linear_cka``: tokens centred, every column of the layer), its estimator as it is, not
  debiased (``kv_cka_act`` per head is): on ``n`` tokens it reads high by about
  ``tr(Kc^T Kc) tr(Vc^T Vc) / (n ||Kc^T Kc||_F ||Vc^T Vc||_F)``, a floor that grows with the
  columns, so with a whole layer of columns the token count matters; the chance level (random
  projections of the same tokens and columns) carries the same floor, and ``n_tokens`` stands
  beside every value.
* ``erank_kcache_layer``, ``erank_vcache_layer``: effective rank (Roy & Vetterli 2007) of the
  ``[n, c]`` caches, ``sigma_i^2 = eig(K^T K)`` (not centred, as ``erank_kcache`` per head): the
  whole-layer cache rank behind the paper's talk deck's "similar effective rank (687 vs 702 /
  1024)" (slide 6; no script or result file read in the repository computes that figure).

Cost per evaluation: ``2 d^2 c + 3 d c^2`` multiply-adds and two ``c x c`` symmetric eigenvalue
problems; the accumulator evaluates it once for the value, once per jackknife unit and three
times per chance draw.
"""
from __future__ import annotations

import torch

from analysis._linalg import gram_sv, spectrum_stats

#: The metrics this module computes, in the accumulator's row order.
LAYER_METRICS = ("kv_cka_layer_act", "erank_kcache_layer", "erank_vcache_layer")
#: Where each lives (the jackknife-t interval is clipped to it; ``None``: ``[1, c]``).
RANGES = {"kv_cka_layer_act": (0.0, 1.0), "erank_kcache_layer": None, "erank_vcache_layer": None}


def _outer(u: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return u[:, None] * w[None, :]


def layer_metrics(a: torch.Tensor, b: torch.Tensor, b_k: torch.Tensor | None, b_v: torch.Tensor | None,
                  gram: torch.Tensor, s: torch.Tensor, n: float, *, erank: bool = True) -> dict[str, torch.Tensor]:
    """``LAYER_METRICS`` (module docstring) of the caches ``X A + 1 b_K^T``, ``X B + 1 b_V^T`` from
    ``G = X^T X`` (``[d, d]``), ``s = X^T 1`` (``[d]``) and the token count ``n``; ``a``, ``b``:
    ``[d, c]``; biases ``[c]`` or None; all float64. 0-dim float64 tensors (NaN where a cache is
    all zero); ``erank=False`` leaves the eranks out."""
    with torch.inference_mode():
        ga, gb = gram @ a, gram @ b                                       # [d, c]
        sa, sb = s @ a, s @ b                                             # [c]
        akb = a.T @ gb                                                    # A^T G B: [c, c]
        ckk = a.T @ ga - _outer(sa, sa) / n
        cvv = b.T @ gb - _outer(sb, sb) / n
        ckv = akb - _outer(sa, sb) / n
        num = torch.linalg.matrix_norm(ckv).square()
        out = {"kv_cka_layer_act": num / (torch.linalg.matrix_norm(ckk) * torch.linalg.matrix_norm(cvv))}
        if erank:
            for name, m, sm, bias, gm in (("erank_kcache_layer", a, sa, b_k, ga),
                                          ("erank_vcache_layer", b, sb, b_v, gb)):
                kk = m.T @ gm                                             # A^T G A: [c, c]
                if bias is not None:
                    kk = kk + _outer(sm, bias) + _outer(bias, sm) + n * _outer(bias, bias)
                out[name] = spectrum_stats(gram_sv(kk))["erank"]
        return out
