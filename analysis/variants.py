"""The attention variants this tool knows: one place for their names and facts.

A dependency-free leaf (standard library only): ``loaders``, ``analysis``,
``experiments`` and ``app`` all import variant facts from here, and nowhere
else defines them. (The one import of ``analysis`` that ``loaders`` makes.)

Variants (paper A: arXiv query-free attention; paper B: arXiv 2606.04032):

========================  ============  ==========================================
name                      paper label   what is tied
========================  ============  ==========================================
``qkv``                   Q-K-V         nothing (baseline)
``wq_identity``           W_Q = I       query is the identity slice (no W_Q)
``q_eq_k``                Q=K-V         W_Q = W_K (symmetric logits)
``k_eq_v``                Q-K=V         W_K = W_V (one cached tensor)
``q_eq_k_eq_v``           Q=K=V         one projection for all three
``q_eq_k_plus``           (Q=K-V)+      as ``q_eq_k``, plus paper B's 2D positional
                                        correction of the score map
``q_eq_k_eq_v_plus``      (Q=K=V)+      as ``q_eq_k_eq_v``, plus that correction
========================  ============  ==========================================

The "+" correction (paper B, its repository's ``SharedProjAttention``): a fixed
2D sin/cos tensor ``P[i, j, :]`` (half its ``m`` channels encode the query
position ``i``, half the key position ``j``, so ``P[i, j] != P[j, i]``) and
learned ``w`` (``m``) and ``b``: ``scores' = scores * sum(w) + P @ w + b``, an
exact 1x1 convolution over the score map and ``P``. It breaks the symmetry of
``Q K^T`` when ``Q = K``; the paper uses it only for non-causal tasks (vision,
synthetic), since a causal mask is asymmetric already. Projections and KV
cache are those of the base variant (``base``).

``n_cached`` is the number of tensors cached per layer and kv head: 1 where K
and V are one tensor, else 2 (paper B's ``mult``).
"""
from __future__ import annotations

#: The five projection-sharing variants, in the order pages list them.
VARIANTS: tuple[str, ...] = ("qkv", "wq_identity", "q_eq_k", "k_eq_v", "q_eq_k_eq_v")
#: Paper B's "+" variants: a base variant plus the 2D positional score correction.
PLUS: dict[str, str] = {"q_eq_k_plus": "q_eq_k", "q_eq_k_eq_v_plus": "q_eq_k_eq_v"}
#: Every stored variant name (a checkpoint, run or model may carry any of these).
ALL_VARIANTS: tuple[str, ...] = VARIANTS + tuple(PLUS)
#: Name shown for a run whose variant is not known.
UNKNOWN = "unknown"
#: Paper-style labels.
LABELS: dict[str, str] = {
    "qkv": "Q-K-V", "wq_identity": "query-free (W_Q = I)", "q_eq_k": "Q=K-V",
    "k_eq_v": "Q-K=V", "q_eq_k_eq_v": "Q=K=V", "q_eq_k_plus": "(Q=K-V)+",
    "q_eq_k_eq_v_plus": "(Q=K=V)+", UNKNOWN: "unknown",
}
#: Variants whose K and V are one cached tensor (KV cache halved).
KV_TIED = frozenset({"k_eq_v", "q_eq_k_eq_v", "q_eq_k_eq_v_plus"})
#: Variants whose query is computed by W_K (Q=K).
Q_TIED = frozenset({"q_eq_k", "q_eq_k_eq_v", "q_eq_k_plus", "q_eq_k_eq_v_plus"})
#: Variants without a W_Q of their own (identity or tied to K).
Q_DROPPED = frozenset({"wq_identity"}) | Q_TIED
#: One colour per variant, the same on every page (colour-blind-safe Tableau 10).
COLORS: dict[str, str] = {
    "qkv": "#4C78A8", "wq_identity": "#F58518", "q_eq_k": "#54A24B", "k_eq_v": "#E45756",
    "q_eq_k_eq_v": "#B279A2", "q_eq_k_plus": "#72B7B2", "q_eq_k_eq_v_plus": "#FF9DA6",
    UNKNOWN: "#9D9D9D",
}


#: Metrics a K=V tie fixes at 1 whatever the weights (K and V are one tensor).
KV_TIE_METRICS = frozenset({"kv_cosine_flat", "kv_cka", "kv_share_r2", "kv_cka_act", "kv_cosine_act",
                            "kv_share_r2_act"})
#: Metrics a Q=K tie fixes at 1 (Q K^T, and the logits, are symmetric).
QK_TIE_METRICS = frozenset({"qk_symmetry", "logit_symmetry"})
#: The metrics a view opens on, first that is stored and informative: the K/V similarity the
#: projection-sharing paper reads, then the Q/K symmetry, then ranks.
PREFERRED_METRICS = ("kv_cka", "qk_symmetry", "kv_share_r2", "erank_k", "erank_v")


def fixed_by_tie(metric: str, variant) -> bool:
    """Whether ``variant``'s tie fixes ``metric`` by construction (1 for any weights), so that its
    value says nothing about the model: a K/V similarity of a K=V variant, the Q/K symmetry of a
    Q=K variant."""
    return (variant in KV_TIED and metric in KV_TIE_METRICS) or (variant in Q_TIED and metric in QK_TIE_METRICS)


def informative_metric(available, variants) -> str | None:
    """The metric a view of checkpoints of ``variants`` opens on: the first of ``PREFERRED_METRICS``,
    then of ``available``, that is in ``available`` and that no variant's tie fixes
    (``fixed_by_tie``); the first available when every one is fixed; None for none."""
    available = list(available)
    for m in [*PREFERRED_METRICS, *available]:
        if m in available and not any(fixed_by_tie(m, v) for v in variants):
            return m
    return available[0] if available else None


def base(variant: str) -> str:
    """The projection-sharing variant under a "+" variant (``q_eq_k_plus`` -> ``q_eq_k``)."""
    return PLUS.get(variant, variant)


def n_cached(variant: str) -> int:
    """Tensors cached per layer and kv head: 1 for K=V variants, else 2."""
    return 1 if variant in KV_TIED else 2


def kv_bytes_per_token(variant: str, n_layers: int, n_kv_heads: int, d_head: int,
                       bytes_per_elem: float, d_head_v: int | None = None) -> float:
    """The KV-cache bytes one token adds to a stack of attention layers (DESIGN.md, "KV-cache and
    serving cost"): ``n_layers * n_cached(variant) * n_kv_heads * d_head * bytes_per_elem``, or
    with a value head of its own width ``d_head_v``, ``n_layers * n_kv_heads * (d_head + d_head_v)
    * bytes_per_elem`` (K = V variants cache the one K-wide tensor).
    The one place the formula is written: the calculator, the store's checkpoints, the Results
    table and the trainer's config all call it (latent attention, MLA, caches a latent instead)."""
    if d_head_v is None or d_head_v == d_head or variant in KV_TIED:
        return n_layers * n_cached(variant) * n_kv_heads * d_head * bytes_per_elem
    return n_layers * n_kv_heads * (d_head + d_head_v) * bytes_per_elem


def label(variant: str | None) -> str:
    """The paper label of a stored variant name (the name itself if unknown)."""
    return LABELS.get(str(variant), str(variant))


def sharing(n_heads: int | None, n_kv_heads: int | None) -> str:
    """``MHA``, ``MQA`` (one kv head) or ``GQA-g`` with ``g`` the number of kv heads (groups),
    as Ainslie et al. (2023) and paper B write it (Llama-3-8B, 32 heads over 8: ``GQA-8``);
    ``?`` if unknown."""
    try:
        n_heads, n_kv_heads = int(n_heads), int(n_kv_heads)
    except (TypeError, ValueError):          # None, NaN, pandas' NA
        return "?"
    if not n_heads or not n_kv_heads:
        return "?"
    if n_kv_heads == n_heads:
        return "MHA"
    if n_kv_heads == 1:
        return "MQA"
    return f"GQA-{n_kv_heads}"
