"""Open a checkpoint as the canonical container: file format -> layout -> Checkpoint.

``open_checkpoint(path)`` reads the container (``loaders.sources.open_source``:
safetensors, ``.bin``/``.pt``, Hugging Face folders, zips), picks the layout
converter (``loaders.layouts.pick``), validates every layer's shapes against
the configuration and returns a ``Checkpoint`` whose layers are read one at a
time. ``inspect_checkpoint(path)`` is what ``python -m app info`` prints.
"""
from __future__ import annotations

import json

import re
from pathlib import Path

import torch

from analysis.variants import KV_TIED, Q_TIED
from loaders import layouts
from loaders.canonical import Checkpoint
from loaders.errors import CheckpointFormatError, UnknownArchitectureError
from loaders.filecheck import check_openable
from loaders.sources import open_source
from loaders.tensor_source import TensorSource

#: Substrings that make a tensor name "attention-like" in error messages.
ATTENTION_HINTS = ("attn", "attention", "q_proj", "k_proj", "v_proj", "query", "key", "value",
                   "qkv", "c_attn", "wq", "wk", "wv", "c_q", "c_k", "c_v")
_HINT_RX = re.compile("|".join(re.escape(h) for h in ATTENTION_HINTS))
_MAX_LISTED = 20


def _attention_like(source: TensorSource) -> str:
    found = sorted(k for k in source.keys() if _HINT_RX.search(k.lower()))
    if not found:
        return "none"
    shown = [f"{k}: {tuple(source.shape(k))}" for k in found[:_MAX_LISTED]]
    more = f", and {len(found) - _MAX_LISTED} more" if len(found) > _MAX_LISTED else ""
    return ", ".join(shown) + more


def checkpoint_from_source(source: TensorSource, *, close: bool = True) -> Checkpoint:
    """Pick the layout for an opened source and convert it.

    Raises ``UnknownArchitectureError`` listing the attention-like tensors
    when no layout matches, ``CheckpointFormatError`` when one matches but a
    shape contradicts the configuration. ``close``: the Checkpoint's
    ``close()`` closes the source (and on error the source is closed here).
    """
    try:
        mod = layouts.pick(source)
        if mod is None:
            raise UnknownArchitectureError(
                source.path, "no known attention layout; attention-like tensors found: "
                             f"{_attention_like(source)} "
                             f"(known layouts: {', '.join(layouts.names())})")
        meta, layer_fn = mod.convert(source)
    except BaseException:
        if close:
            source.close()
        raise
    return Checkpoint(source.path, meta, layer_fn, close_fn=source.close if close else None)


def open_checkpoint(path: str | Path) -> Checkpoint:
    """Open ``path`` (file, Hugging Face folder or zip) as a canonical Checkpoint.
    Use it as a context manager, or call ``close()``."""

    check_openable(path)
    return checkpoint_from_source(open_source(path))


def _step(extras: dict) -> int | None:
    """The training step a checkpoint records: a top-level ``step``/``iter_num``/
    ``global_step`` entry, or the ``step`` of qkvscope's own ``qkvscope_run``
    safetensors metadata (JSON)."""
    candidates = dict(extras)
    run = (extras.get("safetensors_metadata") or {}).get("qkvscope_run")
    if isinstance(run, str):
        try:
            run = json.loads(run)
        except ValueError:
            run = None
    if isinstance(run, dict) and "step" not in candidates:
        candidates["step"] = run.get("step")
    for name in ("step", "iter_num", "global_step"):
        value = candidates.get(name)
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    return None


def count_nonfinite(ckpt: Checkpoint) -> int:
    """NaN/Inf values over the attention weights, one pass over the layers.
    A tied tensor is counted once (``W_Q`` of ``q_eq_k``, ``W_V`` of ``k_eq_v``)."""
    variant = ckpt.meta.variant
    skip = set()
    if variant in Q_TIED:
        skip |= {"W_Q", "b_Q"}
    if variant in KV_TIED:
        skip |= {"W_V", "b_V"}
    total = 0
    with torch.inference_mode():
        for layer in ckpt.layers():
            for name, t in layer.tensors().items():
                if name not in skip and t.is_floating_point():
                    total += _nonfinite(ckpt.path, name, t)
    return total


#: Float dtypes ``torch.isfinite`` has no kernel for, counted through float16
#: (which holds every FP8 value, NaN and Inf included).
_NO_ISFINITE = {getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                                            "float8_e5m2fnuz") if hasattr(torch, n)}


#: IEEE float formats: the integer type of the same width, the magnitude bits (all but the sign)
#: and the all-ones exponent. A value is NaN or Inf exactly when its magnitude bits, read as an
#: integer, reach the all-ones exponent (the exponent field is the magnitude's high bits).
_IEEE_BITS = {torch.bfloat16: (torch.int16, 0x7FFF, 0x7F80), torch.float16: (torch.int16, 0x7FFF, 0x7C00),
              torch.float32: (torch.int32, 0x7FFF_FFFF, 0x7F80_0000),
              torch.float64: (torch.int64, 0x7FFF_FFFF_FFFF_FFFF, 0x7FF0_0000_0000_0000)}
#: Elements per chunk of ``_any_nonfinite``'s pass (2-8 MiB of bits: the masked copy stays in cache).
_SCAN_CHUNK = 1 << 20


def _any_nonfinite(t: torch.Tensor) -> bool:
    """Whether ``t`` holds a NaN or an Inf, exactly, from the bits: ``max(bits & magnitude) >=
    exponent`` over the tensor read in memory order, a chunk at a time. One integer pass where
    ``isfinite`` on the strided bf16 views of a layer's heads converts every value (7B attention
    tensors ``[32, 4096, 128]``: 2-3 ms against 70 ms). True for a dtype without an entry (the
    exact count then decides)."""
    spec = _IEEE_BITS.get(t.dtype)
    if spec is None:
        return True
    if t.numel() == 0:
        return False
    kind, magnitude, exponent = spec
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    flat = t.permute(order)                          # the same elements, strides descending
    flat = flat.reshape(-1) if flat.is_contiguous() else t.reshape(-1)   # a view, or one copy
    bits = flat.view(kind)                           # [numel] integers, the float's bits
    return any(bool((c & magnitude).amax() >= exponent) for c in bits.split(_SCAN_CHUNK))


def _nonfinite(path, name: str, t: torch.Tensor) -> int:
    """NaN/Inf count of one dense tensor; a tensor without values (meta device)
    or not dense (sparse, nested) is a ``CheckpointFormatError``."""
    if t.is_meta:
        raise CheckpointFormatError(path, f"{name} is a meta tensor: it has a shape but no values")
    if t.is_nested or t.layout != torch.strided:
        raise CheckpointFormatError(path, f"{name} is a {'nested' if t.is_nested else t.layout} tensor; "
                                          f"expected a dense one")
    if t.dtype in _NO_ISFINITE:
        t = t.to(torch.float16)
    if not _any_nonfinite(t):
        return 0
    return int((~torch.isfinite(t)).sum())


def inspect_checkpoint(path: str | Path) -> dict:
    """The ``info`` JSON: ``ModelMeta.to_json()`` (architecture, variant,
    geometry, ``params``, ``kv_bytes_per_token``, ``config``) plus ``path``,
    ``nonfinite`` (NaN/Inf count over the attention weights) and ``step``
    (the source's ``step``/``iter_num`` when it has one)."""

    check_openable(path)
    source = open_source(path)
    extras = dict(source.extras or {})
    with checkpoint_from_source(source) as ckpt:
        info = ckpt.meta.to_json()
        info["path"] = str(path)
        info["nonfinite"] = count_nonfinite(ckpt)
    step = _step(extras)
    if step is not None:
        info["step"] = step
    return info
