"""Weights the metrics can be computed from: floating point, and finite.

A diverged run's checkpoint holds NaN or Inf; one such value makes every
eigen-decomposition of its layer fail. ``nonfinite`` counts them per tensor of
a layer, so the layer's metrics are stored as null with a note saying why while
every finite layer gets its values. Integer, bool, complex and ``float8_e8m0fnu``
(a power-of-two scale format, no mantissa) tensors are no attention weights a
metric means anything of: ``unfit_dtype`` names the first one.
"""
from __future__ import annotations

import torch

#: Floating-point dtypes that are scales, not weights.
SCALE_DTYPES = frozenset({getattr(torch, "float8_e8m0fnu", torch.float32)} - {torch.float32})


def unfit_dtype(tensors: dict[str, torch.Tensor]) -> str | None:
    """``"W_Q is uint64"`` for the first tensor (by canonical name) that is not a
    floating-point weight, else None."""
    for name, t in tensors.items():
        if not t.dtype.is_floating_point or t.dtype in SCALE_DTYPES:
            return f"{name} is {str(t.dtype).replace('torch.', '')}"
    return None


def nonfinite(tensors: dict[str, torch.Tensor]) -> str | None:
    """``"1 NaN in W_Q; 512 Inf in W_K"``: the non-finite values of each tensor, or None when all are finite."""
    parts = []
    for name, t in tensors.items():
        t = t.float() if t.element_size() == 1 else t     # float8: torch has no isinf for it
        nan = int(torch.isnan(t).sum())
        inf = int(torch.isinf(t).sum())
        parts += [f"{nan} NaN in {name}"] if nan else []
        parts += [f"{inf} Inf in {name}"] if inf else []
    return "; ".join(parts) or None


def zeroed(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """float32 copies with every non-finite value set to 0 (the caller's tensors are not changed)."""
    return {n: torch.nan_to_num(t.float(), nan=0.0, posinf=0.0, neginf=0.0) for n, t in tensors.items()}


def widened(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """float32 copies of the float8 tensors (torch computes no product or norm in float8), by name."""
    return {n: t.float() for n, t in tensors.items() if t.element_size() == 1}
