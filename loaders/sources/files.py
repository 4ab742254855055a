"""What every reader of the package shares: a file's identity, the check that
it did not change while read, the sparse-hole check, and ``with`` support.

Reads nothing itself beyond ``stat``, ``fstat`` and one ``lseek(SEEK_HOLE)``.
Budget: a tensor over 1 MiB lying in a hole of a sparse file is refused
unless ``QKVSCOPE_ALLOW_SPARSE=1``. Errors: ``CheckpointFormatError`` naming
the file (changed while read; tensor in a hole). ``loaders/llama2c.py`` uses
``_identity``, ``_check_unchanged`` and ``_check_no_hole`` too (through the
package, ``loaders.sources``).
"""
from __future__ import annotations

import os
from pathlib import Path

from loaders.budgets import budget
from loaders.errors import CheckpointFormatError

#: Bytes per read when streaming (hashing, zip extraction); smaller tensors skip the hole check.
_CHUNK = 1 << 20


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
