"""BERT-style encoders: Hugging Face ``BertModel`` (with or without the
``bert.`` prefix of the task heads), RoBERTa, and sentence-transformers models
such as all-MiniLM-L6-v2 (a ``BertModel`` saved without prefix).

Keys: ``encoder.layer.{i}.attention.self.{query,key,value}.{weight,bias}``
(``nn.Linear`` ``[d_model, d_model]``) and
``encoder.layer.{i}.attention.output.dense.{weight,bias}`` (the output
projection). Post-LayerNorm blocks; learned absolute positions
(``position_embedding_type`` other than ``absolute`` gives ``unknown``);
bidirectional attention; ``attn_scale = 1/sqrt(d_head)``. Config:
``hidden_size``, ``num_attention_heads``, ``num_hidden_layers``.
Source: transformers ``models/bert/modeling_bert.py``.
"""
from __future__ import annotations

from loaders.layouts import _common as C
from loaders.layouts._converters import convert_separate, hf_geometry

NAME = "bert"
PRIORITY = 30
MODEL_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "electra"})
ARCHITECTURES = ("Bert", "Roberta", "XLMRoberta", "Camembert", "Electra")

_RX = r"^(?P<p>(?:.*\.)?)encoder\.layer\.(?P<i>\d+)\.attention\.self\.query\.weight$"


def detect(source) -> bool:
    return C.keys_match(source, MODEL_TYPES, _RX)


def convert(source):
    g = hf_geometry(source, _RX, "{p}encoder.layer.0.attention.self.query.weight")
    p, layers, d, n, dh, have = g.prefix, g.layers, g.d, g.n, g.dh, g.have
    stem = p + "encoder.layer.{i}.attention."
    names = {"q": stem + "self.query", "k": stem + "self.key", "v": stem + "self.value",
             "o": stem + "output.dense"}
    pe = C.cfg(source, "position_embedding_type", default="absolute")
    return convert_separate(source, name=NAME, names=names, layers=layers, d=d, n=n, n_kv=n,
                              dh=dh, norm="layernorm",
                              positions="learned" if pe == "absolute" else "unknown",
                              attn_scale=None, have=have)
