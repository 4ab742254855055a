"""timm Vision Transformer state dicts (``timm.models.vision_transformer.VisionTransformer``:
ViT, DeiT, and the timm-trained ViTs of papers), as ``.pth``/``.bin``/safetensors.

Keys (prefix such as ``module.`` or none): ``blocks.{i}.attn.qkv.weight``, one
fused ``nn.Linear`` ``[3*d_model, d_model]`` with rows ``[q; k; v]`` (timm's
``qkv(x).reshape(B, N, 3, num_heads, head_dim)``), ``blocks.{i}.attn.qkv.bias``
with ``qkv_bias``, and ``blocks.{i}.attn.proj.{weight,bias}`` (``[d, d]``).
Pre-LayerNorm blocks, learned positions (``pos_embed``), bidirectional,
``attn_scale = head_dim ** -0.5``.

The head count is not in the tensors. It comes from the config that came with
the file (``num_heads`` or ``model_args.num_heads``; a timm Hub folder's
``config.json``, or ``model_args``/``args`` beside the weights) or else from a timm
architecture name there (``architecture``, ``arch``, ``model``:
``vit_{tiny,small,medium,base,large,huge,giant,gigantic}_...`` have 3, 6, 8,
12, 16, 16, 16, 16 heads, timm's own table); without either the file is
refused with that explanation. A timm ``attn.q_norm``/``attn.k_norm``
(LayerNorm with bias) is not read.
Source: timm ``timm/models/vision_transformer.py`` (``Attention``, ``vit_*`` entrypoints).
"""
from __future__ import annotations

from loaders.errors import CheckpointFormatError
from loaders.layouts import _common as C
from loaders.layouts._converters import convert_fused, split_concat

NAME = "timm_vit"
PRIORITY = 32
MODEL_TYPES = frozenset()

_RX = r"^(?P<p>(?:.*\.)?)blocks\.(?P<i>\d+)\.attn\.qkv\.weight$"

#: timm ``vit_<size>_...`` -> num_heads (timm/models/vision_transformer.py entrypoints).
SIZE_HEADS = {"tiny": 3, "small": 6, "medium": 8, "base": 12, "large": 16, "huge": 16,
              "giant": 16, "gigantic": 16}


def detect(source) -> bool:
    if C.model_type(source) is not None:          # a Hugging Face config: not a timm dict
        return False
    # timm's output projection is ``attn.proj`` (qkvscope's own Q=K=V model also has an
    # ``attn.qkv``, beside ``attn.o``)
    keys = source.keys()
    return C.any_match(keys, _RX) and C.any_match(keys, r"^(?:.*\.)?blocks\.0\.attn\.proj\.weight$")


def _arch_name(source) -> str | None:
    for where in (source.config or {}, source.extras or {}):
        for key in ("architecture", "arch", "model"):
            value = where.get(key)
            if isinstance(value, str) and value:
                return value
    return None


def _heads(source) -> int:
    config = source.config or {}
    for where in (config, config.get("model_args") if isinstance(config.get("model_args"), dict) else {},
                  (source.extras or {}).get("args") if isinstance((source.extras or {}).get("args"), dict)
                  else {}):
        if where.get("num_heads") is not None:
            return C.as_int(source, where["num_heads"], "'num_heads'")
    arch = _arch_name(source)
    if arch:
        m = C.re.match(r"^(?:[a-z0-9_]+\.)?(?:deit3?|vit)_([a-z]+)_", arch.split("/")[-1])
        if m and m.group(1) in SIZE_HEADS:
            return SIZE_HEADS[m.group(1)]
        raise CheckpointFormatError(
            source.path, f"timm architecture {arch!r:.80} is not one whose head count is known "
                         f"(vit_{{{','.join(SIZE_HEADS)}}}_...); add num_heads to the config")
    raise CheckpointFormatError(
        source.path, "config has no head count (num_heads): a timm state dict does not record it; "
                     "save it with a config.json holding num_heads or the timm architecture name "
                     "(e.g. {\"architecture\": \"vit_small_patch16_224\"})")


def convert(source):
    keys = source.keys()
    p, layers = C.find_layers(source, _RX, keys)
    C.check_layers(source, len(layers), C.cfg(source, "depth"))
    first = f"{p}blocks.0.attn.qkv.weight"
    d = C.cfg_int(source, "embed_dim", "num_features", default=source.shape(first)[1])
    n = _heads(source)
    dh = C.split_heads_check(source, d, n, None)
    stem = p + "blocks.{i}.attn."
    return convert_fused(source, name=NAME, qkv=stem + "qkv", o=stem + "proj", layers=layers,
                           d=d, n=n, n_kv=n, dh=dh, split=split_concat(n, n, dh),
                           norm="layernorm", positions="learned", attn_scale=None, have=set(keys))
