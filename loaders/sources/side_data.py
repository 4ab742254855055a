"""Side data of a checkpoint (training state, configs, index metadata) made
JSON-like within the side-data budgets.

``_jsonlike`` keeps numbers, strings, lists and dicts (mapping keys become
strings, one-element tensors floats, tensors up to 1,024 elements lists,
larger ones a description); ``_has_tensor`` says whether a mapping holds
weights. Budgets (``loaders.budgets.SideBudget``): every value visited, each
occurrence of a shared container again, is charged against
``QKVSCOPE_SIDE_ITEMS`` / ``_DEPTH`` / ``_BYTES``, so a pickle memo "billion
laughs" stops before it is built. Errors: ``BudgetExceeded``, turned into a
``CheckpointFormatError`` by the caller that knows the file.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from loaders.budgets import BudgetExceeded, SideBudget, budget, tensor_problem

_EXTRA_TENSOR_MAX = 1024             # larger non-weight tensors are described, not listed


def _jsonlike(v, side: SideBudget | None = None, depth: int = 0):
    """Numbers, strings, lists and dicts only; one-element tensors -> float.

    Every value visited (each occurrence of a shared container again: a pickle
    memo repeating one list 10 times at 9 levels is 10^9 values) is charged to
    ``side`` (a fresh ``SideBudget`` if none), so the walk raises
    ``BudgetExceeded`` before it builds more than the budget allows.
    """
    side = SideBudget() if side is None else side
    if isinstance(v, torch.Tensor):
        side.spend(depth)
        if v.numel() == 1 and tensor_problem(v) is None:
            return float(v.item()) if not v.is_complex() else str(v.item())
        if v.numel() <= _EXTRA_TENSOR_MAX and not v.is_complex() and tensor_problem(v) is None:
            side.spend(depth, 8 * v.numel())
            return v.tolist()
        return f"tensor(shape={list(v.shape)}, dtype={str(v.dtype).replace('torch.', '')})"
    if isinstance(v, Mapping):
        side.spend(depth)
        out = {}
        for k, x in v.items():
            key = str(k)
            side.spend(depth + 1, len(key))
            out[key] = _jsonlike(x, side, depth + 1)
        return out
    if isinstance(v, (list, tuple, set, frozenset)):
        side.spend(depth)
        return [_jsonlike(x, side, depth + 1) for x in v]
    if v is None or isinstance(v, (bool, int, float)):
        side.spend(depth)
        return v
    if isinstance(v, str):
        side.spend(depth, len(v))
        return v
    if hasattr(v, "item") and hasattr(v, "dtype"):      # numpy scalar
        return _jsonlike(v.item(), side, depth)
    if isinstance(v, (bytes, bytearray)):
        side.spend(depth, 2 * len(v))
        return bytes(v).hex()
    text = str(v)
    side.spend(depth, len(text))
    return text


def _has_tensor(v, depth: int = 0) -> bool:
    if isinstance(v, torch.Tensor):
        return True
    if isinstance(v, Mapping):
        if depth > budget("QKVSCOPE_SIDE_DEPTH"):
            raise BudgetExceeded(f"mappings nested more than {budget('QKVSCOPE_SIDE_DEPTH')} levels "
                                 f"deep (or a mapping that holds itself), over the budget "
                                 f"(QKVSCOPE_SIDE_DEPTH; set it in the environment to raise it)")
        return any(_has_tensor(x, depth + 1) for x in v.values())
    return False
