"""Hugging Face Qwen3 (``Qwen3ForCausalLM``, and Qwen3-MoE's attention): Llama's
keys plus a per-head QK-norm.

Keys (prefix ``model.`` or none): ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``
as in ``loaders.layouts.llama`` (GQA, ``head_dim`` its own field), and
``layers.{i}.self_attn.{q,k}_norm.weight`` ``[head_dim]``: an RMSNorm over each
head's d_head, one gain shared by the heads, applied after the projection and
before rotary (``Qwen3Attention``: ``q_norm(q_proj(x).view(..., head_dim))``).
The canonical ``q_norm``/``k_norm`` hold the gains per head, ``meta.qk_norm =
"head"``, and the metrics of W_Q and W_K carry a note (``_common.qk_norm_notes``).
RMSNorm, rotary, ``attn_scale = head_dim ** -0.5``.
Source: transformers ``models/qwen3/modeling_qwen3.py``.
"""
from __future__ import annotations

from loaders.layouts import _common as C

NAME = "qwen3"
PRIORITY = 34
MODEL_TYPES = frozenset({"qwen3", "qwen3_moe"})
ARCHITECTURES = ("Qwen3",)

_RX = r"^(?P<p>(?:.*\.)?)layers\.(?P<i>\d+)\.self_attn\.q_proj\.weight$"
_NORM_RX = r"^(?P<p>(?:.*\.)?)layers\.(?P<i>\d+)\.self_attn\.q_norm\.weight$"


def qk_norm_layout(source, *, name: str, scope: str):
    """Llama-style projections plus ``{q,k}_norm.weight`` (Qwen3: ``head``, OLMo 2: ``layer``)."""
    g = C.hf_geometry(source, _RX, "{p}layers.0.self_attn.q_proj.weight", head_dim_key="head_dim")
    p, layers, d, n, dh, have = g.prefix, g.layers, g.d, g.n, g.dh, g.have
    n_kv = C.cfg_int(source, "num_key_value_heads", default=n)
    stem = p + "layers.{i}.self_attn."
    meta, fn = C.convert_separate(source, name=name, names={r: stem + f"{r}_proj" for r in "qkvo"},
                                  layers=layers, d=d, n=n, n_kv=n_kv, dh=dh, norm="rmsnorm",
                                  positions="rotary", attn_scale=None, have=have)
    return C.add_qk_norm(source, meta, fn, q_key=stem + "q_norm.weight", k_key=stem + "k_norm.weight",
                         scope=scope, have=have, layers=layers, name=name)


def _norm_is_per_head(source) -> bool | None:
    """From the shapes: a ``[d_head]`` q_norm is per head, ``[n*d_head]`` (q_proj's rows) per layer."""
    keys = source.keys()
    for k in keys:
        m = C.re.match(_NORM_RX, k)
        if m and m.group("i") == "0":
            q = f"{m.group('p')}layers.0.self_attn.q_proj.weight"
            if q not in set(keys):
                return None
            return tuple(source.shape(k)) != (source.shape(q)[0],)
    return None


def detect(source) -> bool:
    mt = C.model_type(source)
    if mt is not None:
        return mt in MODEL_TYPES and C.any_match(source.keys(), _RX)
    return _norm_is_per_head(source) is True


def convert(source):
    return qk_norm_layout(source, name=NAME, scope="head")
