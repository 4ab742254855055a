"""Layout converters: one module per source layout, each turning a
``TensorSource`` into the canonical container (``loaders.canonical``).

The converter protocol. A module in this package (name not starting with
``_``) is a layout when it defines:

* ``NAME: str``: the layout's name, stored as ``ModelMeta.architecture``.
* ``PRIORITY: int``: detection order, lower first. Specific layouts go before
  generic ones: 5 this project's own variant models (``qkvscope``), 10-19 the
  papers' layouts recognised by their config fields (``projection_sharing``,
  ``query_free``), 20-39 layouts with distinctive key names (Hugging Face
  families, llama2.c/Meta), 40-59 generic fused ``c_attn`` layouts told apart
  by shape (``gpt2`` Conv1D, ``nanogpt`` Linear).
* ``detect(source) -> bool``: reads only key names, shapes and config; never
  tensor data.
* ``convert(source) -> (ModelMeta, layer_fn)``: validates every layer's shapes
  against the geometry (``CheckpointFormatError`` naming the key, the shape
  found and the one expected), then returns the metadata with parameter
  counts and ``layer_fn(i) -> AttentionWeights`` that reads only layer ``i``.
* optionally ``MODEL_TYPES`` (Hugging Face ``config.model_type`` values) and
  ``ARCHITECTURES`` (prefixes of ``config.architectures`` class names): a
  source whose config declares one of these is offered to that layout before
  any key-based detection.
* optionally ``convert_model(source) -> (ModelMeta, layer_fn, Body)``: the
  whole model for a forward pass, the embeddings, norms and MLPs in
  ``_body``'s canonical names (``nanogpt``, ``query_free``,
  ``projection_sharing``, ``llama_meta``); ``experiments.foreign`` builds the
  project's GPT from it, so a layout's key names stay in its module.

Discovery reads ``NAME``, ``PRIORITY``, ``MODEL_TYPES`` and ``ARCHITECTURES``
from each module's source (``loaders.discovery.declared``, nothing imported) and
imports a layout when ``pick`` reaches it: a qkvscope checkpoint loads
``qkvscope`` alone, not the twenty layouts after it. ``LAYOUTS`` (every layout,
imported, in detection order) is built on first use.

Shared helpers (modules starting with ``_``, not layouts): ``_common``
(config lookup, layer discovery, shape checks, reshapes, metadata),
``_converters`` (whole converters of the common projection shapes),
``_qk_norm`` (QK-norm gains), ``_body`` (the non-attention tensors).

Row order: each layout keeps its own row order inside a head. Notably HF
Llama-family ``q_proj``/``k_proj`` rows are permuted relative to Meta/llama2.c
``wq``/``wk`` (HF applies rotary with ``rotate_half`` on halves, Meta on
interleaved pairs), so ``W_Q`` of the same model read from the two layouts
differs by a fixed permutation of each head's d_head columns. Metrics that are
invariant to a rotation of the head basis agree; per-column ones do not.
"""
from __future__ import annotations

import importlib
import sys
from types import ModuleType

from loaders.discovery import UNREAD, declared
from loaders.tensor_source import TensorSource

#: The constants ``pick`` orders and offers layouts by, read without importing them.
_CONSTANTS = ("NAME", "PRIORITY", "MODEL_TYPES", "ARCHITECTURES")


def _discover() -> list[dict]:
    """Each layout's ``_CONSTANTS`` (and ``module``, its import name), in detection order; a
    module whose constants are not literals in its source is imported to read them."""
    found = []
    for module, consts in declared(sys.modules[__name__], ("NAME", "detect", "convert"), _CONSTANTS).items():
        if any(v is UNREAD for v in consts.values()):
            mod = importlib.import_module(module)
            consts = {c: getattr(mod, c) for c in _CONSTANTS if hasattr(mod, c)}
        found.append({"module": module, **consts})
    return sorted(found, key=lambda c: (c.get("PRIORITY", 50), c["NAME"]))


#: Every layout's constants, in detection order.
_ORDER: list[dict] = _discover()


def __getattr__(name: str):
    """``LAYOUTS``: every layout converter module, in detection order (imported on first use)."""
    if name != "LAYOUTS":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    layouts = [importlib.import_module(c["module"]) for c in _ORDER]
    globals()["LAYOUTS"] = layouts
    return layouts


def names() -> list[str]:
    """Known layout names, sorted."""
    return sorted(c["NAME"] for c in _ORDER)


def _declared(source: TensorSource, consts: dict) -> bool:
    config = source.config or {}
    mt = str(config.get("model_type") or "").lower()
    if mt and mt in consts.get("MODEL_TYPES", ()):
        return True
    archs = config.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    elif not isinstance(archs, (list, tuple)):
        return False  # malformed: the layouts' own detect() decides from the keys
    prefixes = tuple(consts.get("ARCHITECTURES", ()))
    return any(isinstance(a, str) and a.startswith(prefixes) for a in archs) if prefixes else False


def pick(source: TensorSource) -> ModuleType | None:
    """The layout for ``source``: first one its config declares (``model_type``
    or ``architectures``) whose ``detect`` agrees, else the first whose
    ``detect`` is true, in detection order; None when none matches. A layout is
    imported when its turn comes."""
    for consts in _ORDER:
        if _declared(source, consts):
            mod = importlib.import_module(consts["module"])
            if mod.detect(source):
                return mod
    for consts in _ORDER:
        mod = importlib.import_module(consts["module"])
        if mod.detect(source):
            return mod
    return None
