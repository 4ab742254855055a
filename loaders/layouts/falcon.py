"""Hugging Face Falcon (``FalconModel`` / ``FalconForCausalLM``).

Keys (prefix ``transformer.`` or none): ``h.{i}.self_attention.query_key_value``
(fused ``nn.Linear``, biases with ``bias``) and ``h.{i}.self_attention.dense``.
The fused rows follow ``FalconAttention._split_heads``:

* ``new_decoder_architecture`` (Falcon-40B/180B): grouped per kv head,
  ``[n_kv_heads, n_heads/n_kv_heads + 2, d_head]``: the group's queries, its
  key, its value. ``n_kv_heads = num_kv_heads``.
* ``multi_query`` (Falcon-7B, the config default): ``[q (n*d_head); k (d_head);
  v (d_head)]``, one kv head.
* neither: interleaved per head ``[n_heads, 3, d_head]`` as in GPT-NeoX.

Rotary positions unless ``alibi``; LayerNorm; ``attn_scale = 1/sqrt(d_head)``.
Older RW configs name the fields ``n_head``, ``n_layer``, ``n_head_kv``.
Source: transformers ``models/falcon/modeling_falcon.py``.
"""
from __future__ import annotations

from loaders.layouts import _common as C
from loaders.layouts._converters import convert_fused, hf_geometry, split_concat, split_grouped, split_interleaved

NAME = "falcon"
PRIORITY = 30
MODEL_TYPES = frozenset({"falcon", "refinedweb", "refinedwebmodel"})
ARCHITECTURES = ("Falcon", "RW")

_RX = r"^(?P<p>(?:.*\.)?)h\.(?P<i>\d+)\.self_attention\.query_key_value\.weight$"


def detect(source) -> bool:
    return C.keys_match(source, MODEL_TYPES, _RX)


def convert(source):
    g = hf_geometry(source, _RX, "{p}h.0.self_attention.query_key_value.weight",
                      layer_keys=("num_hidden_layers", "n_layer"),
                      head_keys=("num_attention_heads", "n_head"))
    p, layers, d, n, dh, have = g.prefix, g.layers, g.d, g.n, g.dh, g.have
    new_arch = bool(C.cfg(source, "new_decoder_architecture", default=False))
    multi_query = bool(C.cfg(source, "multi_query", default=True))
    if new_arch:
        n_kv = C.cfg_int(source, "num_kv_heads", "n_head_kv", default=n)
        split = split_grouped(n, n_kv, dh)
    elif multi_query:
        n_kv = 1
        split = split_concat(n, 1, dh)
    else:
        n_kv = n
        split = split_interleaved(n, dh)
    stem = p + "h.{i}.self_attention."
    alibi = bool(C.cfg(source, "alibi", default=False))
    return convert_fused(source, name=NAME, qkv=stem + "query_key_value", o=stem + "dense",
                           layers=layers, d=d, n=n, n_kv=n_kv, dh=dh, split=split,
                           norm="layernorm", positions="alibi" if alibi else "rotary",
                           attn_scale=None, have=have)
