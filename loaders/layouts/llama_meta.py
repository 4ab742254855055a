"""Meta's original Llama layout and llama2.c (karpathy/llama2.c ``model.py``).

Keys: ``layers.{i}.attention.{wq,wk,wv,wo}.weight``, ``nn.Linear`` without
bias: wq ``[n_heads*d_head, dim]``, wk/wv ``[n_kv_heads*d_head, dim]`` (GQA),
wo ``[dim, n_heads*d_head]``. Config (llama2.c ``model_args``, Meta
``params.json``): ``dim``, ``n_layers``, ``n_heads``, ``n_kv_heads`` (None or
absent: ``n_heads``). Rotary positions on interleaved pairs (Meta's own row
order, kept). RMSNorm; ``attn_scale = 1/sqrt(d_head)``.

The whole model (``convert_model``, for a forward pass; ``_body``'s names), as
llama2.c's ``Transformer``: ``tok_embeddings``, blocks ``layers.{i}`` with
``attention_norm``, ``attention``, ``ffn_norm`` and a SwiGLU ``feed_forward``
``w2(silu(w1 x) * w3 x)``, the final ``norm`` and ``output`` (absent or equal to
``tok_embeddings``: tied). RMSNorm ``x * rsqrt(mean(x^2) + eps) * w`` with eps
``norm_eps`` (1e-5); rotary base ``rope_theta`` (10000); context ``max_seq_len``
(2048). A v0 ``.bin`` export's rotary tables ``freqs_cos``/``freqs_sin`` must be
``cos``/``sin(t * rope_theta^(-2i/d_head))``, the rotation the body describes;
Meta's ``rope.freqs`` is a buffer.
"""
from __future__ import annotations

import torch

from loaders.layouts import _common as C
from loaders.layouts._body import Body, NotRunnable, gather, listed
from loaders.layouts._converters import convert_separate

NAME = "llama_meta"
PRIORITY = 20

_RX = r"^(?P<p>(?:.*\.)?)layers\.(?P<i>\d+)\.attention\.wq\.weight$"


def detect(source) -> bool:
    return C.model_type(source) is None and C.any_match(source.keys(), _RX)


def convert(source):
    keys = source.keys()
    have = set(keys)
    p, layers = C.find_layers(source, _RX, keys)
    C.check_layers(source, len(layers), C.cfg(source, "n_layers", "n_layer"))
    q0 = f"{p}layers.0.attention.wq.weight"
    d = C.cfg_int(source, "dim", default=source.shape(q0)[1])
    n = C.need_int(source, C.cfg(source, "n_heads"), "head count", ("n_heads",))
    dh = C.split_heads_check(source, d, n, None)
    n_kv = C.cfg_int(source, "n_kv_heads", default=n)
    names = {r: p + "layers.{i}.attention.w" + r for r in "qkvo"}
    return convert_separate(source, name=NAME, names=names, layers=layers, d=d, n=n,
                              n_kv=n_kv, dh=dh, norm="rmsnorm", positions="rotary",
                              attn_scale=None, have=have)


def convert_model(source):
    """``convert``'s (meta, layer_fn) and the model's :class:`Body` (module docstring)."""
    keys = source.keys()
    if not any(k.endswith("tok_embeddings.weight") for k in keys):
        raise NotRunnable(f"expected tok_embeddings.weight; found {listed(keys)}")
    meta, layer = convert(source)
    p, _ = C.find_layers(source, _RX, keys)
    if f"{p}layers.0.feed_forward.w1.weight" not in set(keys):
        raise NotRunnable("expected the MLP as layers.N.feed_forward.w1/w2/w3; found no "
                          "layers.0.feed_forward.w1.weight")
    tensors = gather(
        source, block=p + "layers.{i}.",
        top={p + "tok_embeddings.weight": "embed", p + "norm.weight": "ln_final.weight",
             p + "output.weight": "unembed"},
        modules={"attention_norm": "ln1", "ffn_norm": "ln2", "feed_forward.w1": "mlp.gate",
                 "feed_forward.w3": "mlp.in", "feed_forward.w2": "mlp.out"},
        attention=[f"attention.w{r}" for r in "qkvo"], skip=[p + "rope.freqs"])
    base = C.cfg_float(source, "rope_theta", default=10000.0)
    if {"freqs_cos", "freqs_sin"} <= set(keys):
        _check_rotary_tables(source.get("freqs_cos"), source.get("freqs_sin"), meta.d_head, base)
    return meta, layer, Body(
        tensors, mlp="swiglu", context=C.cfg_int(source, "max_seq_len", "seq_len", default=2048),
        norm_eps=C.cfg_float(source, "norm_eps", "rms_norm_eps", default=1e-5), rope_base=base)


def _check_rotary_tables(cos: torch.Tensor, sin: torch.Tensor, d_head: int, base: float) -> None:
    """``freqs_cos``/``freqs_sin`` ``[seq_len, d_head/2]`` must be cos/sin(t * base^(-2i/d_head))."""
    cos, sin = cos.double(), sin.double()
    inv = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)       # [d_head/2]
    ang = torch.outer(torch.arange(cos.shape[0], dtype=torch.float64), inv)         # [seq_len, d_head/2]
    if cos.shape != ang.shape or not (torch.allclose(cos, ang.cos(), atol=1e-4)
                                      and torch.allclose(sin, ang.sin(), atol=1e-4)):
        raise NotRunnable(
            f"the rotary tables freqs_cos/freqs_sin {tuple(cos.shape)} are not those of base {base:g} "
            f"and head size {d_head}, which this GPT applies")
