"""Checkpoint container formats: files, folders and zips -> ``TensorSource``.

``open_source(path)`` understands the container (not the layout) of a
checkpoint and returns a ``TensorSource`` whose tensors are read one at a time:

=======================================  ============================================
what ``path`` is                         how it is read
=======================================  ============================================
safetensors file                         header validated here, one tensor per
                                         ``get`` (``os.preadv``; ``safe_open`` mmap
                                         on request)
``*.safetensors.index.json`` + shards    one source over all shards, lazy per key
PyTorch zip file (.pt/.pth/.ckpt/.bin)   ``torch.load(weights_only=True, mmap=True)``
PyTorch legacy (pre-1.6) pickle file     ``torch.load(weights_only=True)`` (no mmap)
llama2.c export (v0, v1, v2 ``.bin``)    ``loaders/llama2c.py``: header checked against
                                         the file size, one tensor per ``get``
``pytorch_model.bin.index.json``         one source over the torch shards
Hugging Face folder (``config.json``)    config.json + model.safetensors / index /
                                         pytorch_model.bin
run folder (nanoGPT, paper code,         its one checkpoint file (+ model_config.yaml);
llama2.c ``out/``)                       a llama2.c ``tokenizer.bin`` is not a checkpoint
``.zip`` of any of these                 extracted safely to a temporary folder that
                                         ``close()`` deletes
=======================================  ============================================

The format is decided by content (magic bytes; for llama2.c's headerless v0
a header whose implied size is the file's), the suffix only breaks ties.
Nothing is ever unpickled beyond plain tensors and containers: a pickle that
asks for any other callable raises ``UnsafeCheckpointError`` and runs nothing.
``load_plain_pickle`` is the restricted unpickler for side files such as
nanoGPT's ``meta.pkl``: no global at all may be imported, and the result is
walked within the side-data budgets.

``content_hash(path)`` is the sha256 of a file, or of the files a folder or
sharded set is read from (names and contents), streamed in 1 MiB chunks; it
calls ``validate(path)`` first, so a safetensors file with a bad header is
refused before gigabytes are hashed.

Budgets (``loaders/budgets.py``), checked before allocating: every unpickled
tensor must use its own storage (``tensor_problem``: no zero or overlapping
strides, its bytes inside the file); side data is walked within
``QKVSCOPE_SIDE_ITEMS`` / ``_DEPTH`` / ``_BYTES``; YAML configs within
``QKVSCOPE_YAML_BYTES`` with aliases counted in full; zip entries may not
overlap and extraction writes at most ``QKVSCOPE_ZIP_TOTAL_BYTES``; a
safetensors tensor lying in a hole of a sparse file is refused. A file that
changes (size or mtime) after it was opened fails with one line before the
next tensor is read, never a bus error from a shrunken memory map.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import pickletools
import re
import shutil
import stat
import struct
import sys
import tempfile
import warnings
import weakref
import zipfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

import torch

from loaders.budgets import BudgetExceeded, SideBudget, budget, load_yaml, tensor_problem
from loaders import llama2c
from loaders.errors import CheckpointFormatError, FileError, UnsafeCheckpointError
from loaders.tensor_source import TensorSource

__all__ = [
    "open_source", "content_hash", "validate", "is_checkpoint_candidate", "check_tensor",
    "load_plain_pickle",
    "SafetensorsSource", "TorchSource", "ShardedSource", "ZipSource",
    "EXPECTED", "CHECKPOINT_SUFFIXES",
]

#: What a checkpoint may be, quoted in errors about unrecognised input.
EXPECTED = ("expected a safetensors, PyTorch (.bin/.pt/.pth/.ckpt) or zip file, "
            "or a folder with config.json")
CHECKPOINT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".zip")
_TORCH_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
_UNSAFE_HINT = ("  (qkvscope loads only plain tensors and containers; "
                "re-save the weights with safetensors)")

# safetensors: dtype code -> (torch name, bytes per element); the format's spec
# (huggingface/safetensors, "Format") and its Rust ``Dtype`` enum.
_ST_DTYPES = {
    "BOOL": ("bool", 1), "U8": ("uint8", 1), "I8": ("int8", 1),
    "F8_E5M2": ("float8_e5m2", 1), "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E8M0": ("float8_e8m0fnu", 1),
    "I16": ("int16", 2), "U16": ("uint16", 2), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "I32": ("int32", 4), "U32": ("uint32", 4), "F32": ("float32", 4),
    "I64": ("int64", 8), "U64": ("uint64", 8), "F64": ("float64", 8), "C64": ("complex64", 8),
}
#: The safetensors library refuses headers above this size (DoS guard).
_ST_MAX_HEADER = 100_000_000

# Zip uploads: limits against zip bombs and runaway extraction.
_ZIP_MAX_ENTRIES = 10_000
_ZIP_MAX_TOTAL = budget("QKVSCOPE_ZIP_TOTAL_BYTES")   # 64 GiB uncompressed in all (declared and written)
_ZIP_MAX_RATIO = 200                 # per entry, uncompressed / compressed
_ZIP_RATIO_MIN_SIZE = 1 << 20        # the ratio is checked for entries over 1 MiB
_ZIP_JUNK = ("__MACOSX/",)

# torch.load top-level keys: where the weights may sit, and what is dropped.
_WEIGHT_CONTAINERS = ("model_state_dict", "state_dict", "model", "module")
_DROPPED = frozenset({"optimizer", "optimizer_state_dict", "optimizer_states", "optim",
                      "scheduler", "lr_scheduler", "lr_schedulers", "scaler", "grad_scaler"})
#: One-element tensors under these top-level names are training state, not weights.
_SCALAR_EXTRAS = frozenset({"iter_num", "step", "global_step", "epoch", "tokens_seen",
                            "best_val_loss", "val_loss", "loss"})
_CONFIG_KEYS = ("model_args", "model_config", "config")
_KEY_PREFIXES = ("_orig_mod.", "module.")
_EXTRA_TENSOR_MAX = 1024             # larger non-weight tensors are described, not listed

_HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json",
               "pytorch_model.bin", "pytorch_model.bin.index.json")
_CHUNK = 1 << 20


# ----------------------------------------------------------------------------
# Public entry points
# ----------------------------------------------------------------------------

def open_source(path: str | Path) -> TensorSource:
    """Open a checkpoint file, sharded index, folder or zip as a ``TensorSource``.

    Raises ``CheckpointFormatError`` (or its subclass ``UnsafeCheckpointError``)
    naming the file, what was expected and what was found. Call ``close()`` on
    the result when done (it deletes a zip's temporary folder).
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointFormatError(p, f"no such file or folder; {EXPECTED}")
    if p.is_dir():
        return _open_folder(p)
    return _open_file(p)


def content_hash(path: str | Path) -> str:
    """sha256 hex digest identifying a checkpoint's content.

    * a single file: ``sha256(file bytes)`` (equals ``sha256sum FILE``);
    * a sharded index file or a folder: sha256 over the files it is read from,
      sorted by name relative to the index's/folder's directory, each fed as
      ``name`` + NUL + 8-byte little-endian size + bytes.

    Files are streamed in 1 MiB chunks, never read whole.
    """
    p = Path(path)
    validate(p)
    if p.is_dir():
        return _hash_files(p, _folder_plan(p).files)
    if p.name.endswith(".index.json"):
        return _hash_files(p.parent, [p, *_index_shard_paths(p)])
    h = hashlib.sha256()
    _feed(h, p)
    return h.hexdigest()


def validate(path: str | Path) -> None:
    """Cheap checks of a checkpoint before it is hashed or read: the file(s)
    exist and every safetensors file's header is valid (``_read_safetensors_header``:
    header length, JSON, dtypes, shapes, offsets that tile the data area).
    Reads only headers; raises ``CheckpointFormatError``. ``content_hash`` calls it."""
    p = Path(path)
    if not p.exists():
        raise CheckpointFormatError(p, f"no such file or folder; {EXPECTED}")
    if p.is_dir():
        files = _folder_plan(p).files
    elif p.name.endswith(".index.json"):
        files = [f for f in _index_shard_paths(p) if f.is_file()]
    else:
        files = [p]
    for f in files:
        if f.suffix.lower() != ".json" and f.is_file() and _file_kind(f) == "safetensors":
            entries, _, start = _read_safetensors_header(f)
            fd = os.open(f, os.O_RDONLY)
            try:
                for key, e in entries.items():
                    begin, end = e["data_offsets"]
                    _check_no_hole(f, fd, key, start + begin, end - begin)
            finally:
                os.close(fd)


def check_tensor(path: str | Path, name: str, t: torch.Tensor) -> None:
    """Refuse an unpickled tensor that does not own its bytes (``budgets.tensor_problem``):
    zero or overlapping strides, or a shape beyond its storage. Call before any copy."""
    problem = tensor_problem(t)
    if problem is not None:
        raise CheckpointFormatError(path, f"tensor '{name}' {problem}; refused")


def is_checkpoint_candidate(path: str | Path) -> bool:
    """Cheap test for folder scans: could ``open_source`` read this?

    Files need a checkpoint suffix (.safetensors, .bin, .pt, .pth, .ckpt, .zip)
    and matching magic bytes; folders need ``config.json`` and a weights file.
    Training-log tensors saved as ``.pt`` pass (a log reader handles them).
    """
    p = Path(path)
    try:
        if p.is_dir():
            return (p / "config.json").is_file() and any(
                c.is_file() and (c.name in _HF_WEIGHTS or c.suffix in _TORCH_SUFFIXES + (".safetensors",))
                for c in p.iterdir())
        if not p.is_file() or p.suffix.lower() not in CHECKPOINT_SUFFIXES:
            return False
        head, size = _head(p)
    except OSError:
        return False
    if p.suffix.lower() == ".zip":
        return head[:4] in (b"PK\x03\x04", b"PK\x05\x06")
    kind = _magic_kind(head, size)
    if kind == "unknown":
        if head[:4] == struct.pack("<I", llama2c.MAGIC):
            return True                     # a broken llama2.c v1/v2 export is an error to show
        try:
            return llama2c.sniff(p) is not None
        except CheckpointFormatError:
            return False
    return kind in ("zip", "pickle", "safetensors")


# ----------------------------------------------------------------------------
# Sniffing
# ----------------------------------------------------------------------------

def _head(p: Path) -> tuple[bytes, int]:
    size = p.stat().st_size
    with open(p, "rb") as f:
        return f.read(16), size


def _magic_kind(head: bytes, size: int) -> str:
    """``zip``, ``pickle``, ``safetensors``, ``empty`` or ``unknown`` from the first bytes."""
    if size == 0:
        return "empty"
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:   # PROTO opcode
        return "pickle"
    if len(head) >= 9 and head[8:9] == b"{":
        n = struct.unpack("<Q", head[:8])[0]
        if n <= size - 8:
            return "safetensors"
    return "unknown"


def _is_torch_zip(zf: zipfile.ZipFile) -> bool:
    """torch.save's zip: every entry under one folder that holds ``data.pkl``."""
    names = zf.namelist()
    tops = {n.split("/", 1)[0] for n in names}
    return len(tops) == 1 and f"{next(iter(tops))}/data.pkl" in names


def _file_kind(p: Path) -> str:
    """``safetensors``, ``torch_zip``, ``torch_legacy``, ``llama2c`` or ``zip``; raises otherwise."""
    head, size = _head(p)
    kind = _magic_kind(head, size)
    if kind == "empty":
        raise CheckpointFormatError(p, f"the file is empty (0 bytes); {EXPECTED}")
    if p.suffix.lower() == ".safetensors" and kind not in ("zip", "pickle"):
        return "safetensors"        # let the header validation say what is wrong
    if kind == "safetensors":
        return "safetensors"
    if kind == "pickle":
        return "torch_legacy"
    if kind == "zip":
        try:
            with zipfile.ZipFile(p) as zf:
                return "torch_zip" if _is_torch_zip(zf) else "zip"
        except (zipfile.BadZipFile, OSError) as exc:
            raise CheckpointFormatError(
                p, f"starts like a zip file (PyTorch or upload) but its directory cannot be read "
                   f"({exc}); the file is truncated or corrupt") from None
    if llama2c.sniff(p) is not None:                 # raises for a broken llama2.c export
        return "llama2c"
    raise CheckpointFormatError(p, f"unrecognised content (first bytes {head[:8].hex()}); {EXPECTED}")


def _open_file(p: Path) -> TensorSource:
    if p.name.endswith(".index.json"):
        return ShardedSource(p)
    kind = _file_kind(p)
    if kind == "safetensors":
        return SafetensorsSource(p)
    if kind in ("torch_zip", "torch_legacy"):
        return TorchSource(p, _kind=kind)
    if kind == "zip":
        return ZipSource(p)
    if kind == "llama2c":
        return llama2c.Llama2cSource(p)
    raise CheckpointFormatError(p, f"unrecognised content; {EXPECTED}")


# ----------------------------------------------------------------------------
# safetensors
# ----------------------------------------------------------------------------

def _identity(p: Path) -> tuple[int, int]:
    st = p.stat()
    return st.st_size, st.st_mtime_ns


def _check_unchanged(p: Path, was: tuple[int, int], st: os.stat_result, key: str) -> None:
    """A file rewritten while it is read (a training run saving over it) fails
    here, before tensor ``key`` is read, instead of faulting in a memory map."""
    now = (st.st_size, st.st_mtime_ns)
    if now != was:
        raise CheckpointFormatError(
            p, f"file changed while it was read (size {was[0]:,} -> {now[0]:,} bytes"
               f"{', modified' if now[1] != was[1] else ''}) before tensor '{key}'; read it again "
               f"once it is no longer being written")


class _Closing:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _read_safetensors_header(p: Path) -> tuple[dict[str, dict], dict[str, str], int]:
    """Parse and validate a safetensors header without reading tensor data.

    Layout (safetensors spec): 8-byte little-endian u64 ``N``; ``N`` bytes of
    UTF-8 JSON ``{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__":
    {str: str}}``; then the data area, offsets relative to its start. Tensors
    must tile the data area exactly: no overlap, no gap, no trailing bytes, and
    ``end - begin == numel * itemsize``.

    Returns ``(entries, metadata, data_start)``.
    """
    size = p.stat().st_size
    if size < 8:
        raise CheckpointFormatError(
            p, f"safetensors file is {size} bytes, shorter than the 8-byte header length prefix")
    with open(p, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        if n > _ST_MAX_HEADER:
            raise CheckpointFormatError(
                p, f"safetensors header length is {n} bytes, over the {_ST_MAX_HEADER}-byte limit")
        if n > size - 8:
            raise CheckpointFormatError(
                p, f"safetensors header says {n} bytes but the file has {size - 8} after the length prefix")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CheckpointFormatError(
            p, f"safetensors header is not UTF-8 (byte {exc.start} of the header)") from None
    except json.JSONDecodeError as exc:
        raise CheckpointFormatError(
            p, f"safetensors header is not valid JSON ({exc.msg} at byte {exc.pos} of the header)") from None
    if not isinstance(header, dict):
        raise CheckpointFormatError(
            p, f"safetensors header is a JSON {type(header).__name__}, expected an object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise CheckpointFormatError(p, "safetensors __metadata__ must map strings to strings")
    data_size = size - 8 - n
    spans = []
    for name, e in header.items():
        if not isinstance(e, dict) or not {"dtype", "shape", "data_offsets"} <= set(e):
            raise CheckpointFormatError(
                p, f"safetensors tensor '{name}': expected an object with dtype, shape and "
                   f"data_offsets, found {json.dumps(e)[:80]}")
        dtype, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
        if not isinstance(dtype, str) or dtype not in _ST_DTYPES:
            raise CheckpointFormatError(
                p, f"safetensors tensor '{name}' has unknown dtype {dtype!r} "
                   f"(known: {', '.join(sorted(_ST_DTYPES))})")
        if not isinstance(shape, list) or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
            raise CheckpointFormatError(
                p, f"safetensors tensor '{name}' shape {json.dumps(shape)} is not a list of "
                   f"non-negative integers")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
                or not 0 <= offs[0] <= offs[1]):
            raise CheckpointFormatError(
                p, f"safetensors tensor '{name}' data_offsets {json.dumps(offs)} is not "
                   f"[begin, end] with 0 <= begin <= end")
        begin, end = offs
        if end > data_size:
            raise CheckpointFormatError(
                p, f"safetensors tensor '{name}' data_offsets [{begin}, {end}] end beyond the "
                   f"data area of {data_size} bytes")
        need = math.prod(shape) * _ST_DTYPES[dtype][1]
        if end - begin != need:
            raise CheckpointFormatError(
                p, f"safetensors tensor '{name}' has {end - begin} bytes at data_offsets "
                   f"[{begin}, {end}] but shape {shape} of {dtype} needs {need}")
        spans.append((begin, end, name))
    spans.sort()
    pos, prev = 0, None
    for begin, end, name in spans:
        if begin < pos:
            raise CheckpointFormatError(
                p, f"safetensors tensors '{prev}' and '{name}' overlap (bytes {begin}..{pos} of "
                   f"the data area)")
        if begin > pos:
            raise CheckpointFormatError(
                p, f"safetensors data area bytes {pos}..{begin} belong to no tensor (gap before "
                   f"'{name}')")
        pos, prev = end, name
    if pos != data_size:
        raise CheckpointFormatError(
            p, f"safetensors data area has {data_size} bytes but the tensors end at byte {pos}")
    return header, metadata, 8 + n


class SafetensorsSource(_Closing, TensorSource):
    """One safetensors file. Shapes and dtypes come from the header (validated
    here); ``get`` reads that one tensor and nothing else.

    ``reader``:

    * ``"pread"`` (default): the tensor's byte range is read with ``os.preadv``
      into memory the returned tensor owns; dropping the tensor frees it.
    * ``"mmap"``: ``safetensors.safe_open(path, framework="pt")``, tensors
      backed by the file's memory map. Every page touched stays resident (and
      counted in the process's RSS) until the source is closed, so a pass over
      all layers of a large file grows RSS by every tensor read;
      ``bench/checkpoint_memory.py`` measures both side by side.
    """

    format = "safetensors"

    def __init__(self, path: str | Path, *, reader: str = "pread"):
        if reader not in ("pread", "mmap"):
            raise ValueError(f"reader must be 'pread' or 'mmap', not {reader!r}")
        self.path = str(path)
        self._file = Path(path)
        self._entries, metadata, self._data_start = _read_safetensors_header(self._file)
        self._stat = _identity(self._file)
        self.config = {}
        self.extras = {"safetensors_metadata": dict(metadata)}
        if sys.byteorder != "little":
            reader = "mmap"                              # safetensors converts byte order itself
        self.reader = reader
        self._fd: int | None = None
        self._handle = None
        try:
            self._fd = os.open(self._file, os.O_RDONLY)      # pread, and stat/holes for mmap
            if reader == "mmap":
                from safetensors import SafetensorError, safe_open
                try:
                    self._handle = safe_open(str(self._file), framework="pt", device="cpu")
                except SafetensorError as exc:
                    os.close(self._fd)
                    self._fd = None
                    raise CheckpointFormatError(self._file, f"safetensors file cannot be opened: {exc}") from None
        except OSError as exc:
            raise CheckpointFormatError(self._file, f"safetensors file cannot be opened: {exc}") from None

    def keys(self) -> list[str]:
        return list(self._entries)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._entry(key)["shape"])

    def dtype(self, key: str) -> str:
        return _ST_DTYPES[self._entry(key)["dtype"]][0]

    def get(self, key: str) -> torch.Tensor:
        e = self._entry(key)
        if self._fd is None:
            raise ValueError(f"{self.path}: source is closed")
        # pread sees an in-place rewrite of the same size as new bytes (harmless);
        # a memory map must also not see a rewrite (mtime), which may cut it
        st = os.fstat(self._fd)
        _check_unchanged(self._file, self._stat if self._handle is not None else (self._stat[0], st.st_mtime_ns),
                         st, key)
        begin, end = e["data_offsets"]
        self._check_no_hole(key, self._data_start + begin, end - begin)
        if self._handle is not None:
            # mapped pages: a file cut after this check can still fault; the
            # default pread reader only ever sees a short read
            return self._handle.get_tensor(key)
        name, _ = _ST_DTYPES[e["dtype"]]
        dtype, shape = getattr(torch, name), tuple(e["shape"])
        if end == begin:
            return torch.empty(shape, dtype=dtype)
        try:
            buf = bytearray(end - begin)
        except MemoryError:
            raise CheckpointFormatError(
                self._file, f"safetensors tensor '{key}' needs {end - begin:,} bytes, more memory "
                            f"than this process may use") from None
        view, done = memoryview(buf), 0
        while done < len(buf):                           # preadv may return short reads
            n = os.preadv(self._fd, [view[done:]], self._data_start + begin + done)
            if n == 0:
                raise CheckpointFormatError(
                    self._file, f"safetensors file ended while reading tensor '{key}' (it shrank "
                                f"after it was opened)")
            done += n
        # little-endian on disk (safetensors spec), as on every platform torch supports here
        return torch.frombuffer(buf, dtype=dtype).reshape(shape)   # [numel] -> shape

    def _check_no_hole(self, key: str, start: int, n: int) -> None:
        _check_no_hole(self._file, self._fd, key, start, n)

    def close(self) -> None:
        self._handle = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _entry(self, key: str) -> dict:
        try:
            return self._entries[key]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {key!r}") from None


def _check_no_hole(file: Path, fd: int, key: str, start: int, n: int) -> None:
    """Refuse a tensor whose byte range holds a hole of a sparse file (bytes
    the header declares but the file never wrote); ``QKVSCOPE_ALLOW_SPARSE=1``
    skips this. One ``lseek(SEEK_HOLE)``: the next hole at or after ``start``."""
    if n <= _CHUNK or budget("QKVSCOPE_ALLOW_SPARSE") or not hasattr(os, "SEEK_HOLE"):
        return
    try:
        hole = os.lseek(fd, start, os.SEEK_HOLE)
    except OSError:
        return                                       # the file system cannot tell
    if hole < start + n:
        raise CheckpointFormatError(
            file, f"safetensors tensor '{key}' ({n:,} bytes from byte {start:,}) lies in "
                        f"a hole of a sparse file from byte {hole:,}: the declared shape's bytes "
                        f"are not in the file (QKVSCOPE_ALLOW_SPARSE=1 reads it anyway)")


# ----------------------------------------------------------------------------
# PyTorch (torch.load, weights_only)
# ----------------------------------------------------------------------------

def _numpy_safe_globals() -> list:
    """numpy scalars and dtypes, which training scripts put beside the weights
    (e.g. ``best_val_loss`` as ``np.float64``); they construct plain numbers."""
    try:
        import numpy as np
    except ImportError:
        return []
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
    import io

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
        return t.clone()

    def close(self) -> None:
        self._weights = {}

    def _tensor(self, key: str) -> torch.Tensor:
        try:
            return self._weights[key]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {key!r}") from None


# ----------------------------------------------------------------------------
# Sharded sets (*.index.json)
# ----------------------------------------------------------------------------

def _read_index(p: Path) -> dict:
    try:
        index = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointFormatError(p, f"shard index is not valid JSON ({exc})") from None
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wm, dict) or not wm or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
        raise CheckpointFormatError(
            p, "shard index has no weight_map; expected {\"weight_map\": {tensor name: shard file}}")
    for shard in set(wm.values()):
        sp = PurePosixPath(shard.replace("\\", "/"))
        if sp.is_absolute() or ".." in sp.parts or re.match(r"^[A-Za-z]:", shard):
            raise CheckpointFormatError(
                p, f"shard index names '{shard}', outside the index's folder; expected plain file names")
    return index


def _index_shard_paths(p: Path) -> list[Path]:
    index = _read_index(p)
    return [p.parent / s for s in sorted(set(index["weight_map"].values()))]


class ShardedSource(_Closing, TensorSource):
    """One source over the shards named by a ``*.index.json`` weight map.

    safetensors shards are opened (header only) up front; PyTorch shards are
    loaded (memory-mapped) the first time one of their tensors is asked for.
    """

    def __init__(self, index_path: str | Path):
        p = Path(index_path)
        index = _read_index(p)
        self.path = str(p)
        self._index = p
        self._map: dict[str, str] = {}
        raw_map = index["weight_map"]
        for k, shard in raw_map.items():
            self._map[strip_key_prefixes(k)] = shard
        shards = sorted(set(raw_map.values()))
        missing = [s for s in shards if not (p.parent / s).is_file()]
        if missing:
            raise CheckpointFormatError(
                p, f"shard index names {len(missing)} missing shard file(s): {', '.join(missing)}")
        self._shards: dict[str, TensorSource | None] = {}
        self._closed = False
        self._kinds = {s: _file_kind(p.parent / s) for s in shards}
        bad = sorted(s for s, k in self._kinds.items() if k not in ("safetensors", "torch_zip", "torch_legacy"))
        if bad:
            raise CheckpointFormatError(p, f"shards are not safetensors or PyTorch files: {', '.join(bad)}")
        self.format = ("safetensors-sharded" if all(k == "safetensors" for k in self._kinds.values())
                       else "pytorch-sharded")
        self.config = {}
        try:
            meta = _jsonlike(index.get("metadata") or {})
        except BudgetExceeded as exc:
            raise CheckpointFormatError(p, f"shard index metadata: {exc}") from None
        self.extras = {"index_metadata": meta, "shards": shards}
        try:
            for s, k in self._kinds.items():
                self._shards[s] = SafetensorsSource(p.parent / s) if k == "safetensors" else None
            for s, src in self._shards.items():
                if src is not None:
                    self._check_keys(p, s, src)
            if self.format == "safetensors-sharded":
                self.extras["safetensors_metadata"] = self._shards[shards[0]].extras["safetensors_metadata"]
        except BaseException:
            self.close()
            raise

    def _check_keys(self, p: Path, shard: str, src: TensorSource) -> None:
        have = set(src.keys())
        absent = sorted(k for k, s in self._map.items() if s == shard and k not in have)
        if absent:
            shown = ", ".join(absent[:10]) + (f" and {len(absent) - 10} more" if len(absent) > 10 else "")
            raise CheckpointFormatError(
                p, f"shard index maps {len(absent)} tensor(s) to {shard} that it does not hold: {shown}")

    def _source(self, key: str) -> TensorSource:
        try:
            shard = self._map[key]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {key!r}") from None
        if self._closed:
            raise ValueError(f"{self.path}: source is closed")
        src = self._shards.get(shard)
        if src is None:
            src = TorchSource(self._index.parent / shard, _kind=self._kinds[shard])
            self._shards[shard] = src
            self._check_keys(self._index, shard, src)
        return src

    def keys(self) -> list[str]:
        return list(self._map)

    def shape(self, key: str) -> tuple[int, ...]:
        return self._source(key).shape(key)

    def dtype(self, key: str) -> str:
        return self._source(key).dtype(key)

    def get(self, key: str) -> torch.Tensor:
        return self._source(key).get(key)

    def close(self) -> None:
        for src in self._shards.values():
            if src is not None:
                src.close()
        self._shards = {s: None for s in self._shards}
        self._closed = True


# ----------------------------------------------------------------------------
# Folders
# ----------------------------------------------------------------------------

class _FolderPlan:
    """What a folder is read from: ``target`` (file or index), the config file
    (``config.json`` / ``model_config.yaml``) and every file read (for hashing)."""

    def __init__(self, target: Path, config_file: Path | None, files: list[Path], note: str = ""):
        self.target, self.config_file, self.files, self.note = target, config_file, files, note


def _holds_bare_tensor(p: Path) -> bool:
    try:
        kind = _file_kind(p)
        if kind not in ("torch_zip", "torch_legacy"):
            return False
        obj = _torch_load(p, kind)
    except CheckpointFormatError:
        return False
    bare = isinstance(obj, torch.Tensor) or not isinstance(obj, Mapping)
    del obj
    return bare


def _folder_plan(d: Path) -> _FolderPlan:
    files = sorted(c for c in d.iterdir() if c.is_file() and not c.name.startswith("."))
    names = {c.name: c for c in files}
    cfg = names.get("config.json")
    if cfg is not None:
        for w in _HF_WEIGHTS:
            if w in names:
                target = names[w]
                extra = _index_shard_paths(target) if w.endswith(".index.json") else []
                return _FolderPlan(target, cfg, [cfg, target, *extra])
    for w in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if w in names:
            return _FolderPlan(names[w], None, [names[w], *_index_shard_paths(names[w])])
    cands = [c for c in files if c.suffix.lower() in _TORCH_SUFFIXES + (".safetensors",)]
    if not cands:
        found = ", ".join(c.name for c in files[:10]) or "nothing"
        raise CheckpointFormatError(
            d, f"folder holds no checkpoint file (found: {found}); {EXPECTED}")
    note = ""
    toks = [c for c in cands if c.suffix.lower() == ".bin" and llama2c.is_tokenizer(c)]
    if toks:
        cands = [c for c in cands if c not in toks]
        note = f"skipped llama2.c tokenizer: {', '.join(c.name for c in toks)}"
    if len(cands) > 1:
        logs = [c for c in cands if _holds_bare_tensor(c)]
        cands = [c for c in cands if c not in logs]
        if logs:
            note = "; ".join(x for x in (note, f"skipped tensor-only files: {', '.join(c.name for c in logs)}") if x)
    exports = [c for c in cands if c.suffix.lower() == ".bin" and _is_llama2c(c)]
    if exports and len(cands) - len(exports) == 1:
        # llama2.c out/: ckpt.pt beside the .bin exported from it; the training checkpoint wins
        kept = [c for c in cands if c not in exports]
        note = "; ".join(x for x in (note, f"chose {kept[0].name} over its llama2.c export "
                                           f"{', '.join(c.name for c in exports)}") if x)
        cands = kept
    if len(cands) > 1 and "final_model.pt" in {c.name for c in cands}:
        # projection-sharing paper runs: final_model.pt beside intermediate checkpoints
        others = [c.name for c in cands if c.name != "final_model.pt"]
        note = "; ".join(x for x in (note, f"chose final_model.pt over {', '.join(others)}") if x)
        cands = [names["final_model.pt"]]
    if len(cands) != 1:
        listed = ", ".join(c.name for c in cands) or "none besides tensor-only log files"
        raise CheckpointFormatError(
            d, f"folder holds {len(cands)} checkpoint files ({listed}); expected exactly one "
               f"(open one of them by its path)")
    cfg_file = cfg or names.get("model_config.yaml")
    return _FolderPlan(cands[0], cfg_file, [cands[0]] + ([cfg_file] if cfg_file else []), note)


def _is_llama2c(p: Path) -> bool:
    try:
        return _file_kind(p) == "llama2c"
    except CheckpointFormatError:
        return False


def _open_folder(d: Path) -> TensorSource:
    plan = _folder_plan(d)
    src = _open_file(plan.target) if not plan.target.name.endswith(".index.json") else ShardedSource(plan.target)
    try:
        if plan.config_file is not None and plan.config_file.name == "config.json":
            # a Hugging Face folder's config.json is its config; beside another
            # checkpoint file it fills in only when the file brought none
            if plan.target.name in _HF_WEIGHTS or not src.config:
                src.config = _read_json_config(plan.config_file)
        elif plan.config_file is not None and "model_config" not in src.extras:
            src.config = _read_yaml_config(plan.config_file)
        src.extras["folder_file"] = plan.target.name
        if plan.note:
            src.extras["folder_note"] = plan.note
        src.path = str(d)
        return src
    except BaseException:
        src.close()
        raise


def _read_json_config(p: Path) -> dict:
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointFormatError(p, f"config is not valid JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise CheckpointFormatError(p, f"config is a JSON {type(cfg).__name__}, expected an object")
    return cfg


def _read_yaml_config(p: Path) -> dict:
    import yaml

    try:
        cfg = load_yaml(p)
        if not isinstance(cfg, dict):
            raise CheckpointFormatError(p, f"model config is a YAML {type(cfg).__name__}, expected a mapping")
        return _jsonlike(cfg)
    except BudgetExceeded as exc:
        raise CheckpointFormatError(p, f"model config: {exc}; refused") from None
    except UnicodeDecodeError as exc:
        raise CheckpointFormatError(p, f"model config is not UTF-8 (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0]
        raise CheckpointFormatError(p, f"model config is not valid YAML ({first})") from None


# ----------------------------------------------------------------------------
# Zip uploads
# ----------------------------------------------------------------------------

def _check_zip_entry(zp: Path, info: zipfile.ZipInfo) -> None:
    name = info.filename
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        raise CheckpointFormatError(zp, f"zip entry '{name}' has an absolute path; refused")
    if ".." in parts:
        raise CheckpointFormatError(zp, f"zip entry '{name}' climbs out of the folder with '..'; refused")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise CheckpointFormatError(zp, f"zip entry '{name}' is a symbolic link; refused")
    if info.flag_bits & 0x1:
        raise CheckpointFormatError(zp, f"zip entry '{name}' is encrypted; expected a plain zip")
    if info.file_size > _ZIP_RATIO_MIN_SIZE:
        ratio = info.file_size / max(info.compress_size, 1)
        if ratio > _ZIP_MAX_RATIO:
            raise CheckpointFormatError(
                zp, f"zip entry '{name}' expands {ratio:.0f}x ({info.file_size} bytes from "
                    f"{info.compress_size}), over the {_ZIP_MAX_RATIO}x limit; refused as a zip bomb")


def _check_zip_overlap(zp: Path, zf: zipfile.ZipFile, infos: list[zipfile.ZipInfo]) -> None:
    """Each entry's bytes (local header, name, extra field, compressed data) must
    end before the next entry's local header starts: overlapping entries are a
    zip bomb that expands the same compressed bytes once per entry. The local
    header's name and extra lengths (bytes 26..30, APPNOTE 4.3.7) are read from
    the file; nothing is decompressed."""
    spans = []
    fp = zf.fp
    for info in infos:
        fp.seek(info.header_offset)
        local = fp.read(30)
        if len(local) < 30 or local[:4] != b"PK\x03\x04":
            raise CheckpointFormatError(
                zp, f"zip entry '{info.filename}' has no local header at byte {info.header_offset}; "
                    f"the file is truncated or corrupt")
        n_name, n_extra = struct.unpack("<HH", local[26:30])
        start = info.header_offset
        spans.append((start, start + 30 + n_name + n_extra + info.compress_size, info.filename))
    spans.sort()
    for (s0, e0, a), (s1, _e1, b) in zip(spans, spans[1:]):
        if s1 < e0:
            raise CheckpointFormatError(
                zp, f"zip entries '{a}' and '{b}' overlap (bytes {s1}..{e0}); refused as a zip bomb")


def _extract_zip(zp: Path, dest: Path) -> None:
    try:
        zf = zipfile.ZipFile(zp)
    except (zipfile.BadZipFile, OSError) as exc:
        raise CheckpointFormatError(zp, f"is not a readable zip file ({exc})") from None
    with zf:
        infos = [i for i in zf.infolist() if not i.filename.startswith(_ZIP_JUNK)]
        if len(infos) > _ZIP_MAX_ENTRIES:
            raise CheckpointFormatError(
                zp, f"zip has {len(infos)} entries, over the {_ZIP_MAX_ENTRIES}-entry limit")
        seen: set[str] = set()
        total = 0
        for info in infos:
            _check_zip_entry(zp, info)
            norm = info.filename.rstrip("/")
            if norm in seen:
                raise CheckpointFormatError(zp, f"zip entry '{info.filename}' appears twice; refused")
            seen.add(norm)
            total += info.file_size
        if total > _ZIP_MAX_TOTAL:
            raise CheckpointFormatError(
                zp, f"zip expands to {total} bytes, over the {_ZIP_MAX_TOTAL}-byte limit")
        free = shutil.disk_usage(dest).free
        if total > free:
            raise CheckpointFormatError(
                zp, f"zip expands to {total} bytes but the temporary folder {dest} has {free} free")
        _check_zip_overlap(zp, zf, infos)
        root = dest.resolve()
        written_all = 0
        for info in infos:
            target = (dest / info.filename).resolve()
            if root not in target.parents and target != root:
                raise CheckpointFormatError(zp, f"zip entry '{info.filename}' leaves the extraction folder; refused")
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            written = 0
            try:
                with zf.open(info) as src, open(target, "wb") as out:
                    while chunk := src.read(_CHUNK):
                        written += len(chunk)
                        written_all += len(chunk)
                        if written_all > _ZIP_MAX_TOTAL:
                            raise CheckpointFormatError(
                                zp, f"zip extraction wrote more than {_ZIP_MAX_TOTAL} bytes in all "
                                    f"(QKVSCOPE_ZIP_TOTAL_BYTES); refused")
                        if written > info.file_size:
                            raise CheckpointFormatError(
                                zp, f"zip entry '{info.filename}' holds more than the {info.file_size} "
                                    f"bytes its header declares; refused")
                        out.write(chunk)
            except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
                raise CheckpointFormatError(zp, f"zip entry '{info.filename}' cannot be extracted ({exc})") from None


def _zip_root(tmp: Path) -> Path:
    """The extracted thing to open: a lone top-level folder or file, else the folder itself."""
    root = tmp
    while True:
        items = [c for c in root.iterdir() if not c.name.startswith(".") and c.name != "__MACOSX"]
        if len(items) == 1 and items[0].is_dir():
            root = items[0]
            continue
        if len(items) == 1 and items[0].is_file():
            return items[0]
        return root


class ZipSource(_Closing, TensorSource):
    """A zip upload of a checkpoint file or folder, extracted into a temporary
    folder (entry checks: no absolute paths, no ``..``, no symlinks, at most
    10,000 entries, 64 GiB in all, 200:1 per entry over 1 MiB). ``close()``
    deletes the folder."""

    def __init__(self, path: str | Path):
        zp = Path(path)
        self.path = str(zp)
        tmp = Path(tempfile.mkdtemp(prefix="qkvscope-zip-"))
        self._tmp = tmp
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(tmp), True)
        self._inner: TensorSource | None = None
        try:
            _extract_zip(zp, tmp)
            root = _zip_root(tmp)
            rel = root.relative_to(tmp).as_posix() if root != tmp else "."
            if root == tmp and not any(tmp.iterdir()):
                raise CheckpointFormatError(zp, f"zip is empty; {EXPECTED}")
            try:
                if root.is_file() and _file_kind(root) == "zip":
                    raise CheckpointFormatError(
                        zp, f"zip entry '{rel}' is another zip; nested zips are not opened")
                self._inner = open_source(root)
            except FileError as exc:
                if exc.path == str(zp):
                    raise
                where = Path(exc.path)
                inner_rel = where.relative_to(tmp).as_posix() if tmp in where.parents or where == tmp else exc.path
                raise type(exc)(zp, f"{inner_rel}: {exc.problem}") from None
        except BaseException:
            self._finalizer()
            raise
        self.format = f"zip/{getattr(self._inner, 'format', 'folder')}"
        self.config = self._inner.config
        self.extras = self._inner.extras
        self.extras["zip_member"] = rel

    def keys(self) -> list[str]:
        return self._inner.keys()

    def shape(self, key: str) -> tuple[int, ...]:
        return self._inner.shape(key)

    def dtype(self, key: str) -> str:
        return self._inner.dtype(key)

    def get(self, key: str) -> torch.Tensor:
        return self._inner.get(key)

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()
        self._finalizer()

    @property
    def extracted_to(self) -> Path | None:
        """The temporary folder (``None`` once closed)."""
        return self._tmp if self._finalizer.alive else None


# ----------------------------------------------------------------------------
# Hashing
# ----------------------------------------------------------------------------

def _feed(h, p: Path) -> None:
    with open(p, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)


def _hash_files(base: Path, files: list[Path]) -> str:
    h = hashlib.sha256()
    for name, f in sorted((f.relative_to(base).as_posix(), f) for f in set(files)):
        if not f.is_file():
            raise CheckpointFormatError(f, "is missing; cannot hash the checkpoint")
        h.update(name.encode("utf-8") + b"\0" + struct.pack("<Q", f.stat().st_size))
        _feed(h, f)
    return h.hexdigest()
