"""Byte-level text corpora for the trainer: real text only, always offline.

Default: the Python standard library's own ``.py`` sources, read from the
running interpreter (``sysconfig.get_paths()["stdlib"]``), without
``site-packages`` and test suites. Any text file or folder can be given
instead (every regular file under a folder, by sorted relative path).

Files are taken in sorted relative-path order and split BY FILE: every
``val_every``-th file (indices ``val_every-1, 2*val_every-1, ...``) is held
out for validation, so the split is deterministic and the validation text is
never seen in training. Tokens are bytes (vocabulary 256); files are joined
with a blank line.
"""
from __future__ import annotations

import hashlib
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import torch

from loaders.errors import FileError

STDLIB = "python-stdlib"
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


class CorpusError(FileError):
    """A corpus path that does not exist or holds too little text."""


@dataclass
class Corpus:
    """Train and validation bytes (uint8 tensors) and where they came from."""

    train: torch.Tensor
    val: torch.Tensor
    info: dict = field(default_factory=dict)


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The standard library's ``.py`` files in sorted relative-path order."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    out = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root)
        if any(part in _SKIP_DIRS for part in rel.parts[:-1]):
            continue
        if p.is_file():
            out.append(p)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def _folder_files(root: Path) -> list[Path]:
    files = [p for p in root.rglob("*") if p.is_file()
             and not any(part.startswith(".") for part in p.relative_to(root).parts)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def load_corpus(path: str | Path | None = None, *, val_every: int = 10,
                max_bytes: int | None = None, min_bytes: int = 4096) -> Corpus:
    """Read a corpus: ``None`` (or ``"python-stdlib"``) for the standard library,
    else a text file or a folder of text files.

    ``max_bytes`` caps the total read (files in order until the cap; the last
    file is cut). Every ``val_every``-th file read is validation; with fewer files
    read than that (one file, a few large ones, or the cap reached within them, as
    with Python 3.12's standard library at a 60 kB cap) the text read is split by
    position instead: its last ``1/val_every`` is validation.
    """
    if path is None or str(path) == STDLIB:
        root = Path(sysconfig.get_paths()["stdlib"])
        files, source = stdlib_files(root), STDLIB
    else:
        root = Path(path)
        if not root.exists():
            raise CorpusError(root, "expected a text file or a folder of text files, found nothing there")
        files, source = ([root], "file") if root.is_file() else (_folder_files(root), "folder")
    chunks: list[bytes] = []
    total = 0
    for f in files:
        data = f.read_bytes()
        if max_bytes is not None and total + len(data) > max_bytes:
            data = data[: max(0, max_bytes - total)]
        chunks.append(data + b"\n\n")
        total += len(data) + 2
        if max_bytes is not None and total >= max_bytes:
            break
    if total < min_bytes:
        raise CorpusError(root, f"expected at least {min_bytes} bytes of text, found {total} "
                                f"in {len(chunks)} file(s)")
    if len(chunks) < val_every:                                  # no file would be held out
        blob = b"".join(chunks)
        cut = len(blob) - len(blob) // val_every
        train_b, val_b = blob[:cut], blob[cut:]
    else:
        train_b = b"".join(c for i, c in enumerate(chunks) if i % val_every != val_every - 1)
        val_b = b"".join(c for i, c in enumerate(chunks) if i % val_every == val_every - 1)
    info = {
        "source": source,
        "path": str(root),
        "n_files": len(chunks),
        "train_bytes": len(train_b),
        "val_bytes": len(val_b),
        "val_every": val_every,
        "max_bytes": max_bytes,
        "sha256": hashlib.sha256(train_b + val_b).hexdigest(),
    }
    if source == STDLIB:
        info["python"] = sys.version.split()[0]
    return Corpus(train=torch.frombuffer(bytearray(train_b), dtype=torch.uint8),
                  val=torch.frombuffer(bytearray(val_b), dtype=torch.uint8), info=info)


def get_batch(data: torch.Tensor, batch_size: int, block_size: int,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows: x (B, T) int64 and y = x shifted by one (B, T)."""
    ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=generator)
    x = torch.stack([data[i: i + block_size] for i in ix.tolist()]).long()
    y = torch.stack([data[i + 1: i + 1 + block_size] for i in ix.tolist()]).long()
    return x, y
