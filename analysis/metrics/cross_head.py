"""Cross-head maps: how alike a layer's kv heads are, and what pooling them into fewer costs.

``A = W_K[i]``, ``B = W_K[j]`` (``d_model x d_head`` each; ``W_V`` likewise), one value per
ordered pair of kv heads ``(i, j)``, ``i != j`` (rows ``(layer, head, head2)``, axis
``kv_head_pair``; the matrices are symmetric, so ``(j, i)`` holds the same value):

* ``xhead_sim_k`` = ``<A, B>_F / (||A||_F ||B||_F)``: the flat cosine, as the heads are
  stored. NOT invariant to the rotation every head is free to have (below): two heads computing
  the same logits up to that rotation can score ~0.
* ``xhead_sim_k_aligned``, ``xhead_sim_v_aligned`` = ``max_R <A, B R>_F / (||A|| ||B||)`` over
  orthogonal ``R`` (``d_head x d_head``) = ``||A^T B||_* / (||A||_F ||B||_F)`` (the nuclear norm:
  orthogonal Procrustes, Schoenemann 1966; ``R = V U^T`` from ``A^T B = U S V^T``). In [0, 1];
  1 exactly when ``B = A R`` up to scale for an orthogonal ``R``. Symmetric in ``(i, j)``.

**Which rotations are free.** Head ``h`` reading kv head ``g`` scores
``x_t W_Q[h] W_K[g]^T x_s^T``: ``W_K[g] -> W_K[g] R`` with ``W_Q[h] -> W_Q[h] R`` for every query
head ``h`` of ``g``'s group leaves every logit unchanged (``R R^T = I``), so K's rotation is shared
with Q. Its output is ``softmax(.) x W_V[g] W_O[h]``: ``W_V[g] -> W_V[g] R'`` with
``W_O[h] -> R'^T W_O[h]`` leaves it unchanged, so V's rotation ``R'`` is shared with O and
independent of K's. (Any invertible map is free too; the orthogonal ones keep norms, which is why
the alignment is over them.) With rotary positions the key is rotated by position-dependent
2x2 rotations per frequency pair, which commute only with rotations within those planes: there
the free rotations of K are that block-diagonal subgroup, and ``xhead_sim_k_aligned`` (over every
rotation) is an upper bound of what a RoPE model's heads can share; V is unaffected.

``gqa_pool_residual`` (axis ``layer``): GQA uptraining's mean-pool residual (Ainslie et al. 2023,
arXiv 2305.13245) ``r_h = ||W_K[h] - mean_{j in g(h)} W_K[j]||_F / ||W_K[h]||_F`` averaged over the
layer's kv heads, for the best free grouping of the ``n`` kv heads into ``G = n / p`` equal groups
(``p`` the smallest prime factor of ``n``: ``n/2`` for an even count; ``analysis.head_grouping``:
exhaustive where there are at most ``EXACT_MAX`` partitions, else greedy + local swaps). 0: the
heads pool without loss; about ``sqrt(1 - 1/s)`` for unrelated heads of equal norm (``s = n/G``).
The per-head residuals, the contiguous grouping and ``G = n/2, n/4, 1`` are
``analysis.head_grouping.groupings`` of the same Frobenius Gram (the Inspector and
``whatif --grouping best`` read it); a per-layer row because the best grouping's residual
depends on ``n``: its chance is drawn at the model's own shapes, never from wide random layers.
Absent for a layer with one kv head (nothing to pool).

Chance: ``xhead_sim_k`` 0 (closed form: ``B -> -B`` leaves independent Gaussian heads' law
unchanged and flips the sign); the others the median over random Gaussian layers of the same
shapes (per pair: the wide layers' disjoint pairs, ``analysis.products.head_pairs``).
"""
from __future__ import annotations

from analysis import head_grouping
from analysis.registry import Absent, Metric, register

_MC = "median of random Gaussian layers of the same shapes"


def similarity(layer, p: str, *, aligned: bool):
    """``[n, n]`` float64 over the layer's kv heads: the flat or aligned cosine (module docstring)
    of the pairs ``layer.head_pairs(p)`` holds, both orders; NaN for the pairs not computed
    (``analysis.chance``'s wide layers) and on the diagonal (no pair); ``Absent`` for one kv head."""
    import torch   # here: torch loads where a layer is measured (the registry stays torch-free)

    from analysis._linalg import small_svdvals

    if layer.meta.n_kv_heads < 2:
        raise Absent("one kv head: no pair of kv heads")
    i, j, c = layer.head_pairs(p)
    grams = layer.kvp.kk if p == "k" else layer.kvp.vv
    norms = torch.diagonal(grams, dim1=1, dim2=2).double().sum(1).sqrt()       # ||W_p[h]||_F
    n = norms.shape[0]
    num = small_svdvals(c).sum(-1) if aligned else torch.diagonal(c, dim1=1, dim2=2).sum(-1)
    val = num / (norms[i] * norms[j])
    out = torch.full((n, n), float("nan"), dtype=torch.float64, device=val.device)
    out[i, j] = val
    if layer.whole:
        out[j, i] = val
    return out


@register(Metric("xhead_sim_k", "weights", "kv_head_pair", "cross_head",
                 "cosine of two kv heads' flattened W_K: <A, B>_F / (||A|| ||B||) (NOT invariant to the "
                 "rotation each head is free to have; xhead_sim_k_aligned is)", "max", "closed",
                 "0: independent heads have a flat cosine symmetric about 0 (closed form)", reads=("K",)),
          closed_form=lambda geo, query_free: 0.0)
def xhead_sim_k(layer, meta, device):
    return similarity(layer, "k", aligned=False)


@register(Metric("xhead_sim_k_aligned", "weights", "kv_head_pair", "cross_head",
                 "similarity of two kv heads' W_K after the best rotation (orthogonal Procrustes): "
                 "||A^T B||_* / (||A|| ||B||); 1 when one head is a rotation of the other", "max", "monte_carlo",
                 f"{_MC} (pairs of independent heads)", reads=("K",)))
def xhead_sim_k_aligned(layer, meta, device):
    return similarity(layer, "k", aligned=True)


@register(Metric("xhead_sim_v_aligned", "weights", "kv_head_pair", "cross_head",
                 "similarity of two kv heads' W_V after the best rotation (orthogonal Procrustes): "
                 "||A^T B||_* / (||A|| ||B||); 1 when one head is a rotation of the other", "max", "monte_carlo",
                 f"{_MC} (pairs of independent heads)", reads=("V",)))
def xhead_sim_v_aligned(layer, meta, device):
    return similarity(layer, "v", aligned=True)


@register(Metric("gqa_pool_residual", "weights", "layer", "cross_head",
                 "GQA mean-pool residual: mean over kv heads of ||W_K[h] - mean_group W_K||_F / ||W_K[h]||_F "
                 "for the best free grouping into n_kv/2 groups (n_kv/p, p the smallest prime factor, for "
                 "an odd count); 0: the heads pool without loss. Per-head residuals, contiguous grouping and "
                 "G = n/2, n/4, 1: analysis.head_grouping (Inspector, whatif --grouping best)", "min",
                 "monte_carlo", f"{_MC} (each draw's own best grouping)", reads=("K",)))
def gqa_pool_residual(layer, meta, device):
    n = meta.n_kv_heads
    if n < 2:
        raise Absent("one kv head: nothing to pool")
    if not layer.whole:
        return None
    f = layer.frobenius("k").cpu().numpy()
    return head_grouping.best_grouping(f, head_grouping.default_groups(n)).cost
