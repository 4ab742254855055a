"""QK-norm: RMSNorm gains applied to q and k after the projection (Qwen3, OLMo 2,
Gemma 3), read into the canonical ``q_norm``/``k_norm`` (``loaders.canonical``), and
the Llama-keyed layouts that carry them (``qwen3``, ``olmo2``) read once.

Keys of those two (prefix ``model.`` or none): ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``
as in ``loaders.layouts.llama``, and ``layers.{i}.self_attn.{q,k}_norm.weight``:
``[head_dim]`` for a norm over each head's d_head (``head``: Qwen3), ``[n*head_dim]``
for one over all heads' concatenated projection (``layer``: OLMo 2). Without a
declared ``model_type`` the q_norm's shape tells the two apart (``norm_is_per_head``).
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Callable

import torch

from loaders.canonical import AttentionWeights, ModelMeta
from loaders.layouts._common import (any_match, basis, cfg_int, expect_shape, metrics_reading,
                                     fresh, layer_fn, model_type, require)
from loaders.layouts._converters import convert_separate, hf_geometry
from loaders.tensor_source import TensorSource

#: Llama's query projection and the QK-norm's query gain, ``p``: prefix, ``i``: layer.
Q_PROJ_RX = r"^(?P<p>(?:.*\.)?)layers\.(?P<i>\d+)\.self_attn\.q_proj\.weight$"
Q_NORM_RX = r"^(?P<p>(?:.*\.)?)layers\.(?P<i>\d+)\.self_attn\.q_norm\.weight$"


def qk_norm_notes(scope: str) -> dict[str, str]:
    """The note each Q- or K-reading metric carries when q and k pass an RMSNorm
    (``scope`` ``head`` or ``layer``) after the projection."""
    over = "each head's d_head" if scope == "head" else "all heads' concatenated projection"
    why = (f"computed on W_Q/W_K before the model's QK-norm: attention uses g * q / rms(q) and "
           f"g * k / rms(k) (RMSNorm over {over}; gains q_norm/k_norm in the canonical layer), "
           "so the logits' bilinear form is W_Q diag(g_q g_k) W_K^T up to per-token scales")
    return {m: why for m in metrics_reading("Q", "K")}


def norm_gains(source: TensorSource, key: str, n: int, d_head: int, scope: str, layer: int,
               why: str) -> None:
    """Check a QK-norm weight's shape: ``[d_head]`` for ``head`` scope (one gain
    shared by every head), ``[n*d_head]`` for ``layer`` scope."""
    expect_shape(source, key, (d_head,) if scope == "head" else (n * d_head,), layer, why)


def gains_to_heads(w: torch.Tensor, n: int, d_head: int, offset: float = 0.0) -> torch.Tensor:
    """A QK-norm weight ``[d_head]`` (shared by the heads) or ``[n*d_head]`` -> ``[n, d_head]``
    gains, ``offset`` added (Gemma's RMSNorm multiplies by ``1 + weight``)."""
    g = w.float() + offset if offset else w
    if g.dim() == 1 and g.shape[0] == d_head:
        return fresh(g.expand(n, d_head))                  # (dh,) -> (n, dh), shared gain
    return fresh(g.reshape(n, d_head))                     # (n*dh,) -> (n, dh)


def add_qk_norm(source: TensorSource, meta: ModelMeta, build: Callable[[int], AttentionWeights],
                *, q_key: str, k_key: str, scope: str, offset: float = 0.0, have: set[str],
                layers: list[int], name: str):
    """Wrap a converted separate-projection layout with its QK-norm weights
    (``q_key``/``k_key``: key templates with ``{i}``): shapes checked now, gains
    in every layer, ``meta.qk_norm`` and the notes set."""
    n, g, dh = meta.n_heads, meta.n_kv_heads, meta.d_head
    why = basis(meta.d_model, n, g, dh)
    require(source, [t.format(i=i) for i in layers for t in (q_key, k_key)], have, name)
    for i in layers:
        norm_gains(source, q_key.format(i=i), n, dh, scope, i, why)
        norm_gains(source, k_key.format(i=i), g, dh, scope, i, why)
    meta = replace(meta, qk_norm=scope, notes={**meta.notes, **qk_norm_notes(scope)})

    def with_norms(i: int) -> AttentionWeights:
        layer = build(i)
        layer.q_norm = gains_to_heads(source.get(q_key.format(i=i)), n, dh, offset)
        layer.k_norm = gains_to_heads(source.get(k_key.format(i=i)), g, dh, offset)
        return layer

    return meta, layer_fn(with_norms)


def qk_norm_layout(source: TensorSource, *, name: str, scope: str):
    """Llama-style projections plus ``{q,k}_norm.weight`` (Qwen3: ``head``, OLMo 2: ``layer``)."""
    g = hf_geometry(source, Q_PROJ_RX, "{p}layers.0.self_attn.q_proj.weight", head_dim_key="head_dim")
    p, layers, d, n, dh, have = g.prefix, g.layers, g.d, g.n, g.dh, g.have
    n_kv = cfg_int(source, "num_key_value_heads", default=n)
    stem = p + "layers.{i}.self_attn."
    meta, fn = convert_separate(source, name=name, names={r: stem + f"{r}_proj" for r in "qkvo"},
                                layers=layers, d=d, n=n, n_kv=n_kv, dh=dh, norm="rmsnorm",
                                positions="rotary", attn_scale=None, have=have)
    return add_qk_norm(source, meta, fn, q_key=stem + "q_norm.weight", k_key=stem + "k_norm.weight",
                       scope=scope, have=have, layers=layers, name=name)


def norm_is_per_head(source: TensorSource) -> bool | None:
    """From the shapes: a ``[d_head]`` q_norm is per head, ``[n*d_head]`` (q_proj's rows) per
    layer; None without a layer-0 q_norm beside a q_proj."""
    keys = source.keys()
    for k in keys:
        m = re.match(Q_NORM_RX, k)
        if m and m.group("i") == "0":
            q = f"{m.group('p')}layers.0.self_attn.q_proj.weight"
            if q not in set(keys):
                return None
            return tuple(source.shape(k)) != (source.shape(q)[0],)
    return None


def detect_scope(source: TensorSource, model_types, *, per_head: bool) -> bool:
    """The ``detect`` of a QK-norm layout: a declared ``model_type`` among ``model_types``
    with Llama's keys, or, undeclared, a q_norm per head (``per_head``) or per layer."""
    mt = model_type(source)
    if mt is not None:
        return mt in model_types and any_match(source.keys(), Q_PROJ_RX)
    return norm_is_per_head(source) is per_head
