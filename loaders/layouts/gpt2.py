"""Hugging Face GPT-2 (``GPT2Model`` / ``GPT2LMHeadModel``).

Keys (prefix ``transformer.`` or none): ``h.{i}.attn.c_attn.weight`` is a
``Conv1D`` of shape ``[d_model, 3*d_model]`` computing ``x @ W + b`` (no
transpose; the OpenAI checkpoints were TensorFlow), columns ``[q | k | v]``,
each ``n_heads`` blocks of ``d_head``. ``h.{i}.attn.c_proj.weight`` is
``[d_model, d_model]``, rows ``h*d_head:(h+1)*d_head`` read head ``h``.
Config: ``n_embd``, ``n_head``, ``n_layer``; ``scale_attn_weights`` (default
true) gives ``attn_scale = 1/sqrt(d_head)``, else 1. With
``scale_attn_by_inverse_layer_idx`` layer ``i`` also divides by ``i + 1``
(kept in ``meta.config``; ``attn_scale`` is the layer-independent part).
Source: transformers ``models/gpt2/modeling_gpt2.py``.
"""
from __future__ import annotations

from loaders.canonical import AttentionWeights
from loaders.layouts import _common as C

NAME = "gpt2"
PRIORITY = 40
MODEL_TYPES = frozenset({"gpt2"})
ARCHITECTURES = ("GPT2",)

_RX = r"^(?P<p>(?:.*\.)?)h\.(?P<i>\d+)\.attn\.c_attn\.weight$"


def detect(source) -> bool:
    if C.declared_other(source, MODEL_TYPES):
        return False
    for k in source.keys():
        if C.re.match(_RX, k):
            shape = source.shape(k)
            # Conv1D: [d, 3d]; nanoGPT's nn.Linear is [3d, d].
            return len(shape) == 2 and shape[1] == 3 * shape[0]
    return False


def convert(source):
    keys = source.keys()
    have = set(keys)
    p, layers = C.find_layers(source, _RX, keys)
    C.check_layers(source, len(layers), C.cfg(source, "n_layer", "num_hidden_layers"))
    first = f"{p}h.0.attn.c_attn.weight"
    d = C.cfg_int(source, "n_embd", "hidden_size", default=source.shape(first)[0])
    n = C.need_int(source, C.cfg(source, "n_head", "num_attention_heads"), "head count",
                   ("n_head", "num_attention_heads"))
    dh = C.split_heads_check(source, d, n, None)
    why = f"d_model {d}"

    def k(i, name):
        return f"{p}h.{i}.attn.{name}"

    C.require(source, [k(i, m) for i in layers for m in ("c_attn.weight", "c_proj.weight")],
              have, NAME)
    attn_keys = []
    for i in layers:
        C.expect_shape(source, k(i, "c_attn.weight"), (d, 3 * d), i, why)
        C.expect_shape(source, k(i, "c_proj.weight"), (d, d), i, why)
        for b, shape in (("c_attn.bias", (3 * d,)), ("c_proj.bias", (d,))):
            if k(i, b) in have:
                C.expect_shape(source, k(i, b), shape, i, why)
                attn_keys.append(k(i, b))
        attn_keys += [k(i, "c_attn.weight"), k(i, "c_proj.weight")]

    scale = 1.0 / dh ** 0.5 if C.cfg(source, "scale_attn_weights", default=True) else 1.0
    geom = C.Geometry(len(layers), n, n, d, dh)
    meta = C.make_meta(source, architecture=NAME, variant="qkv", geom=geom, norm="layernorm",
                       positions="learned", attn_scale=scale, dtype_key=first,
                       attention_keys=attn_keys)
    get = C.getter(source, have)

    def build(i: int) -> AttentionWeights:
        w = get(k(i, "c_attn.weight"))            # [d, 3d], x @ w
        b = get(k(i, "c_attn.bias"))              # [3d] or None
        bo = get(k(i, "c_proj.bias"))
        return AttentionWeights(
            layer=i,
            W_Q=C.conv_cols_to_heads(w[:, :d], n, dh),
            W_K=C.conv_cols_to_heads(w[:, d:2 * d], n, dh),
            W_V=C.conv_cols_to_heads(w[:, 2 * d:], n, dh),
            W_O=C.conv_rows_to_heads(get(k(i, "c_proj.weight")), n, dh),
            b_Q=None if b is None else C.bias_heads(b[:d], n, dh),
            b_K=None if b is None else C.bias_heads(b[d:2 * d], n, dh),
            b_V=None if b is None else C.bias_heads(b[2 * d:], n, dh),
            b_O=None if bo is None else C.fresh(bo))

    return meta, C.layer_fn(build)
