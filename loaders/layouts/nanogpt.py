"""nanoGPT (karpathy/nanoGPT) and forks that keep its module names.

Keys (``_orig_mod.``/``module.`` already stripped by the source reader):
``transformer.h.{i}.attn.c_attn.weight`` is an ``nn.Linear`` of shape
``[3*d_model, d_model]`` computing ``x @ W.T + b``; rows ``[q; k; v]``, each
``n_heads`` blocks of ``d_head`` (``q.view(B, T, n_head, C // n_head)``).
``c_proj.weight`` is ``[d_model, d_model]``. Biases exist when
``bias``/``use_bias`` is true. The causal-mask buffer ``attn.bias``
``[1, 1, T, T]`` (saved when flash attention is unavailable) is not a
parameter and is ignored.

``model_args`` names: ``n_layer``/``n_head``/``n_embd``, and the
``num_layers``/``num_heads``/``dim_embedding`` of some forks (e.g.
sqtian/GPT_by_Hand). ``d_model`` and the layer count come from the shapes when
absent; the head count cannot and must be in the config (or ``head_size``).
"""
from __future__ import annotations

from loaders.canonical import AttentionWeights
from loaders.layouts import _common as C

NAME = "nanogpt"
PRIORITY = 50

RX = r"^(?P<p>(?:.*\.)?)h\.(?P<i>\d+)\.attn\.c_attn\.weight$"
_N_LAYER = ("n_layer", "num_layers", "n_layers")
_N_HEAD = ("n_head", "num_heads", "n_heads")
_D_MODEL = ("n_embd", "dim_embedding", "d_model")


def _first_c_attn(source):
    for k in source.keys():
        m = C.re.match(RX, k)
        if m and m.group("i") == "0":
            return k
    return None


def detect(source) -> bool:
    if C.model_type(source) is not None:
        return False
    k = _first_c_attn(source)
    if k is None:
        return False
    shape = source.shape(k)
    return len(shape) == 2 and shape[0] == 3 * shape[1]


def geometry(source, keys, rows_per_d: int):
    """(prefix, layers, d_model, n_heads, d_head) of a nanoGPT-style source whose
    ``c_attn`` has ``rows_per_d * d_model`` rows."""
    p, layers = C.find_layers(source, RX, keys)
    C.check_layers(source, len(layers), C.cfg(source, *_N_LAYER))
    first = f"{p}h.0.attn.c_attn.weight"
    d = C.cfg_int(source, *_D_MODEL, default=source.shape(first)[1])
    n = C.cfg(source, *_N_HEAD)
    head_size = C.cfg(source, "head_size")
    if n is None and head_size:
        n = d // int(head_size)
    n = C.need_int(source, n, "head count", _N_HEAD)
    dh = C.split_heads_check(source, d, n, None)
    return p, layers, d, n, dh


def validate(source, p, layers, d, rows_per_d, have, layout=NAME):
    """Check every layer's c_attn/c_proj shapes; return the attention keys."""
    why = f"d_model {d}"
    C.require(source, [f"{p}h.{i}.attn.{m}.weight" for i in layers for m in ("c_attn", "c_proj")],
              have, layout)
    attn_keys = []
    for i in layers:
        ka, kp = f"{p}h.{i}.attn.c_attn.weight", f"{p}h.{i}.attn.c_proj.weight"
        C.expect_shape(source, ka, (rows_per_d * d, d), i, why)
        C.expect_shape(source, kp, (d, d), i, why)
        attn_keys += [ka, kp]
        for kb, shape in ((f"{p}h.{i}.attn.c_attn.bias", (rows_per_d * d,)),
                          (f"{p}h.{i}.attn.c_proj.bias", (d,))):
            if kb in have:
                C.expect_shape(source, kb, shape, i, why)
                attn_keys.append(kb)
    return attn_keys


def convert(source):
    keys = source.keys()
    have = set(keys)
    p, layers, d, n, dh = geometry(source, keys, 3)
    attn_keys = validate(source, p, layers, d, 3, have)
    geom = C.Geometry(len(layers), n, n, d, dh)
    meta = C.make_meta(source, architecture=NAME, variant="qkv", geom=geom, norm="layernorm",
                       positions="learned", attn_scale=None,
                       dtype_key=f"{p}h.0.attn.c_attn.weight", attention_keys=attn_keys)
    get = C.getter(source, have)

    def build(i: int) -> AttentionWeights:
        w = get(f"{p}h.{i}.attn.c_attn.weight")   # [3d, d], x @ w.T
        b = get(f"{p}h.{i}.attn.c_attn.bias")     # [3d] or None
        bo = get(f"{p}h.{i}.attn.c_proj.bias")
        return AttentionWeights(
            layer=i,
            W_Q=C.rows_to_heads(w[:d], n, dh),
            W_K=C.rows_to_heads(w[d:2 * d], n, dh),
            W_V=C.rows_to_heads(w[2 * d:], n, dh),
            W_O=C.cols_to_heads(get(f"{p}h.{i}.attn.c_proj.weight"), n, dh),
            b_Q=None if b is None else C.bias_heads(b[:d], n, dh),
            b_K=None if b is None else C.bias_heads(b[d:2 * d], n, dh),
            b_V=None if b is None else C.bias_heads(b[2 * d:], n, dh),
            b_O=None if bo is None else C.fresh(bo))

    return meta, C.layer_fn(build)
