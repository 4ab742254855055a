"""PyTorch checkpoints (``torch.save``): the zip format memory-mapped, the
legacy (pre-1.6) pickle format loaded whole, both through the allow-list of
``pickles._torch_load``; the weights split from the training state.

Where the weights sit: under ``model_state_dict``, ``state_dict``, ``model``
or ``module``, else every top-level entry holding tensors (optimizer and
scheduler state dropped at once, one-element training counters kept as side
data); names lose ``_orig_mod.``/``module.`` prefixes. Budgets: every weight
must own its storage (``check_tensor``: no zero or overlapping strides, its
bytes inside the file), and side data is walked within the side-data budgets.
A memory-mapped file that changes (size or mtime) fails before the next
tensor is copied. Errors: ``CheckpointFormatError`` (no weights, a single
tensor, clashing names, budgets) and ``UnsafeCheckpointError``.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from loaders.budgets import BudgetExceeded, SideBudget, tensor_problem
from loaders.checkpoint_names import EXPECTED
from loaders.errors import CheckpointFormatError
from loaders.private_tensors import private
from loaders.sources.files import _check_unchanged, _Closing, _identity
from loaders.sources.pickles import _torch_load
from loaders.sources.side_data import _has_tensor, _jsonlike
from loaders.sources.sniff import _file_kind
from loaders.tensor_source import TensorSource

# torch.load top-level keys: where the weights may sit, and what is dropped.
_WEIGHT_CONTAINERS = ("model_state_dict", "state_dict", "model", "module")
_DROPPED = frozenset({"optimizer", "optimizer_state_dict", "optimizer_states", "optim",
                      "scheduler", "lr_scheduler", "lr_schedulers", "scaler", "grad_scaler"})
#: One-element tensors under these top-level names are training state, not weights.
_SCALAR_EXTRAS = frozenset({"iter_num", "step", "global_step", "epoch", "tokens_seen",
                            "best_val_loss", "val_loss", "loss"})
_CONFIG_KEYS = ("model_args", "model_config", "config")
_KEY_PREFIXES = ("_orig_mod.", "module.")


def check_tensor(path: str | Path, name: str, t: torch.Tensor) -> None:
    """Refuse an unpickled tensor that does not own its bytes (``budgets.tensor_problem``):
    zero or overlapping strides, or a shape beyond its storage. Call before any copy."""
    problem = tensor_problem(t)
    if problem is not None:
        raise CheckpointFormatError(path, f"tensor '{name}' {problem}; refused")


def strip_key_prefixes(key: str) -> str:
    """Remove ``_orig_mod.`` (torch.compile) and ``module.`` (DDP) prefixes."""
    changed = True
    while changed:
        changed = False
        for pre in _KEY_PREFIXES:
            if key.startswith(pre):
                key, changed = key[len(pre):], True
    return key


def _flatten_weights(p: Path, tree: Mapping, prefix: str = "",
                     out: dict | None = None, raw: dict | None = None,
                     skipped: list | None = None) -> tuple[dict, list]:
    """Nested mappings -> flat ``{dotted.name: tensor}`` with prefixes stripped.
    Non-tensor leaves are returned by name (not weights)."""
    out = {} if out is None else out
    raw = {} if raw is None else raw
    skipped = [] if skipped is None else skipped
    for k, v in tree.items():
        name = f"{prefix}{k}"
        if isinstance(v, torch.Tensor):
            key = strip_key_prefixes(name)
            if key in out:
                raise CheckpointFormatError(
                    p, f"tensor names '{raw[key]}' and '{name}' both become '{key}' after "
                       f"removing the {' and '.join(repr(x) for x in _KEY_PREFIXES)} prefixes")
            out[key], raw[key] = v, name
        elif isinstance(v, Mapping) and _has_tensor(v):
            _flatten_weights(p, v, f"{name}.", out, raw, skipped)
        else:
            skipped.append(name)
    return out, skipped


def _split_checkpoint(p: Path, obj) -> tuple[dict[str, torch.Tensor], dict, dict]:
    """A loaded checkpoint object -> (weights, config, extras); budgets broken
    anywhere in it (``BudgetExceeded``) become one ``CheckpointFormatError``."""
    try:
        return _split_checkpoint_within_budget(p, obj)
    except BudgetExceeded as exc:
        raise CheckpointFormatError(p, f"{exc}; refused") from None


def _split_checkpoint_within_budget(p: Path, obj) -> tuple[dict[str, torch.Tensor], dict, dict]:
    if isinstance(obj, torch.Tensor):
        raise CheckpointFormatError(
            p, f"holds a single tensor, not a state dict (shape {list(obj.shape)}, "
               f"{str(obj.dtype).replace('torch.', '')}); expected a mapping of names to tensors "
               f"(training-log tensors are read by the log readers)")
    if not isinstance(obj, Mapping):
        raise CheckpointFormatError(
            p, f"holds a {type(obj).__name__}, not a state dict; expected a mapping of names to tensors")
    container = next((k for k in _WEIGHT_CONTAINERS
                      if isinstance(obj.get(k), Mapping) and _has_tensor(obj[k])), None)
    extras: dict = {}
    if container is not None:
        weights, skipped = _flatten_weights(p, obj[container])
        rest = {k: v for k, v in obj.items() if k != container}
    else:
        tensor_part = {k: v for k, v in obj.items()
                       if k not in _DROPPED and _has_tensor(v) and not
                       (k in _SCALAR_EXTRAS and isinstance(v, torch.Tensor) and v.numel() == 1)}
        weights, skipped = _flatten_weights(p, tensor_part)
        rest = {k: v for k, v in obj.items() if k not in tensor_part}
    if not weights:
        keys = ", ".join(sorted(map(str, obj)))[:200] or "none"
        raise CheckpointFormatError(
            p, f"holds no weight tensors (top-level keys: {keys}); expected a state dict or a dict "
               f"with 'model', 'model_state_dict' or 'state_dict'")
    for name, t in weights.items():
        check_tensor(p, name, t)
    side = SideBudget()                               # one budget for all of this file's side data
    for k, v in rest.items():
        if str(k) not in _DROPPED:
            try:
                extras[str(k)] = _jsonlike(v, side)
            except BudgetExceeded as exc:
                raise BudgetExceeded(f"side entry '{k}': {exc}") from None
    if skipped:
        extras["non_tensor_entries"] = skipped
    config = next((dict(extras[k]) for k in _CONFIG_KEYS if isinstance(extras.get(k), dict)), {})
    return weights, config, extras


class TorchSource(_Closing, TensorSource):
    """A PyTorch checkpoint (``torch.save``): zip format memory-mapped, legacy
    format loaded whole. Optimizer state is dropped at once."""

    def __init__(self, path: str | Path, *, _kind: str | None = None):
        p = Path(path)
        kind = _kind or _file_kind(p)
        if kind not in ("torch_zip", "torch_legacy"):
            raise CheckpointFormatError(p, f"is not a PyTorch file (found {kind}); {EXPECTED}")
        self.path = str(p)
        self.format = "pytorch-zip" if kind == "torch_zip" else "pytorch-legacy"
        self._file, self._mapped = p, kind == "torch_zip"
        self._stat = _identity(p)
        obj = _torch_load(p, kind)
        try:
            self._weights, self.config, self.extras = _split_checkpoint(p, obj)
        finally:
            del obj                                   # drops optimizer state and other tensors

    def keys(self) -> list[str]:
        return list(self._weights)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._tensor(key).shape)

    def dtype(self, key: str) -> str:
        return str(self._tensor(key).dtype).replace("torch.", "")

    def get(self, key: str) -> torch.Tensor:
        """The tensor; for the (memory-mapped) zip format a copy, taken after
        checking that the file's size and mtime are those it had when opened, so
        a file cut by a rewrite fails with one line instead of a bus error."""
        t = self._tensor(key)
        if not self._mapped:
            return t
        try:
            _check_unchanged(self._file, self._stat, self._file.stat(), key)
        except OSError as exc:
            raise CheckpointFormatError(self._file, f"file cannot be read any more ({exc.strerror})") from None
        return private(t.clone())                        # a copy for this call alone

    def close(self) -> None:
        self._weights = {}

    def _tensor(self, key: str) -> torch.Tensor:
        try:
            return self._weights[key]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {key!r}") from None
