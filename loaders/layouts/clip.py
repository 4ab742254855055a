"""Hugging Face CLIP, SigLIP and SigLIP 2: the full two-tower models (``CLIPModel``,
``SiglipModel``, ``Siglip2Model``) and either tower alone (``CLIPVisionModel``,
``CLIPTextModel``, ``SiglipVisionModel``, ``Siglip2VisionModel``, ...).

Keys: ``{tower}_model.encoder.layers.{i}.self_attn.{q,k,v,out}_proj.{weight,bias}``
with ``tower`` ``vision`` or ``text`` (``nn.Linear`` ``[d, d]``), or
``encoder.layers.{i}.self_attn...`` without a tower prefix for a one-tower model
whose config declares it (``clip_vision_model``, ``siglip_vision_model``, ...;
the prefix-less names are those of other encoders too, so they are claimed only
then). Geometry per tower: ``vision_config`` / ``text_config`` of a full model
(``hidden_size``, ``num_attention_heads``, ``num_hidden_layers``), else the
top-level fields of a one-tower config.

Towers: a full model is two attention stacks, reported as one checkpoint whose
layers are numbered vision first (``0 .. V-1``), then text (``V .. V+T-1``);
``meta.towers`` gives each tower's name, first layer and geometry and each
canonical layer carries ``tower`` (see ``loaders.canonical``). The top-level
geometry is the vision tower's.

Pre-LayerNorm blocks, learned positions, ``attn_scale = 1/sqrt(d_head)``; the
vision tower is bidirectional over patches, CLIP's text tower causal. SigLIP's
attention-pooling head (``head.attention``, an ``nn.MultiheadAttention`` with one
learned probe query) is not a layer of the stack: its parameters count in
``params_total`` only.
Source: transformers ``models/clip/modeling_clip.py``, ``models/siglip/modeling_siglip.py``.
"""
from __future__ import annotations

from dataclasses import replace

from loaders.canonical import AttentionWeights, Tower
from loaders.errors import CheckpointFormatError
from loaders.layouts import _common as C
from loaders.layouts._converters import convert_separate, hf_geometry

NAME = "clip"
PRIORITY = 30
MODEL_TYPES = frozenset({"clip", "clip_vision_model", "clip_text_model", "siglip",
                         "siglip_vision_model", "siglip_text_model", "siglip2",
                         "siglip2_vision_model", "siglip2_text_model"})
ARCHITECTURES = ("CLIP", "Siglip")
TOWERS = ("vision", "text")

_TOWER_RX = r"^(?P<p>(?:.*\.)?){t}_model\.encoder\.layers\.(?P<i>\d+)\.self_attn\.q_proj\.weight$"
_BARE_RX = r"^(?P<p>(?:.*\.)?)encoder\.layers\.(?P<i>\d+)\.self_attn\.q_proj\.weight$"


def _bare_tower(source) -> str | None:
    """The tower of a declared one-tower config (``..._vision_model`` / ``..._text_model``)."""
    mt = C.model_type(source) or ""
    return next((t for t in TOWERS if mt.endswith(f"_{t}_model")), None)


def _stacks(source) -> list[tuple[str, str]]:
    """``(tower, regex)`` for every tower present, vision first."""
    keys = source.keys()
    found = [(t, _TOWER_RX.format(t=t)) for t in TOWERS if C.any_match(keys, _TOWER_RX.format(t=t))]
    if not found and _bare_tower(source) and C.any_match(keys, _BARE_RX):
        found = [(_bare_tower(source), _BARE_RX)]
    return found


def detect(source) -> bool:
    return not C.declared_other(source, MODEL_TYPES) and bool(_stacks(source))


def _tower_config(source, tower: str) -> dict:
    sub = (source.config or {}).get(f"{tower}_config")
    if sub is not None and not isinstance(sub, dict):
        raise CheckpointFormatError(source.path, f"config {tower}_config must be an object, "
                                                 f"found {type(sub).__name__}")
    return sub if sub is not None else (source.config or {})


class _View:
    """The source seen with one tower's config as its config (for the shared helpers)."""

    def __init__(self, source, config):
        self._s, self.config, self.path = source, config, source.path

    def __getattr__(self, name):
        return getattr(self._s, name)


def convert(source):
    metas, fns, towers = [], [], []
    first = 0
    for tower, rx in _stacks(source):
        view = _View(source, _tower_config(source, tower))
        g = hf_geometry(view, rx, "{p}" + ("" if rx == _BARE_RX else f"{tower}_model.")
                          + "encoder.layers.0.self_attn.q_proj.weight")
        stem = g.prefix + ("" if rx == _BARE_RX else f"{tower}_model.") + "encoder.layers.{i}.self_attn."
        names = {"q": stem + "q_proj", "k": stem + "k_proj", "v": stem + "v_proj", "o": stem + "out_proj"}
        meta, fn = convert_separate(view, name=NAME, names=names, layers=g.layers, d=g.d, n=g.n,
                                      n_kv=g.n, dh=g.dh, norm="layernorm", positions="learned",
                                      attn_scale=None, have=g.have)
        metas.append(meta)
        fns.append(fn)
        towers.append(Tower(tower, first, len(g.layers), g.n, g.n, g.d, g.dh))
        first += len(g.layers)
    top = metas[0]
    geom = C.Geometry(first, top.n_heads, top.n_kv_heads, top.d_model, top.d_head)
    meta = C.make_meta(source, architecture=NAME, variant="qkv", geom=geom, norm="layernorm",
                       positions="learned", attn_scale=top.attn_scale, dtype_key=_first_key(source),
                       attention_keys=(), towers=tuple(towers))
    meta = replace(meta, params_attention=sum(m.params_attention for m in metas))

    def build(i: int) -> AttentionWeights:
        k = next(j for j, t in enumerate(towers) if t.has(i))
        layer = fns[k](i - towers[k].first_layer)
        layer.layer, layer.tower = i, towers[k].name
        return layer

    return meta, C.layer_fn(build)


def _first_key(source) -> str:
    """The first tower's layer-0 query weight (its dtype is the checkpoint's)."""
    rx = C.re.compile(_stacks(source)[0][1])
    return next(k for k in source.keys() if (m := rx.match(k)) and m.group("i") == "0")
