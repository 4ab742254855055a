"""Names of the ties ``analysis.tied.tied_layer`` reads from one layer's tensors, torch-free:
the dashboard names stored ties (``loaders.results.stored_ties``) without importing torch.

A layer's ties are ``{"layer", "q_identity", "q_eq_k", "k_eq_v", "q_eq_v"}`` (bools);
``layer_variant`` names them with ``analysis.variants.VARIANTS``, ``tied_variant`` the
checkpoint's layers together.
"""
from __future__ import annotations


def layer_variant(ties: dict) -> str | None:
    """The canonical variant name of one layer's ties, None for a combination without one
    (``q_eq_v`` alone; the identity query with ``k_eq_v``)."""
    q_id, qk, kv, qv = ties["q_identity"], ties["q_eq_k"], ties["k_eq_v"], ties["q_eq_v"]
    if qk and kv:
        return "q_eq_k_eq_v"
    if q_id:
        return None if kv else "wq_identity"
    if qk:
        return "q_eq_k"
    if kv:
        return "k_eq_v"
    return None if qv else "qkv"


def tied_variant(per_layer: list[dict]) -> str | None:
    """The variant the tensors show: the one name every layer agrees on, ``"mixed"``
    when layers disagree, None for no layers or when every layer's ties are a
    combination without a name."""
    names = {layer_variant(t) for t in per_layer}
    if len(names) > 1:
        return "mixed"
    return names.pop() if names else None
