"""The canonical attention layer: one type for the loaders that build it and the analysis that reads it.

Per layer, TransformerLens naming and shapes (``x`` a row vector, head ``h``'s query
``x @ W_Q[h]``; ``loaders/canonical.py`` describes the conventions and the ties):

=========  ====================================  ==========================================
name       shape                                 note
=========  ====================================  ==========================================
``W_Q``    ``[n_heads, d_model, d_head]``        None: the identity slice (or ``query_module``)
``W_K``    ``[n_kv_heads, d_model, d_head]``     kept at n_kv_heads; expand only on purpose
``W_V``    ``[n_kv_heads, d_model, d_head]``
``W_O``    ``[n_heads, d_head, d_model]``
``b_Q``    ``[n_heads, d_head]`` or None
``b_K``    ``[n_kv_heads, d_head]`` or None
``b_V``    ``[n_kv_heads, d_head]`` or None
``b_O``    ``[d_model]`` or None
=========  ====================================  ==========================================

``Geometry`` is what a layer's metrics need of the model's metadata
(``loaders.canonical.ModelMeta`` has these fields and more). This module imports
torch only, so ``loaders`` and ``analysis`` both import it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


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
    q_norm: torch.Tensor | None = None     # [n_heads, d_head] QK-norm gain (loaders/canonical.py)
    k_norm: torch.Tensor | None = None     # [n_kv_heads, d_head]
    tower: str | None = None               # the layer's tower in a multi-tower checkpoint

    def tensors(self) -> dict[str, torch.Tensor]:
        """The present tensors by canonical name."""
        names = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "q_norm", "k_norm")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


class Geometry(Protocol):
    """The metadata fields a layer's metrics read (``variant``, ``norm``: ``loaders/canonical.py``)."""

    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    norm: str
    variant: str
