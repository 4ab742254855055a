"""Hugging Face Gemma, Gemma 2 and Gemma 3 text models (``GemmaForCausalLM``,
``Gemma2ForCausalLM``, ``Gemma3ForCausalLM`` / ``Gemma3TextModel``).

Keys as Llama's (prefix ``model.`` or none): ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
``nn.Linear`` without biases, GQA via ``num_key_value_heads``. What differs:

* ``head_dim`` is its own config field and ``n_heads * head_dim`` need not be
  ``hidden_size`` (Gemma 7B: 16 x 256 = 4096 over 3072).
* Query pre-scaling: Gemma 2 and 3 scale logits by ``query_pre_attn_scalar ** -0.5``
  (``Gemma2Attention.scaling``), not ``head_dim ** -0.5``; Gemma 1 by ``head_dim ** -0.5``.
* Logit soft-capping (Gemma 2): ``logits = c * tanh(logits / c)`` with
  ``c = attn_logit_softcapping``, in ``meta.logit_softcap`` (Gemma 3: None).
* QK-norm (Gemma 3): ``self_attn.{q,k}_norm.weight`` ``[head_dim]``, an RMSNorm
  over each head's d_head with gain ``1 + weight`` (``Gemma3RMSNorm``); the
  canonical ``q_norm``/``k_norm`` hold that gain, ``meta.qk_norm = "head"``, and
  the metrics of W_Q and W_K carry a note (``_qk_norm.qk_norm_notes``).

Detected only from a declared ``model_type`` (the keys are Llama's). The
multimodal ``Gemma3ForConditionalGeneration`` (``model_type`` ``gemma3``, a
SigLIP tower beside the language model) is not read here.
RMSNorm (``1 + weight``), rotary positions (Gemma 2/3 alternate sliding-window
and global layers: ``sliding_window`` / ``layer_types`` stay in ``meta.config``).
Source: transformers ``models/gemma{,2,3}/modeling_gemma*.py``.
"""
from __future__ import annotations

from dataclasses import replace

from loaders.layouts import _common as C
from loaders.layouts._converters import convert_separate, hf_geometry
from loaders.layouts._qk_norm import add_qk_norm

NAME = "gemma"
PRIORITY = 34
MODEL_TYPES = frozenset({"gemma", "gemma2", "gemma3_text"})
ARCHITECTURES = ("GemmaFor", "Gemma2For", "Gemma3ForCausalLM", "Gemma3TextModel", "GemmaModel",
                 "Gemma2Model")

_RX = r"^(?P<p>(?:.*\.)?)layers\.(?P<i>\d+)\.self_attn\.q_proj\.weight$"


def detect(source) -> bool:
    return C.model_type(source) in MODEL_TYPES and C.any_match(source.keys(), _RX)


def convert(source):
    g = hf_geometry(source, _RX, "{p}layers.0.self_attn.q_proj.weight", head_dim_key="head_dim")
    p, layers, d, n, dh, have = g.prefix, g.layers, g.d, g.n, g.dh, g.have
    n_kv = C.cfg_int(source, "num_key_value_heads", default=n)
    mt = C.model_type(source)
    scalar = C.cfg_float(source, "query_pre_attn_scalar") if mt != "gemma" else None
    scale = (scalar if scalar is not None else dh) ** -0.5
    cap = C.cfg_float(source, "attn_logit_softcapping") if mt == "gemma2" else None
    stem = p + "layers.{i}.self_attn."
    meta, fn = convert_separate(source, name=NAME, names={r: stem + f"{r}_proj" for r in "qkvo"},
                                  layers=layers, d=d, n=n, n_kv=n_kv, dh=dh, norm="rmsnorm",
                                  positions="rotary", attn_scale=scale, have=have)
    meta = replace(meta, logit_softcap=cap)
    if (stem + "q_norm.weight").format(i=0) in have:
        meta, fn = add_qk_norm(source, meta, fn, q_key=stem + "q_norm.weight",
                                 k_key=stem + "k_norm.weight", scope="head", offset=1.0,
                                 have=have, layers=layers, name=NAME)
    return meta, fn
