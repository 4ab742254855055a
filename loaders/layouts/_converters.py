"""Whole converters for the projection shapes many layouts share: one ``nn.Linear``
per projection (``convert_separate``), one fused Linear for q, k, v in one of three
row orders (``convert_fused`` with ``split_concat``/``split_interleaved``/
``split_grouped``), and the geometry every Hugging Face-style layout reads first
(``hf_geometry``). Reshape conventions as in ``_common``.
"""
from __future__ import annotations

from dataclasses import dataclass

from loaders.layouts._common import (Geometry, basis, bias_heads, check_layers, cfg, cfg_int,
                                     cols_to_heads, expect_shape, find_layers, fresh, getter,
                                     layer_fn, make_meta, need_int, require, rows_to_heads,
                                     split_heads_check)
from loaders.canonical import AttentionWeights
from loaders.tensor_source import TensorSource


# ---- the common "separate q, k, v, o Linear projections" shape ------------

def convert_separate(source: TensorSource, *, name: str, names: dict[str, str], layers: list[int],
                     d: int, n: int, n_kv: int, dh: int, norm: str, positions: str,
                     attn_scale: float | None, have: set[str]):
    """Layouts with one ``nn.Linear`` per projection. ``names`` maps ``q``,
    ``k``, ``v``, ``o`` to key stems with an ``{i}`` placeholder (``.weight``
    and the optional ``.bias`` are appended). Shapes: q ``[n*dh, d]``, k and v
    ``[n_kv*dh, d]``, o ``[d, n*dh]``; biases ``[rows]`` / ``[d]``."""
    why = basis(d, n, n_kv, dh)
    shapes = {"q": (n * dh, d), "k": (n_kv * dh, d), "v": (n_kv * dh, d), "o": (d, n * dh)}
    require(source, [names[r].format(i=i) + ".weight" for i in layers for r in "qkvo"], have, name)
    attn_keys = []
    for i in layers:
        for r in "qkvo":
            stem = names[r].format(i=i)
            expect_shape(source, stem + ".weight", shapes[r], i, why)
            attn_keys.append(stem + ".weight")
            if stem + ".bias" in have:
                expect_shape(source, stem + ".bias", (shapes[r][0],), i, why)
                attn_keys.append(stem + ".bias")
    geom = Geometry(len(layers), n, n_kv, d, dh)
    meta = make_meta(source, architecture=name, variant="qkv", geom=geom, norm=norm,
                     positions=positions, attn_scale=attn_scale,
                     dtype_key=names["q"].format(i=0) + ".weight", attention_keys=attn_keys)
    get = getter(source, have)

    def build(i: int) -> AttentionWeights:
        w = {r: get(names[r].format(i=i) + ".weight") for r in "qkvo"}
        b = {r: get(names[r].format(i=i) + ".bias") for r in "qkvo"}
        return AttentionWeights(
            layer=i,
            W_Q=rows_to_heads(w["q"], n, dh), W_K=rows_to_heads(w["k"], n_kv, dh),
            W_V=rows_to_heads(w["v"], n_kv, dh), W_O=cols_to_heads(w["o"], n, dh),
            b_Q=bias_heads(b["q"], n, dh), b_K=bias_heads(b["k"], n_kv, dh),
            b_V=bias_heads(b["v"], n_kv, dh),
            b_O=None if b["o"] is None else fresh(b["o"]))

    return meta, layer_fn(build)


# ---- fused q/k/v projections ----------------------------------------------

def split_concat(n: int, n_kv: int, d_head: int):
    """Rows ``[q (n*dh); k (n_kv*dh); v (n_kv*dh)]`` (Phi-3, Falcon multi-query)."""
    def split(t: torch.Tensor):
        a, b = n * d_head, (n + n_kv) * d_head
        return t[:a], t[a:b], t[b:]
    return split


def split_interleaved(n: int, d_head: int):
    """Rows grouped per head ``[n, 3, d_head]``: head h's q, k, v rows are
    adjacent (GPT-NeoX, Falcon-7B-style non-multi-query)."""
    def split(t: torch.Tensor):
        rest = t.shape[1:]
        t4 = t.reshape(n, 3, d_head, *rest)              # (n, 3, dh, ...)
        return (t4[:, 0].reshape(n * d_head, *rest), t4[:, 1].reshape(n * d_head, *rest),
                t4[:, 2].reshape(n * d_head, *rest))
    return split


def split_grouped(n: int, n_kv: int, d_head: int):
    """Rows grouped per kv head ``[n_kv, n/n_kv + 2, d_head]``: the group's
    queries, then its key, then its value (Falcon ``new_decoder_architecture``)."""
    g = n // n_kv

    def split(t: torch.Tensor):
        rest = t.shape[1:]
        t4 = t.reshape(n_kv, g + 2, d_head, *rest)       # (n_kv, g+2, dh, ...)
        return (t4[:, :g].reshape(n * d_head, *rest), t4[:, g].reshape(n_kv * d_head, *rest),
                t4[:, g + 1].reshape(n_kv * d_head, *rest))
    return split


def convert_fused(source: TensorSource, *, name: str, qkv: str, o: str, layers: list[int],
                  d: int, n: int, n_kv: int, dh: int, split, norm: str, positions: str,
                  attn_scale: float | None, have: set[str]):
    """Layouts with one fused ``nn.Linear`` ``[(n + 2*n_kv)*dh, d]`` for q, k, v
    (row order given by ``split``) and a Linear output projection ``[d, n*dh]``.
    ``qkv`` and ``o`` are key stems with an ``{i}`` placeholder."""
    why = basis(d, n, n_kv, dh)
    rows = (n + 2 * n_kv) * dh
    require(source, [s.format(i=i) + ".weight" for i in layers for s in (qkv, o)], have, name)
    attn_keys = []
    for i in layers:
        kq, ko = qkv.format(i=i), o.format(i=i)
        expect_shape(source, kq + ".weight", (rows, d), i, why)
        expect_shape(source, ko + ".weight", (d, n * dh), i, why)
        attn_keys += [kq + ".weight", ko + ".weight"]
        for kb, shape in ((kq + ".bias", (rows,)), (ko + ".bias", (d,))):
            if kb in have:
                expect_shape(source, kb, shape, i, why)
                attn_keys.append(kb)
    geom = Geometry(len(layers), n, n_kv, d, dh)
    meta = make_meta(source, architecture=name, variant="qkv", geom=geom, norm=norm,
                     positions=positions, attn_scale=attn_scale,
                     dtype_key=qkv.format(i=0) + ".weight", attention_keys=attn_keys)
    get = getter(source, have)

    def build(i: int) -> AttentionWeights:
        wq, wk, wv = split(get(qkv.format(i=i) + ".weight"))
        b = get(qkv.format(i=i) + ".bias")
        bq, bk, bv = split(b) if b is not None else (None, None, None)
        bo = get(o.format(i=i) + ".bias")
        return AttentionWeights(
            layer=i,
            W_Q=rows_to_heads(wq, n, dh), W_K=rows_to_heads(wk, n_kv, dh),
            W_V=rows_to_heads(wv, n_kv, dh),
            W_O=cols_to_heads(get(o.format(i=i) + ".weight"), n, dh),
            b_Q=bias_heads(bq, n, dh), b_K=bias_heads(bk, n_kv, dh), b_V=bias_heads(bv, n_kv, dh),
            b_O=None if bo is None else fresh(bo))

    return meta, layer_fn(build)


@dataclass(frozen=True)
class LayerGeometry:
    """What every Hugging Face-style converter reads first (see ``hf_geometry``)."""

    prefix: str
    layers: list[int]
    d: int
    n: int
    dh: int
    have: set


def hf_geometry(source: TensorSource, pattern: str, first_q: str, *,
                layer_keys=("num_hidden_layers",), d_keys=("hidden_size",),
                head_keys=("num_attention_heads",), head_dim_key: str | None = None) -> LayerGeometry:
    """Layers found by ``pattern`` (checked against the config's layer count),
    d_model from the config or the shape of ``first_q`` (a key template with
    ``{p}`` for the prefix; its input dimension is d_model), the head count
    from the config (it cannot come from shapes) and d_head."""
    keys = source.keys()
    p, layers = find_layers(source, pattern, keys)
    check_layers(source, len(layers), cfg(source, *layer_keys))
    d = cfg_int(source, *d_keys, default=source.shape(first_q.format(p=p))[1])
    n = need_int(source, cfg(source, *head_keys), "head count", tuple(head_keys))
    dh = split_heads_check(source, d, n, cfg(source, head_dim_key) if head_dim_key else None)
    return LayerGeometry(p, layers, d, n, dh, set(keys))
