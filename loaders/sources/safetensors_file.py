"""safetensors files: the header validated here, one tensor read per ``get``.

Reads the 8-byte length and the JSON header (at most 100 MB, the safetensors
library's own limit), then only the byte range of each tensor asked for
(``os.preadv`` into memory the tensor owns; ``safe_open``'s memory map on
request). Budgets: tensors must tile the data area exactly (no overlap, no
gap, no trailing bytes, ``end - begin == numel * itemsize``); a tensor in a
hole of a sparse file is refused (``files._check_no_hole``); a tensor whose
bytes cannot be allocated is one error line. Errors: ``CheckpointFormatError``
naming the file and the tensor (bad header, file changed or shrank while read).
"""
from __future__ import annotations

import json
import math
import os
import struct
import sys
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from loaders.errors import CheckpointFormatError
from loaders.private_tensors import private
from loaders.sources.files import _check_no_hole, _check_unchanged, _Closing, _identity
from loaders.tensor_source import TensorSource

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
            # torch.empty, not bytearray: no zero-fill before preadv writes every byte anyway
            # (8 of 27 ms for a 32 MiB tensor)
            buf = torch.empty(end - begin, dtype=torch.uint8)
        except (MemoryError, RuntimeError) as exc:
            if isinstance(exc, RuntimeError) and "allocate" not in str(exc):
                raise
            raise CheckpointFormatError(
                self._file, f"safetensors tensor '{key}' needs {end - begin:,} bytes, more memory "
                            f"than this process may use") from None
        view, done = memoryview(buf.numpy()), 0
        while done < len(view):                          # preadv may return short reads
            n = os.preadv(self._fd, [view[done:]], self._data_start + begin + done)
            if n == 0:
                raise CheckpointFormatError(
                    self._file, f"safetensors file ended while reading tensor '{key}' (it shrank "
                                f"after it was opened)")
            done += n
        # little-endian on disk (safetensors spec), as on every platform torch supports here
        return private(buf.view(dtype).reshape(shape))   # [bytes] -> [numel] -> shape; read for this call alone

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
