"""The pickle allow-list: what a pickle may import, and how a refusal is named.

Two loaders, neither of which runs code from the file:

* ``_torch_load(path, kind)``: ``torch.load(weights_only=True)`` (PyTorch's
  restricted unpickler: tensors, storages, plain containers and numbers),
  plus the numpy scalar and dtype globals of ``_numpy_safe_globals`` that
  training scripts put beside the weights; memory-mapped for the zip format.
  A refused pickle raises ``UnsafeCheckpointError`` naming the first callable
  it asks for that is neither torch's nor in ``_PLAIN_GLOBALS`` (read from
  the opcodes by ``pickletools.genops``, which executes nothing); a pickle
  that ends early is ``CheckpointFormatError`` ("truncated or corrupt").
* ``load_plain_pickle(path)``: side files such as nanoGPT's ``meta.pkl``
  through ``_NoGlobals``, which imports no global at all and refuses
  persistent ids.

Budgets: ``load_plain_pickle`` reads at most ``QKVSCOPE_SIDE_BYTES`` and walks
the result within the side-data budgets (``side_data._jsonlike``). Tested in
``tests/loaders/test_sources_pickles.py`` (every allowed global, one gadget
per refused kind).
"""
from __future__ import annotations

import io
import pickle
import pickletools
import re
import struct
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch

from loaders.budgets import BudgetExceeded, budget
from loaders.errors import CheckpointFormatError, UnsafeCheckpointError
from loaders.sources.side_data import _jsonlike

_UNSAFE_HINT = ("  (qkvscope loads only plain tensors and containers; "
                "re-save the weights with safetensors)")


def _numpy_safe_globals() -> list:
    """numpy scalars and dtypes, which training scripts put beside the weights
    (e.g. ``best_val_loss`` as ``np.float64``); they construct plain numbers."""
    out = [np.dtype]
    core = getattr(np, "_core", None) or getattr(np, "core", None)
    scalar = getattr(getattr(core, "multiarray", None), "scalar", None)
    if scalar is not None:
        out.append(scalar)
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        for name in ("Float64DType", "Float32DType", "Int64DType", "Int32DType", "BoolDType"):
            if hasattr(dtypes, name):
                out.append(getattr(dtypes, name))
    return out


def _pickle_globals(p: Path, limit: int = 8) -> list[str]:
    """Names of the callables a (non-zip) pickle stream imports, found by
    ``pickletools.genops`` (parses opcodes, executes nothing)."""
    found: list[str] = []
    strings: list[str] = []
    try:
        with open(p, "rb") as f:
            for _ in range(limit):                       # legacy torch files hold several pickles
                for op, arg, _pos in pickletools.genops(f):
                    if op.name == "GLOBAL":
                        found.append(str(arg).replace(" ", "."))
                    elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                        found.append(f"{strings[-2]}.{strings[-1]}")
                    elif isinstance(arg, str):
                        strings.append(arg)
                if not f.peek(1):
                    break
    except (ValueError, EOFError, OSError, UnicodeDecodeError, struct.error):
        pass                                             # raw storage bytes follow the pickles
    return found


#: Globals that rebuild plain containers and numbers (torch's weights-only
#: loader accepts them); the first other global a pickle imports is named.
_PLAIN_GLOBALS = frozenset({
    "collections.OrderedDict", "collections.Counter", "_codecs.encode",
    "builtins.set", "builtins.frozenset", "builtins.bytearray", "builtins.bytes",
    "builtins.complex", "builtins.slice", "builtins.range",
    "numpy.dtype", "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar",
})


def _unsafe_reason(p: Path, kind: str, message: str) -> str:
    """The callable a refused pickle asks for: from the opcodes of a non-zip
    pickle (torch names only its first refusal, often a torch helper), else
    from torch's message."""
    for name in (_pickle_globals(p) if kind == "torch_legacy" else []):
        if not name.startswith("torch.") and name not in _PLAIN_GLOBALS:
            return f"the pickle calls {name}, which is not a tensor or container"
    m = re.search(r"GLOBAL ([\w.]+)", message)
    if m:
        return f"the pickle calls {m.group(1)}, which is not a tensor or container"
    m = re.search(r"(Unsupported operand \d+|Unsupported class [\w.]+|Trying to [^\n]+)", message)
    return m.group(1) if m else "torch's weights-only loader refused it"


_TRUNCATED = "PyTorch file is truncated or corrupt (its pickle data ends early or is malformed)"


def _torch_load(p: Path, kind: str):
    """``torch.load`` with ``weights_only=True``; mmap for the zip format."""
    try:
        with torch.serialization.safe_globals(_numpy_safe_globals()), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(p, map_location="cpu", weights_only=True, mmap=(kind == "torch_zip"))
    except pickle.UnpicklingError as exc:
        msg = str(exc)
        if "WeightsUnpickler error" in msg and re.search(r"EOF|truncated", msg):
            raise CheckpointFormatError(p, _TRUNCATED) from None
        raise UnsafeCheckpointError(p, f"refused to unpickle: {_unsafe_reason(p, kind, msg)}{_UNSAFE_HINT}") from None
    except (EOFError, IndexError, struct.error):         # the unpickler ran off the end of its data
        raise CheckpointFormatError(p, _TRUNCATED) from None
    except (RuntimeError, ValueError, OSError, KeyError, zipfile.BadZipFile) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointFormatError(p, f"PyTorch file cannot be read: {first}") from None


class _NoGlobals(pickle.Unpickler):
    """An unpickler that imports nothing: a pickle of plain values (dicts, lists,
    strings, numbers) loads, any callable or persistent id is refused."""

    def __init__(self, file, path: Path):
        super().__init__(file)
        self._path = path

    def find_class(self, module, name):
        raise UnsafeCheckpointError(
            self._path, f"refused to unpickle: the pickle calls {module}.{name}, which is not a plain "
                        f"value (a vocabulary pickle holds only dicts, strings and numbers)")

    def persistent_load(self, pid):
        raise UnsafeCheckpointError(self._path, "refused to unpickle: the pickle refers to outside "
                                                "objects (persistent ids)")


def load_plain_pickle(path: str | Path):
    """A pickle file of plain values only (nanoGPT's ``meta.pkl``: ``vocab_size``,
    ``itos``, ``stoi``), read without importing anything (``_NoGlobals``).

    The file may hold at most ``QKVSCOPE_SIDE_BYTES``; the loaded value is walked
    (``_jsonlike``: mapping keys become strings) within the side-data budgets, so
    a memo that repeats one container is charged once per occurrence.
    Raises ``UnsafeCheckpointError`` for a pickle that asks for a callable and
    ``CheckpointFormatError`` for a broken or oversized one."""
    p = Path(path)
    cap = budget("QKVSCOPE_SIDE_BYTES")
    size = p.stat().st_size
    if size > cap:
        raise CheckpointFormatError(
            p, f"pickle is {size:,} bytes, over the budget of {cap:,} (QKVSCOPE_SIDE_BYTES; set it in "
               f"the environment to raise it)")
    raw = p.read_bytes()
    try:
        obj = _NoGlobals(io.BytesIO(raw), p).load()
    except UnsafeCheckpointError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            struct.error, UnicodeDecodeError, MemoryError, RecursionError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CheckpointFormatError(p, f"pickle cannot be read ({first}); it is truncated or corrupt") from None
    try:
        return _jsonlike(obj)
    except BudgetExceeded as exc:
        raise CheckpointFormatError(p, f"{exc}; refused") from None
