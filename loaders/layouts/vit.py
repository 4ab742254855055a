"""Hugging Face vision transformers: ViT (``ViTModel``, ``ViTForImageClassification``),
DeiT (``DeiTModel``, ``DeiTForImageClassification...``) and DINOv2 (``Dinov2Model``).

Keys as checkpoints on disk hold them (what ``save_pretrained`` writes, prefix
``vit.``/``deit.``/``dinov2.`` or none):
``encoder.layer.{i}.attention.attention.{query,key,value}.{weight,bias}``
(``nn.Linear`` ``[d_model, d_model]``) and
``encoder.layer.{i}.attention.output.dense.{weight,bias}``. transformers 5.x
renames them in memory (``layers.{i}.attention.{q,k,v,o}_proj`` for ViT/DeiT,
``encoder.layer.{i}.attention.{q,k,v,o}_proj`` for DINOv2) and converts back on
save; a state dict taken from a live 5.x model is read as well.

Pre-LayerNorm blocks; learned absolute positions over patches (and the CLS /
distillation tokens); bidirectional attention over all patches;
``attn_scale = 1/sqrt(d_head)``. DINOv2's ``layer_scale`` multiplies the block
output, not the attention. Config: ``hidden_size``, ``num_attention_heads``,
``num_hidden_layers``.
Source: transformers ``models/vit/modeling_vit.py``, ``models/deit``, ``models/dinov2``.
"""
from __future__ import annotations

from loaders.layouts import _common as C
from loaders.layouts._converters import convert_separate, hf_geometry

NAME = "vit"
PRIORITY = 30
MODEL_TYPES = frozenset({"vit", "deit", "dinov2", "dinov2_with_registers"})
ARCHITECTURES = ("ViT", "DeiT", "Dinov2")

#: (query regex, q/k/v/o stems after the prefix, with ``{i}``): the names on disk, then
#: the 5.x in-memory names (ViT/DeiT ``layers.``, DINOv2 ``encoder.layer.``)
_STYLES = (
    (r"^(?P<p>(?:.*\.)?)encoder\.layer\.(?P<i>\d+)\.attention\.attention\.query\.weight$",
     {"q": "encoder.layer.{i}.attention.attention.query",
      "k": "encoder.layer.{i}.attention.attention.key",
      "v": "encoder.layer.{i}.attention.attention.value",
      "o": "encoder.layer.{i}.attention.output.dense"}),
    (r"^(?P<p>(?:.*\.)?)layers\.(?P<i>\d+)\.attention\.q_proj\.weight$",
     {r: f"layers.{{i}}.attention.{r}_proj" for r in "qkvo"}),
    (r"^(?P<p>(?:.*\.)?)encoder\.layer\.(?P<i>\d+)\.attention\.q_proj\.weight$",
     {r: f"encoder.layer.{{i}}.attention.{r}_proj" for r in "qkvo"}),
)


def _style(source):
    keys = source.keys()
    return next(((rx, names) for rx, names in _STYLES if C.any_match(keys, rx)), None)


def detect(source) -> bool:
    if C.declared_other(source, MODEL_TYPES):
        return False
    style = _style(source)
    # the 5.x in-memory names are generic; claim them only for a declared vision model
    return style is not None and (style[0] == _STYLES[0][0] or C.model_type(source) in MODEL_TYPES)


def convert(source):
    rx, names = _style(source)
    g = hf_geometry(source, rx, "{p}" + names["q"].format(i=0) + ".weight")
    p, layers, d, n, dh, have = g.prefix, g.layers, g.d, g.n, g.dh, g.have
    return convert_separate(source, name=NAME, names={r: p + s for r, s in names.items()},
                              layers=layers, d=d, n=n, n_kv=n, dh=dh, norm="layernorm",
                              positions="learned", attn_scale=None, have=have)
