"""Hugging Face Qwen3 (``Qwen3ForCausalLM``, and Qwen3-MoE's attention): Llama's
keys plus a per-head QK-norm.

Keys (prefix ``model.`` or none): ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``
as in ``loaders.layouts.llama`` (GQA, ``head_dim`` its own field), and
``layers.{i}.self_attn.{q,k}_norm.weight`` ``[head_dim]``: an RMSNorm over each
head's d_head, one gain shared by the heads, applied after the projection and
before rotary (``Qwen3Attention``: ``q_norm(q_proj(x).view(..., head_dim))``).
The canonical ``q_norm``/``k_norm`` hold the gains per head, ``meta.qk_norm =
"head"``, and the metrics of W_Q and W_K carry a note (``_qk_norm.qk_norm_notes``).
RMSNorm, rotary, ``attn_scale = head_dim ** -0.5``. Read by ``_qk_norm.qk_norm_layout``
(shared with ``olmo2``). Source: transformers ``models/qwen3/modeling_qwen3.py``.
"""
from __future__ import annotations

from loaders.layouts._qk_norm import detect_scope, qk_norm_layout

NAME = "qwen3"
PRIORITY = 34
MODEL_TYPES = frozenset({"qwen3", "qwen3_moe"})
ARCHITECTURES = ("Qwen3",)


def detect(source) -> bool:
    return detect_scope(source, MODEL_TYPES, per_head=True)


def convert(source):
    return qk_norm_layout(source, name=NAME, scope="head")
