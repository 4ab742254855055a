"""Query-free attention (arXiv 2510.23912; code MarkoKarbevski/Wqkv_necessity,
a nanoGPT fork, ``model.py``) and its follow-up, nonlinear queries (arXiv
2603.13381; code MarkoKarbevski/beyond_query_linearity, ``model.py``).

Same keys as nanoGPT (``transformer.h.{i}.attn.c_attn`` / ``c_proj``, Linear),
recognised by ``query_mode`` (or the older ``use_query_weights``) in
``model_args``, or, without either, by a ``c_attn`` of ``2*d_model`` rows.
Config names: ``n_layer``, ``num_heads``, ``n_embd``, ``head_size``, ``bias``,
``scale``. What ``W_Q`` is per ``query_mode`` (their ``CausalSelfAttention``):

* ``identity`` (``use_query_weights=False``): ``c_attn = Linear(d, 2d)`` gives
  ``k, v``; ``q = x``, so head h's query is the slice
  ``x[h*d_head:(h+1)*d_head]``. ``W_Q = None``, variant ``wq_identity``.
* ``original``: ``q, k, v = c_attn(x).split(d)``; plain nanoGPT, variant ``qkv``.
* ``residual``: ``q = x + (x @ Wq.T + bq)``. Linear, so
  ``W_Q[h] = I[:, h-slice] + Wq[h-rows].T`` exactly; ``b_Q = bq``; ``qkv``.
* ``residual_gelu`` in Wqkv_necessity (``c_attn = Linear(d, 3d)``):
  ``q = x + GELU(x @ Wq.T + bq)``. Not linear: ``W_Q`` holds the inner weight
  ``Wq`` (head h: ``Wq[h-rows].T``) and ``b_Q`` its bias; the query is
  ``x_h + GELU(x @ W_Q[h] + b_Q[h])``.
* ``residual_gelu`` in beyond_query_linearity (``c_attn = Linear(d, 2d)``
  giving ``k, v``, beside a query module in the attention):
  ``q = x + residual_layernorm_output(residual_out(GELU(residual_in(
  residual_rmsnorm_input(x)))))``, with ``residual_rmsnorm_input =
  nn.RMSNorm(d, eps=1e-5)`` (weight ``[d]``), ``residual_in = Linear(d, d//2)``,
  ``residual_out = Linear(d//2, d)`` (biases with ``bias``) and
  ``residual_layernorm_output`` their ``LayerNorm(d, bias)``. No ``W_Q`` at all:
  ``W_Q = None`` (not the identity slice). Told apart from the other reading by
  the ``attn.residual_in`` keys; a 2d ``c_attn`` without them is ``identity``.

A ``residual_gelu`` query is not a linear map of x: ``meta.query_module`` says
what computes it, its W_Q metrics are absent with that note, the K/V metrics are
computed as for any layer; the variant is ``qkv`` (nothing tied, the KV cache
unchanged). The query module's parameters count as attention parameters (they
take W_Q's place).

``attn_scale`` is ``model_args['scale']`` (their flash path passes it to
``scaled_dot_product_attention``; the paper trains identity models with
``1/(2*sqrt(d_head))``); when absent, their ``GPTConfig`` default
``sqrt(1/64)`` (computed from the class default ``head_size=64``).

The whole model (``convert_model``) is nanoGPT's (``nanogpt.model_body``) for the
linear query modes (``RUNNABLE_MODES``); ``residual_gelu`` is refused there: the
project's GPT computes the query as ``x @ W_Q`` (or the identity slice) and has
no place for a query module.
"""
from __future__ import annotations

import math

from loaders.canonical import AttentionWeights
from loaders.errors import CheckpointFormatError
from loaders.layouts import _common as C
from loaders.layouts import nanogpt
from loaders.layouts._body import NotRunnable

NAME = "query_free"
PRIORITY = 15

MODES = ("identity", "original", "residual", "residual_gelu")
#: The modes whose query is linear in x, which a forward pass of canonical W_Q runs.
RUNNABLE_MODES = ("identity", "original", "residual")


def _mode(source) -> str | None:
    config = source.config or {}
    if config.get("query_mode") is not None:
        return str(config["query_mode"])
    if config.get("use_query_weights") is not None:
        return "original" if config["use_query_weights"] else "identity"
    return None


def detect(source) -> bool:
    if C.model_type(source) is not None:
        return False
    k = nanogpt._first_c_attn(source)
    if k is None:
        return False
    if _mode(source) is not None:
        return True
    shape = source.shape(k)
    return len(shape) == 2 and shape[0] == 2 * shape[1]


#: The modules of beyond_query_linearity's residual_gelu query, each with a weight.
_QUERY_MODULE = ("residual_rmsnorm_input", "residual_in", "residual_out", "residual_layernorm_output")
_GELU_INNER = "q = x + GELU(x Wq + bq), Wq the first d_model rows of c_attn"
_GELU_MLP = ("q = x + LayerNorm(W_out GELU(W_in RMSNorm(x))), a bottleneck MLP d_model -> d_model/2 -> "
             "d_model (attn.residual_rmsnorm_input, residual_in, residual_out, residual_layernorm_output)")


def _query_module_keys(source, p, layers, d, have) -> list[str]:
    """Validate every layer's query module (module docstring); return its keys."""
    half = d // 2
    shapes = {"residual_rmsnorm_input.weight": (d,), "residual_in.weight": (half, d),
              "residual_in.bias": (half,), "residual_out.weight": (d, half), "residual_out.bias": (d,),
              "residual_layernorm_output.weight": (d,), "residual_layernorm_output.bias": (d,)}
    C.require(source, [f"{p}h.{i}.attn.{m}.weight" for i in layers for m in _QUERY_MODULE], have, NAME)
    keys = []
    for i in layers:
        for name, shape in shapes.items():
            k = f"{p}h.{i}.attn.{name}"
            if k in have:
                C.expect_shape(source, k, shape, i, f"d_model {d}, a query module of width {half}")
                keys.append(k)
    return keys


def convert(source):
    keys = source.keys()
    have = set(keys)
    mode = _mode(source) or "identity"
    if mode not in MODES:
        raise CheckpointFormatError(
            source.path, f"query_mode '{mode}' is not one of {', '.join(MODES)}")
    mlp_query = mode == "residual_gelu" and C.any_match(keys, r"^(?:.*\.)?h\.0\.attn\.residual_in\.weight$")
    rows = 2 if mode == "identity" or mlp_query else 3
    p, layers, d, n, dh = nanogpt.geometry(source, keys, rows)
    attn_keys = nanogpt.validate(source, p, layers, d, rows, have, NAME)
    if mlp_query:
        attn_keys += _query_module_keys(source, p, layers, d, have)
    variant = "wq_identity" if mode == "identity" else "qkv"
    scale = C.cfg_float(source, "scale", default=math.sqrt(1 / 64))
    geom = C.Geometry(len(layers), n, n, d, dh)
    query = None if mode != "residual_gelu" else (_GELU_MLP if mlp_query else _GELU_INNER)
    meta = C.make_meta(source, architecture=NAME, variant=variant, geom=geom, norm="layernorm",
                       positions="learned", attn_scale=scale,
                       dtype_key=f"{p}h.0.attn.c_attn.weight", attention_keys=attn_keys,
                       query_module=query)
    get = C.getter(source, have)

    def build(i: int) -> AttentionWeights:
        w = get(f"{p}h.{i}.attn.c_attn.weight")   # [rows*d, d], x @ w.T
        b = get(f"{p}h.{i}.attn.c_attn.bias")
        bo = get(f"{p}h.{i}.attn.c_proj.bias")
        o = 0 if rows == 2 else d                 # row offset of k
        W_Q = b_Q = None
        if rows == 3:
            W_Q = C.rows_to_heads(w[:d], n, dh)    # [n, d, dh]
            b_Q = None if b is None else C.bias_heads(b[:d], n, dh)
            if mode == "residual":
                W_Q = W_Q + C.identity_heads(d, n, dh, W_Q.dtype)
        return AttentionWeights(
            layer=i, W_Q=W_Q,
            W_K=C.rows_to_heads(w[o:o + d], n, dh),
            W_V=C.rows_to_heads(w[o + d:o + 2 * d], n, dh),
            W_O=C.cols_to_heads(get(f"{p}h.{i}.attn.c_proj.weight"), n, dh),
            b_Q=b_Q,
            b_K=None if b is None else C.bias_heads(b[o:o + d], n, dh),
            b_V=None if b is None else C.bias_heads(b[o + d:o + 2 * d], n, dh),
            b_O=None if bo is None else C.fresh(bo))

    return meta, C.layer_fn(build)


def convert_model(source):
    """``convert``'s (meta, layer_fn) and nanoGPT's ``Body``, for the linear query modes."""
    mode = _mode(source) or "identity"
    if mode in MODES and mode not in RUNNABLE_MODES:
        meta, _ = convert(source)
        raise NotRunnable(f"query_mode {mode!r} ({meta.query_module}) is not a linear query, and this GPT "
                          f"computes q as x @ W_Q; runnable modes: {', '.join(RUNNABLE_MODES)}")
    meta, layer = convert(source)
    return meta, layer, nanogpt.model_body(source)
