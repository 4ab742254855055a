"""Hugging Face Phi-3 (``Phi3Model`` / ``Phi3ForCausalLM``).

Keys (prefix ``model.`` or none): ``layers.{i}.self_attn.qkv_proj.weight``, one
``nn.Linear`` ``[(n_heads + 2*n_kv_heads)*d_head, d_model]`` with rows
``[q; k; v]`` (``query_pos = n_heads*d_head``), no bias, and
``layers.{i}.self_attn.o_proj.weight``. GQA via ``num_key_value_heads``;
rotary (``partial_rotary_factor``), RMSNorm, ``attn_scale = 1/sqrt(d_head)``.
Source: transformers ``models/phi3/modeling_phi3.py`` (``Phi3Attention``).
"""
from __future__ import annotations

from loaders.layouts import _common as C
from loaders.layouts._converters import convert_fused, hf_geometry, split_concat

NAME = "phi3"
PRIORITY = 30
MODEL_TYPES = frozenset({"phi3"})
ARCHITECTURES = ("Phi3",)

_RX = r"^(?P<p>(?:.*\.)?)layers\.(?P<i>\d+)\.self_attn\.qkv_proj\.weight$"


def detect(source) -> bool:
    return C.keys_match(source, MODEL_TYPES, _RX)


def convert(source):
    g = hf_geometry(source, _RX, "{p}layers.0.self_attn.qkv_proj.weight", head_dim_key="head_dim")
    p, layers, d, n, dh, have = g.prefix, g.layers, g.d, g.n, g.dh, g.have
    n_kv = C.cfg_int(source, "num_key_value_heads", default=n)
    stem = p + "layers.{i}.self_attn."
    return convert_fused(source, name=NAME, qkv=stem + "qkv_proj", o=stem + "o_proj",
                           layers=layers, d=d, n=n, n_kv=n_kv, dh=dh,
                           split=split_concat(n, n_kv, dh), norm="rmsnorm",
                           positions="rotary", attn_scale=None, have=have)
