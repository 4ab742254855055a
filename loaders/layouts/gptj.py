"""Hugging Face GPT-J (``GPTJModel`` / ``GPTJForCausalLM``).

Keys (prefix ``transformer.`` or none): ``h.{i}.attn.{q,k,v}_proj.weight`` and
``h.{i}.attn.out_proj.weight``, ``nn.Linear`` ``[d_model, d_model]`` without
bias. Rotary positions on the first ``rotary_dim`` dimensions of each head
(interleaved pairs, ``rotate_every_two``; row order kept); the rest pass
through. ``attn_scale = 1/sqrt(d_head)``. Config: ``n_embd``, ``n_head``,
``n_layer``, ``rotary_dim``. Buffers ``attn.bias``/``masked_bias``/
``embed_positions`` are not parameters.
Source: transformers ``models/gptj/modeling_gptj.py``.
"""
from __future__ import annotations

from loaders.layouts import _common as C
from loaders.layouts._converters import convert_separate, hf_geometry

NAME = "gptj"
PRIORITY = 30
MODEL_TYPES = frozenset({"gptj"})
ARCHITECTURES = ("GPTJ",)

_RX = r"^(?P<p>(?:.*\.)?)h\.(?P<i>\d+)\.attn\.q_proj\.weight$"


def detect(source) -> bool:
    if C.declared_other(source, MODEL_TYPES):
        return False
    keys = source.keys()
    return C.any_match(keys, _RX) and C.any_match(keys, r"^(?:.*\.)?h\.0\.attn\.out_proj\.weight$")


def convert(source):
    g = hf_geometry(source, _RX, "{p}h.0.attn.q_proj.weight",
                      layer_keys=("n_layer", "num_hidden_layers"), d_keys=("n_embd", "hidden_size"),
                      head_keys=("n_head", "num_attention_heads"))
    p, layers, d, n, dh, have = g.prefix, g.layers, g.d, g.n, g.dh, g.have
    stem = p + "h.{i}.attn."
    names = {"q": stem + "q_proj", "k": stem + "k_proj", "v": stem + "v_proj",
             "o": stem + "out_proj"}
    return convert_separate(source, name=NAME, names=names, layers=layers, d=d, n=n, n_kv=n,
                              dh=dh, norm="layernorm", positions="rotary", attn_scale=None,
                              have=have)
