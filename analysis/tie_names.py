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


#: How each tie reads in a message.
TIE_WORDS = {"q_identity": "W_Q = identity slice", "q_eq_k": "W_Q = W_K", "k_eq_v": "W_V = W_K",
             "q_eq_v": "W_Q = W_V"}


def layers_text(layers: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``"0-2, 5"``."""
    runs: list[list[int]] = []
    for i in sorted(layers):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _in_layers(ids: list[int], n_layers: int) -> str:
    if len(ids) == n_layers:
        return "every layer"
    return ("layer " if len(ids) == 1 else "layers ") + layers_text(ids)


def disagreement(layout_variant: str, per_layer: list[dict]) -> str | None:
    """The one wording (``info``, ``analyze`` and the Inspector) of the layout's variant and the
    tensors' ties disagreeing, e.g. ``the layout reads variant qkv, but the tensors read k_eq_v
    (W_V = W_K in every layer, to float tolerance)``; None when they agree. ``per_layer``: one
    ``tied_layer`` dict per layer; a ``mixed`` checkpoint's note names each layer's variant too."""
    seen = tied_variant(per_layer)
    if seen == layout_variant:
        return None
    n = len(per_layer)
    held = [f"{words} in {_in_layers(ids, n)}" for key, words in TIE_WORDS.items()
            if (ids := [t["layer"] for t in per_layer if t.get(key)])]
    by_layer = ""
    if seen == "mixed":
        groups: dict[str, list[int]] = {}
        for t in per_layer:
            groups.setdefault(str(layer_variant(t)), []).append(t["layer"])
        by_layer = "; by layer: " + ", ".join(f"{v} in {_in_layers(ls, n)}" for v, ls in groups.items())
    return (f"the layout reads variant {layout_variant}, but the tensors read "
            f"{seen or 'a combination without a variant name'} "
            f"({'; '.join(held) if held else 'no ties'}, to float tolerance{by_layer})")
