"""Hugging Face OPT (``OPTModel`` / ``OPTForCausalLM``).

Keys (prefix ``model.`` or none): ``decoder.layers.{i}.self_attn.{q,k,v,out}_proj``,
``nn.Linear`` ``[d_model, d_model]`` with biases (``enable_bias``). OPT
multiplies the projected query by ``scaling = d_head**-0.5``; the canonical
``W_Q``/``b_Q`` are the stored, unscaled weights and ``attn_scale`` carries the
factor, so ``logits = attn_scale * q.k`` as for every layout. Learned
positions (offset 2), LayerNorm. Config: ``hidden_size``,
``num_attention_heads``, ``num_hidden_layers``.
Source: transformers ``models/opt/modeling_opt.py`` (``OPTAttention``).
"""
from __future__ import annotations

from loaders.layouts import _common as C
from loaders.layouts._converters import convert_separate, hf_geometry

NAME = "opt"
PRIORITY = 30
MODEL_TYPES = frozenset({"opt"})
ARCHITECTURES = ("OPT",)

_RX = r"^(?P<p>(?:.*\.)?)decoder\.layers\.(?P<i>\d+)\.self_attn\.q_proj\.weight$"


def detect(source) -> bool:
    if C.declared_other(source, MODEL_TYPES):
        return False
    keys = source.keys()
    if C.any_match(keys, r"^(?:.*\.)?encoder\.layers\.\d+\."):
        return False  # encoder-decoder models (BART, ...) are not OPT
    return C.any_match(keys, _RX) and C.any_match(
        keys, r"^(?:.*\.)?decoder\.layers\.0\.self_attn\.out_proj\.weight$")


def convert(source):
    g = hf_geometry(source, _RX, "{p}decoder.layers.0.self_attn.q_proj.weight")
    p, layers, d, n, dh, have = g.prefix, g.layers, g.d, g.n, g.dh, g.have
    stem = p + "decoder.layers.{i}.self_attn."
    names = {"q": stem + "q_proj", "k": stem + "k_proj", "v": stem + "v_proj",
             "o": stem + "out_proj"}
    return convert_separate(source, name=NAME, names=names, layers=layers, d=d, n=n, n_kv=n,
                              dh=dh, norm="layernorm", positions="learned",
                              attn_scale=dh ** -0.5, have=have)
