"""Helpers shared by the layout converters: config lookup, layer discovery,
shape validation, reshapes into canonical per-head form, parameter counts.
Whole converters of the common projection shapes are in ``_converters``, the
QK-norm reading in ``_qk_norm``, the non-attention tensors in ``_body``.

Reshape conventions (x is a row vector, canonical ``q_h = x @ W_Q[h]``):

* ``nn.Linear`` stores ``W`` as ``[out, in]`` and computes ``x @ W.T``. Its rows
  ``h*d_head:(h+1)*d_head`` are head ``h``'s outputs, so
  ``W_Q[h] = W[h*d_head:(h+1)*d_head, :].T``: ``rows_to_heads``.
* A Linear output projection ``[d_model, n*d_head]`` reads head ``h`` from
  columns ``h*d_head:(h+1)*d_head``: ``W_O[h] = W[:, cols].T``: ``cols_to_heads``.
* GPT-2's ``Conv1D`` stores ``[in, out]`` and computes ``x @ W`` (no transpose):
  ``conv_cols_to_heads`` / ``conv_rows_to_heads``.

Every function returns fresh tensors (``clone``), never views of the source's
tensors, so callers may modify results without touching the checkpoint.
"""
from __future__ import annotations

import math
import re
from os import path as os_path
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from analysis import registry
from loaders.canonical import AttentionWeights, ModelMeta
from loaders.checkpoint_names import HF_WEIGHT_FILES
from loaders.errors import CheckpointFormatError
from loaders.private_tensors import claim
from loaders.tensor_source import TensorSource

#: Non-parameter buffers that some frameworks save next to the weights:
#: nanoGPT/GPT-2/GPT-J/NeoX causal masks (``attn.bias`` [1, 1, T, T],
#: ``masked_bias``), rotary ``inv_freq`` and cached sin/cos tables, BERT's
#: ``position_ids``/``token_type_ids``, DeepSeek-V3's router ``e_score_correction_bias``
#: (a buffer updated outside the gradient). They are excluded from ``params_total``.
_BUFFER_SUFFIXES = ("masked_bias", "inv_freq", "position_ids", "token_type_ids",
                    "embed_positions", "freqs_cos", "freqs_sin", "cos_cached", "sin_cached",
                    "e_score_correction_bias")

#: Output-embedding / input-embedding key endings checked for weight tying.
_OUT_EMBED = ("lm_head.weight", "output.weight", "embed_out.weight")
_IN_EMBED = ("wte.weight", "embed_tokens.weight", "tok_embeddings.weight",
             "word_embeddings.weight", "embed_in.weight")


def fmt_shape(shape: Iterable[int]) -> str:
    """``(48, 20)``; a 1-d shape prints as ``(48)``."""
    return "(" + ", ".join(str(int(s)) for s in shape) + ")"


def cfg(source: TensorSource, *names: str, default=None):
    """The first of ``names`` present (and not None) in the source's config."""
    config = source.config or {}
    for name in names:
        if config.get(name) is not None:
            return config[name]
    return default


def as_int(source: TensorSource, value, what: str) -> int:
    """A config value that must be a whole number (a JSON int, or a float with
    no fractional part); anything else names the field and what was found."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
        raise CheckpointFormatError(
            source.path, f"config {what} must be a whole number, found {value!r:.80}")
    return int(value)


def cfg_int(source: TensorSource, *names: str, default=None):
    """``cfg`` for a whole-number field; ``default`` (from tensor shapes) is trusted."""
    for name in names:
        value = (source.config or {}).get(name)
        if value is not None:
            return as_int(source, value, repr(name))
    return default


def cfg_float(source: TensorSource, *names: str, default=None):
    """``cfg`` for a finite real-number field."""
    for name in names:
        value = (source.config or {}).get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise CheckpointFormatError(
                    source.path, f"config {name!r} must be a finite number, found {value!r:.80}")
            return float(value)
    return default


def declared_other(source: TensorSource, model_types) -> bool:
    """True when the config names a model type that is not one of ``model_types``
    (then a layout must not claim the file by its key names alone)."""
    mt = model_type(source)
    return mt is not None and mt not in model_types


def keys_match(source: TensorSource, model_types, pattern: str) -> bool:
    """The common ``detect``: no other declared model type, and a key matching ``pattern``."""
    return not declared_other(source, model_types) and any_match(source.keys(), pattern)


def model_type(source: TensorSource) -> str | None:
    mt = (source.config or {}).get("model_type")
    return str(mt).lower() if mt else None


def find_layers(source: TensorSource, pattern: str, keys: list[str] | None = None
                ) -> tuple[str, list[int]]:
    """Match ``pattern`` (a regex with groups ``p``: prefix, ``i``: layer index)
    against every key. Returns the prefix and the sorted layer indices, or
    ``("", [])`` when nothing matches. Raises when the matching keys disagree on
    the prefix or the layer indices have gaps."""
    rx = re.compile(pattern)
    prefixes: set[str] = set()
    layers: set[int] = set()
    for key in keys if keys is not None else source.keys():
        m = rx.match(key)
        if m:
            prefixes.add(m.group("p"))
            layers.add(int(m.group("i")))
    if not layers:
        return "", []
    if len(prefixes) > 1:
        raise CheckpointFormatError(
            source.path, f"attention weights under several prefixes {sorted(prefixes)}; "
                         "expected one model per file")
    idx = sorted(layers)
    if idx != list(range(len(idx))):
        raise CheckpointFormatError(
            source.path, f"attention weights found for layers {idx}; "
                         f"expected layers 0..{len(idx) - 1} without gaps")
    return prefixes.pop(), idx


def any_match(keys: Iterable[str], pattern: str) -> bool:
    rx = re.compile(pattern)
    return any(rx.match(k) for k in keys)


def check_layers(source: TensorSource, n_found: int, n_config) -> None:
    if n_config is not None and as_int(source, n_config, "layer count") != n_found:
        raise CheckpointFormatError(
            source.path, f"config gives {int(n_config)} layers; "
                         f"found attention weights for {n_found} layers")


def require(source: TensorSource, keys: Iterable[str], have: set[str], layout: str) -> None:
    """One error listing every missing key, sorted."""
    missing = sorted(k for k in keys if k not in have)
    if missing:
        shown = ", ".join(f"'{k}'" for k in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        raise CheckpointFormatError(
            source.path, f"missing attention tensors for layout {layout}: {shown}{more}")


def expect_shape(source: TensorSource, key: str, expected: tuple[int, ...], layer: int,
                 basis: str) -> None:
    """``layer 3 key 'k' has shape (48, 20); expected (16, 48) for d_model 16``."""
    found = tuple(source.shape(key))
    if found != tuple(expected):
        raise CheckpointFormatError(
            source.path, f"layer {layer} key '{key}' has shape {fmt_shape(found)}; "
                         f"expected {fmt_shape(expected)} for {basis}")


def need_int(source: TensorSource, value, what: str, names: tuple[str, ...]) -> int:
    if value is None:
        raise CheckpointFormatError(
            source.path, f"config has no {what} ({'/'.join(names)}); "
                         f"it cannot be inferred from tensor shapes{missing_config_hint(source)}")
    return as_int(source, value, what)


def missing_config_hint(source: TensorSource) -> str:
    """What to add when a Hugging Face weight file came without any config: the
    file alone (a path or an upload) holds tensors only; its ``config.json`` sits
    beside it in the model's folder. Empty where the source brought a config."""
    if source.config or (source.extras or {}).get("config"):
        return ""
    name = os_path.basename(str(source.path).rstrip("/"))
    fmt = str(getattr(source, "format", ""))
    if not (fmt.startswith("safetensors") or name in HF_WEIGHT_FILES):
        return ""
    return (f"; {name} holds tensors only: add the config.json that sits beside {name} in the "
            f"model's folder (put it beside the file, upload both files together, or open the folder)")


def split_heads_check(source: TensorSource, d_model: int, n_heads: int, d_head: int | None
                      ) -> int:
    if d_head is not None:
        return as_int(source, d_head, "head_dim")
    if n_heads <= 0 or d_model % n_heads:
        raise CheckpointFormatError(
            source.path, f"d_model {d_model} is not divisible by {n_heads} heads")
    return d_model // n_heads


def basis(d_model: int, n_heads: int, n_kv: int, d_head: int) -> str:
    kv = f", {n_kv} kv heads" if n_kv != n_heads else ""
    return f"d_model {d_model}, {n_heads} heads{kv} of d_head {d_head}"


# ---- reshapes --------------------------------------------------------------

def fresh(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` that shares no memory with it, in ``t``'s own stride order.

    The reshapes above hand back transposed views of the stored matrices; a
    contiguous copy would transpose every projection element by element (half
    of reading a bfloat16 checkpoint), while a copy in the view's own layout is
    a linear ``memcpy``. The analysis reads the per-head matrices through
    ``matmul``, which takes either layout without copying.

    ``t`` itself when it covers all of a tensor its source read for this call
    alone (``loaders.private_tensors``): nothing else holds that memory.
    """
    if claim(t):
        return t
    return t.clone(memory_format=torch.preserve_format)


def rows_to_heads(w: torch.Tensor, n: int, d_head: int) -> torch.Tensor:
    """Linear ``[n*d_head, d_model]`` -> ``[n, d_model, d_head]``."""
    d = w.shape[1]
    return fresh(w.reshape(n, d_head, d).transpose(1, 2))  # (n, dh, d) -> (n, d, dh)


def cols_to_heads(w: torch.Tensor, n: int, d_head: int) -> torch.Tensor:
    """Linear output projection ``[d_model, n*d_head]`` -> ``[n, d_head, d_model]``."""
    d = w.shape[0]
    return fresh(w.reshape(d, n, d_head).permute(1, 2, 0))  # (d, n, dh) -> (n, dh, d)


def conv_cols_to_heads(w: torch.Tensor, n: int, d_head: int) -> torch.Tensor:
    """Conv1D ``[d_model, n*d_head]`` (x @ W) -> ``[n, d_model, d_head]``."""
    d = w.shape[0]
    return fresh(w.reshape(d, n, d_head).transpose(0, 1))  # (d, n, dh) -> (n, d, dh)


def conv_rows_to_heads(w: torch.Tensor, n: int, d_head: int) -> torch.Tensor:
    """Conv1D output projection ``[n*d_head, d_model]`` -> ``[n, d_head, d_model]``."""
    return fresh(w.reshape(n, d_head, w.shape[1]))


def bias_heads(b: torch.Tensor | None, n: int, d_head: int) -> torch.Tensor | None:
    """``[n*d_head]`` -> ``[n, d_head]``."""
    return None if b is None else fresh(b.reshape(n, d_head))


def expand_kv(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``[n_kv, ...]`` -> ``[n_heads, ...]`` with query head h reading kv head
    ``h // (n_heads // n_kv)`` (used only for tied ``W_Q = W_K``)."""
    group = n_heads // w.shape[0]
    return fresh(w.repeat_interleave(group, dim=0))


def identity_heads(d_model: int, n_heads: int, d_head: int, dtype: torch.dtype) -> torch.Tensor:
    """``[n, d_model, d_head]`` with ``I[h][h*d_head + j, j] = 1``: head h reads
    its slice ``x[h*d_head:(h+1)*d_head]``."""
    eye = torch.eye(d_model, n_heads * d_head, dtype=dtype)
    return fresh(eye.reshape(d_model, n_heads, d_head).transpose(0, 1))


def getter(source: TensorSource, have: set[str]) -> Callable[[str], torch.Tensor | None]:
    def get(key: str) -> torch.Tensor | None:
        return source.get(key) if key in have else None
    return get


# ---- metadata --------------------------------------------------------------

def is_buffer(source: TensorSource, key: str) -> bool:
    if key.endswith(_BUFFER_SUFFIXES):
        return True
    # causal masks registered as ``attn.bias`` / ``attention.bias``: [1, 1, T, T]
    return key.endswith(".bias") and len(source.shape(key)) == 4


def params_total(source: TensorSource) -> int:
    """Sum of numel over every tensor except buffers; an output embedding equal
    to the input embedding (weight tying saved twice) is counted once. The
    config's ``tie_word_embeddings`` decides when present, else the values."""
    keys = [k for k in source.keys() if not is_buffer(source, k)]
    total = sum(source.numel(k) for k in keys)
    outs = [k for k in keys if k.endswith(_OUT_EMBED)]
    ins = [k for k in keys if k.endswith(_IN_EMBED)]
    declared = (source.config or {}).get("tie_word_embeddings")
    for o in outs:
        for i in ins:
            if source.shape(o) == source.shape(i):
                if isinstance(declared, bool):
                    # The config says; reading two vocab-sized tensors to check
                    # would dominate the memory of `info` on a large model.
                    if declared:
                        total -= source.numel(o)
                    break
                a, b = source.get(o), source.get(i)
                if a.data_ptr() == b.data_ptr() or torch.equal(a, b):
                    total -= source.numel(o)
                    break
    return total


@dataclass(frozen=True)
class Geometry:
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int


def make_meta(source: TensorSource, *, architecture: str, variant: str, geom: Geometry,
              norm: str, positions: str, attn_scale: float | None, dtype_key: str,
              attention_keys: Iterable[str], **extra) -> ModelMeta:
    """``attention_keys``: every source tensor holding attention projection
    weights or biases; a tied tensor is one key, so it is counted once.
    ``extra``: the optional ``ModelMeta`` fields (``towers``, ``qk_norm``,
    ``logit_softcap``, ``latent``, ``notes``)."""
    if attn_scale is None:
        attn_scale = 1.0 / math.sqrt(geom.d_head)
    return ModelMeta(
        architecture=architecture, variant=variant, n_layers=geom.n_layers,
        n_heads=geom.n_heads, n_kv_heads=geom.n_kv_heads, d_model=geom.d_model,
        d_head=geom.d_head, norm=norm, positions=positions, attn_scale=float(attn_scale),
        dtype=source.dtype(dtype_key), params_total=params_total(source),
        params_attention=sum(source.numel(k) for k in set(attention_keys)),
        config=jsonable(source.config or {}), **extra)


def jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, torch.Tensor) and obj.numel() == 1:
        return obj.item()
    return str(obj)


def layer_fn(build: Callable[[int], AttentionWeights]) -> Callable[[int], AttentionWeights]:
    """Wrap a per-layer builder: reshapes run without autograd; the results are
    ordinary tensors (not inference tensors), so callers may put them in modules."""
    def fn(i: int) -> AttentionWeights:
        with torch.no_grad():
            return build(i)
    return fn



# ---- metric names a layout's notes name ------------------------------------

def metrics_reading(*projections: str) -> tuple[str, ...]:
    """The registered metric names (``analysis.registry``, plugins included) that read any of
    ``projections`` (``"Q"``, ``"K"``, ``"V"``, ``"O"``: each metric declares what it reads): a QK-norm
    changes what the W_Q and W_K ones describe; composed maps (``deepseek_mla``) the W_K and W_V ones."""
    return tuple(m.name for m in registry.METRICS if set(projections) & set(m.reads))
