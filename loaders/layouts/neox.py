"""Hugging Face GPT-NeoX / Pythia (``GPTNeoXModel`` / ``GPTNeoXForCausalLM``).

Keys (prefix ``gpt_neox.`` or none): ``layers.{i}.attention.query_key_value``,
one ``nn.Linear`` ``[3*d_model, d_model]`` whose rows are interleaved per head
``[n_heads, 3, d_head]`` (``qkv.view(..., -1, 3*head_size)`` then chunked), and
``layers.{i}.attention.dense`` ``[d_model, d_model]``; biases with
``attention_bias`` (default true). Rotary on the first ``rotary_pct`` of each
head, LayerNorm, ``attn_scale = 1/sqrt(d_head)``. Buffers ``attention.bias``,
``masked_bias``, ``rotary_emb.inv_freq`` are not parameters.
Source: transformers ``models/gpt_neox/modeling_gpt_neox.py``.
"""
from __future__ import annotations

from loaders.layouts import _common as C
from loaders.layouts._converters import convert_fused, hf_geometry, split_interleaved

NAME = "neox"
PRIORITY = 30
MODEL_TYPES = frozenset({"gpt_neox"})
ARCHITECTURES = ("GPTNeoX",)

_RX = r"^(?P<p>(?:.*\.)?)layers\.(?P<i>\d+)\.attention\.query_key_value\.weight$"


def detect(source) -> bool:
    return C.keys_match(source, MODEL_TYPES, _RX)


def convert(source):
    g = hf_geometry(source, _RX, "{p}layers.0.attention.query_key_value.weight")
    p, layers, d, n, dh, have = g.prefix, g.layers, g.d, g.n, g.dh, g.have
    stem = p + "layers.{i}.attention."
    return convert_fused(source, name=NAME, qkv=stem + "query_key_value", o=stem + "dense",
                           layers=layers, d=d, n=n, n_kv=n, dh=dh,
                           split=split_interleaved(n, dh), norm="layernorm",
                           positions="rotary", attn_scale=None, have=have)
