"""The canonical attention container (see DESIGN.md, "The canonical container").

Every checkpoint layout is converted into this one form. Naming and shapes follow
TransformerLens; ``x`` is a row vector and head ``h``'s query is ``x @ W_Q[h]``.

Per layer:

=========  ==============================  =============================================
name       shape                           note
=========  ==============================  =============================================
``W_Q``    ``[n_heads, d_model, d_head]``  ``None`` when the query is the identity slice
``W_K``    ``[n_kv_heads, d_model, d_head]``  kept at n_kv_heads; expand only on purpose
``W_V``    ``[n_kv_heads, d_model, d_head]``
``W_O``    ``[n_heads, d_head, d_model]``
``b_Q``    ``[n_heads, d_head]`` or None
``b_K``    ``[n_kv_heads, d_head]`` or None
``b_V``    ``[n_kv_heads, d_head]`` or None
``b_O``    ``[d_model]`` or None
=========  ==============================  =============================================

Tied variants keep every tensor present so that formulas apply uniformly:
``q_eq_k`` has ``W_Q`` equal to ``W_K`` (expanded to n_heads when n_kv_heads <
n_heads, as ``W_K[h // group]``), ``k_eq_v`` has ``W_V`` equal to ``W_K``,
``q_eq_k_eq_v`` both. ``variant`` in the metadata says which tie holds;
parameter counts count a tied tensor once. ``wq_identity`` has ``W_Q = None``.

For GQA, query head ``h`` uses kv head ``h // (n_heads // n_kv_heads)``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator

import torch

VARIANTS = ("qkv", "wq_identity", "q_eq_k", "k_eq_v", "q_eq_k_eq_v")
#: Variants whose K and V are one cached tensor (KV cache halved).
KV_TIED = frozenset({"k_eq_v", "q_eq_k_eq_v"})
NORMS = ("layernorm", "rmsnorm", "none")

_DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1, "uint8": 1,
}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype named as in torch (``"bfloat16"``)."""
    return _DTYPE_BYTES.get(dtype.replace("torch.", ""), 4)


def n_cached(variant: str) -> int:
    """Tensors cached per layer and kv head: 1 for K=V variants, else 2."""
    return 1 if variant in KV_TIED else 2


@dataclass(frozen=True)
class ModelMeta:
    """Geometry and provenance of one checkpoint's attention.

    ``architecture`` is the layout converter's name (``gpt2``, ``nanogpt``,
    ``llama``, ``llama_meta``, ``neox``, ``bert``, ``phi3``, ``falcon``, ``opt``, ``gptj``,
    ``query_free``, ``projection_sharing``, ``qkvscope``, ...).
    ``positions``: ``learned``, ``rotary``, ``alibi``, ``none`` or ``unknown``.
    ``attn_scale`` multiplies q.k (usually ``1/sqrt(d_head)``).
    ``dtype`` is the storage dtype of the attention weights, as torch names it.
    ``config`` is the source's own configuration, JSON-serialisable.
    """

    architecture: str
    variant: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    norm: str
    positions: str
    attn_scale: float
    dtype: str
    params_total: int
    params_attention: int
    config: dict = field(default_factory=dict)

    @property
    def kv_bytes_per_token(self) -> int:
        """n_layers * n_cached * n_kv_heads * d_head * bytes(dtype)."""
        return (self.n_layers * n_cached(self.variant) * self.n_kv_heads
                * self.d_head * dtype_bytes(self.dtype))

    def to_json(self) -> dict:
        """The stable JSON shape of ``python -m app info --json`` (geometry part)."""
        out = asdict(self)
        out.pop("params_total")
        out.pop("params_attention")
        out["params"] = {"total": self.params_total, "attention": self.params_attention}
        out["kv_bytes_per_token"] = self.kv_bytes_per_token
        return out


@dataclass
class AttentionWeights:
    """One layer's attention in canonical form (shapes in the module docstring)."""

    layer: int
    W_Q: torch.Tensor | None
    W_K: torch.Tensor
    W_V: torch.Tensor
    W_O: torch.Tensor
    b_Q: torch.Tensor | None = None
    b_K: torch.Tensor | None = None
    b_V: torch.Tensor | None = None
    b_O: torch.Tensor | None = None

    def tensors(self) -> dict[str, torch.Tensor]:
        """The present tensors by canonical name."""
        names = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


class Checkpoint:
    """An opened checkpoint: metadata now, layers one at a time on demand.

    ``layer_fn(i)`` reads and converts only layer ``i``'s tensors, so a pass
    over ``layers()`` holds about one layer in memory (safetensors are mmapped).
    ``close()`` releases file handles and temporary folders (zip uploads).
    """

    def __init__(self, path: str, meta: ModelMeta,
                 layer_fn: Callable[[int], AttentionWeights],
                 close_fn: Callable[[], None] | None = None):
        self.path = path
        self.meta = meta
        self._layer_fn = layer_fn
        self._close_fn = close_fn

    def layer(self, i: int) -> AttentionWeights:
        if not 0 <= i < self.meta.n_layers:
            raise IndexError(f"layer {i} out of range 0..{self.meta.n_layers - 1}")
        return self._layer_fn(i)

    def layers(self) -> Iterator[AttentionWeights]:
        for i in range(self.meta.n_layers):
            yield self._layer_fn(i)

    def close(self) -> None:
        if self._close_fn is not None:
            self._close_fn()
            self._close_fn = None

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
