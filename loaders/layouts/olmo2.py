"""Hugging Face OLMo 2 (``Olmo2ForCausalLM``): Llama's keys plus a QK-norm over
the whole projection.

Keys (prefix ``model.`` or none): ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``
as in ``loaders.layouts.llama``, and ``layers.{i}.self_attn.q_norm.weight``
``[n_heads*d_head]``, ``k_norm.weight`` ``[n_kv_heads*d_head]``: one RMSNorm over
all heads' concatenated q (and k), before the split into heads and before rotary
(``Olmo2Attention``: ``q_norm(q_proj(x))``). The canonical ``q_norm``/``k_norm``
hold the gains reshaped per head, ``meta.qk_norm = "layer"`` (the rms runs over
the layer's heads together), and the metrics of W_Q and W_K carry a note.
Post-norm blocks (``post_attention_layernorm`` after attention, no input norm):
the attention input is the raw residual stream. Rotary, ``attn_scale = head_dim ** -0.5``.
Read by ``_qk_norm.qk_norm_layout`` (shared with ``qwen3``).
Source: transformers ``models/olmo2/modeling_olmo2.py``.
"""
from __future__ import annotations

from loaders.layouts._qk_norm import detect_scope, qk_norm_layout

NAME = "olmo2"
PRIORITY = 34
MODEL_TYPES = frozenset({"olmo2"})
ARCHITECTURES = ("Olmo2",)


def detect(source) -> bool:
    return detect_scope(source, MODEL_TYPES, per_head=False)


def convert(source):
    return qk_norm_layout(source, name=NAME, scope="layer")
