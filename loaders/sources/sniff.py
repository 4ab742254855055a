"""What a file is, from its first bytes: ``_file_kind`` for ``open_source``,
``is_checkpoint_candidate`` for folder scans.

Reads 16 bytes (``_head``), a zip's central directory (to tell a PyTorch
zip from an upload) and, for headerless content, llama2.c's header
(``loaders.llama2c.sniff``). The format is decided by content; the suffix
only breaks ties (a ``.safetensors`` that is neither zip nor pickle goes to
the safetensors header validation, which says what is wrong). Errors:
``CheckpointFormatError`` for an empty file, an unreadable zip directory, a
broken llama2.c export, or unrecognised content (naming the first bytes).
"""
from __future__ import annotations

import struct
import zipfile
from pathlib import Path

from loaders.checkpoint_names import CHECKPOINT_SUFFIXES, EXPECTED, HF_WEIGHT_FILES, TORCH_SUFFIXES
from loaders.errors import CheckpointFormatError


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
                c.is_file() and (c.name in HF_WEIGHT_FILES or c.suffix in TORCH_SUFFIXES + (".safetensors",))
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
        from loaders import llama2c  # here: its reader (torch, a vocabulary) loads for headerless content only

        if head[:4] == struct.pack("<I", llama2c.MAGIC):
            return True                     # a broken llama2.c v1/v2 export is an error to show
        try:
            return llama2c.sniff(p) is not None
        except CheckpointFormatError:
            return False
    return kind in ("zip", "pickle", "safetensors")


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
    # safetensors before pickle: its first 8 bytes are the header's length, little-endian, and a
    # length of 640, 896, 1152 or 1408 bytes starts 0x80 0x02..0x05, as a pickle's PROTO opcode
    # does. A pickle's next bytes make that length larger than any file (torch's 0x8a magic
    # number, protocol 4's frame opcode 0x95), and JSON's "{" follows only a safetensors length.
    if len(head) >= 9 and head[8:9] == b"{":
        n = struct.unpack("<Q", head[:8])[0]
        if n <= size - 8:
            return "safetensors"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:   # PROTO opcode
        return "pickle"
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
    from loaders import llama2c  # here: its reader (torch, a vocabulary) loads for headerless content only

    if llama2c.sniff(p) is not None:                 # raises for a broken llama2.c export
        return "llama2c"
    raise CheckpointFormatError(p, f"unrecognised content (first bytes {head[:8].hex()}); {EXPECTED}")
