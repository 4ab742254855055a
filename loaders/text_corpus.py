"""Sample text for forward passes: the bundled corpus, a text file or a folder.

``read_text_sample()`` with no path reads the bundled corpus in
``data/corpus/`` (Jane Austen's *Persuasion*, public domain; its origin and
licence are in ``data/corpus/SOURCES.md``). A path may name

* a regular file: plain UTF-8 text (a leading BOM is dropped);
* a folder: every ``*.txt`` file (``.TXT`` too) under it, recursively, in
  sorted order of the path relative to the folder. Hidden files and folders (name starting
  with ``.``), symlinks whose target lies outside the folder, symlinked
  folders (not descended: their files are read where they really are, if
  inside), FIFOs, sockets and device files are skipped; a file reached by
  several names (a symlink inside the folder) is read once, under its first
  name in that order.

Line breaks are normalised to ``\\n`` (``\\r\\n`` and a lone ``\\r`` alike);
each file's trailing line breaks are dropped and the files are joined with
one blank line, so a file without a final newline reads the same as one
with it. A FIFO is never opened (its type is checked with ``os.stat`` first,
and every file is opened with ``O_NONBLOCK`` and checked again on the open
descriptor). The total is capped: sizes are summed from ``os.stat`` before
anything is read, and the read itself stops one byte past the cap, so a file
that grows meanwhile cannot exceed it either.

Every problem a user can cause raises :class:`TextSampleError` naming the
path, what was wrong and what ``--text`` takes.
"""
from __future__ import annotations

import codecs
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from loaders.bundled import corpus_dir
from loaders.errors import FileError

DEFAULT_MAX_BYTES = 64 * 2**20
TEXT_SUFFIX = ".txt"
HINT = "--text takes plain UTF-8 text or a folder of .txt files"
BUNDLED_LABEL = "data/corpus"


class TextSampleError(FileError):
    """A sample-text path that is missing, not text, empty or too large."""


@dataclass(frozen=True)
class TextSample:
    """Prose for forward passes and where it came from."""

    text: str              # the prose, files joined with a blank line, in sorted file order
    sources: list[str]     # the files read (display names)
    n_bytes: int           # len(text.encode("utf-8"))


def bundled_corpus_path() -> Path:
    """The folder of the bundled corpus (``data/corpus`` in the repository; ``loaders.bundled``)."""
    return corpus_dir()


def read_text_sample(path: str | Path | None = None, *,
                     max_bytes: int = DEFAULT_MAX_BYTES) -> TextSample:
    """Read sample text: ``None`` for the bundled corpus, else a UTF-8 text
    file or a folder of ``.txt`` files (see the module docstring).

    ``max_bytes`` caps the bytes read in total (files' sizes on disk); a file
    or folder over it is refused before anything is read.
    """
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be at least 1, got {max_bytes}")
    if path is None:
        root, label = bundled_corpus_path(), BUNDLED_LABEL
    else:
        root, label = Path(path), str(path)
    try:
        st = os.stat(root)
    except FileNotFoundError:
        raise TextSampleError(label, f"no such file or folder; {HINT}") from None
    except OSError as e:
        raise TextSampleError(label, f"cannot be read ({e.strerror}); {HINT}") from None
    if stat.S_ISDIR(st.st_mode):
        return _read_folder(root, label, max_bytes)
    if not stat.S_ISREG(st.st_mode):
        raise TextSampleError(label, f"not a regular file ({_kind(st.st_mode)}); {HINT}")
    if st.st_size > max_bytes:
        raise TextSampleError(label, _too_large(st.st_size, max_bytes, "a smaller file"))
    text, _ = _read_file(root, label, max_bytes)
    if not text.strip():
        raise TextSampleError(label, f"no text in it (empty or only whitespace); {HINT}")
    return _sample([text], [label])


def _read_folder(root: Path, label: str, max_bytes: int) -> TextSample:
    real_root = root.resolve()
    found: list[tuple[str, Path, int]] = []  # (relative posix path, real path, size)
    for dirpath, dirnames, filenames in os.walk(real_root, onerror=_walk_error(label, real_root),
                                                followlinks=False):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith(".") or not name.lower().endswith(TEXT_SUFFIX):
                continue
            entry = Path(dirpath, name)
            real = entry.resolve()
            if not real.is_relative_to(real_root):
                continue  # a symlink leaving the folder
            try:
                st = os.stat(real)
            except OSError:
                continue  # a dangling symlink
            if stat.S_ISREG(st.st_mode):
                found.append((entry.relative_to(real_root).as_posix(), real, st.st_size))
    if not found:
        raise TextSampleError(label, f"no {TEXT_SUFFIX} files in this folder or its subfolders "
                                     f"(hidden files, FIFOs, device files and symlinks leaving "
                                     f"the folder are skipped); {HINT}")
    found = _first_name_each(sorted(found, key=lambda item: item[0]))
    total = sum(size for _, _, size in found)
    if total > max_bytes:
        raise TextSampleError(label, _too_large(total, max_bytes, "a folder with fewer .txt files",
                                                n_files=len(found)))
    texts, sources = [], []
    budget = max_bytes
    for rel, real, _ in found:
        shown = f"{label.rstrip('/')}/{rel}"
        text, n_read = _read_file(real, shown, budget)
        budget -= n_read
        if text.strip():
            texts.append(text)
            sources.append(shown)
    if not texts:
        raise TextSampleError(label, f"no text in its {len(found)} {TEXT_SUFFIX} file(s) "
                                     f"(all empty or only whitespace); {HINT}")
    return _sample(texts, sources)


def _first_name_each(found: list[tuple[str, Path, int]]) -> list[tuple[str, Path, int]]:
    """Drop later names of a file already listed (a symlink to it inside the folder)."""
    seen: set[Path] = set()
    out = []
    for rel, real, size in found:
        if real not in seen:
            seen.add(real)
            out.append((rel, real, size))
    return out


def _read_file(path: Path, label: str, budget: int) -> tuple[str, int]:
    """One file's text (BOM dropped, line breaks normalised) and the bytes read,
    at most ``budget``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise TextSampleError(label, f"cannot be read ({e.strerror}); {HINT}") from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if not stat.S_ISREG(mode):  # swapped since the stat: refuse, read nothing
            raise TextSampleError(label, f"not a regular file ({_kind(mode)}); {HINT}")
        data = f.read(budget + 1)
    if len(data) > budget:
        raise TextSampleError(label, f"grew past the limit of {budget:,} bytes left for it "
                                     f"while being read; {HINT}")
    offset = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    nul = data.find(b"\0")
    try:
        text = data[offset:].decode("utf-8")
    except UnicodeDecodeError as e:
        bad = offset + e.start
        if nul < 0 or bad < nul:  # report whichever problem comes first in the file
            raise TextSampleError(label, f"not a text file (invalid UTF-8 at byte {bad}); "
                                         f"{HINT}") from None
    if nul >= 0:  # valid UTF-8, but binary (or UTF-16) all the same
        raise TextSampleError(label, f"not a text file (a NUL byte at byte {nul}); {HINT}")
    return text.replace("\r\n", "\n").replace("\r", "\n"), len(data)


def _walk_error(label: str, real_root: Path):
    """``os.walk``'s error handler: a subfolder that cannot be listed is an error."""
    def raise_it(e: OSError) -> None:
        rel = Path(e.filename).relative_to(real_root).as_posix()
        shown = label if rel == "." else f"{label.rstrip('/')}/{rel}"
        raise TextSampleError(shown, f"cannot be read ({e.strerror}); {HINT}")
    return raise_it


def _sample(texts: list[str], sources: list[str]) -> TextSample:
    text = "\n\n".join(t.rstrip("\n") for t in texts)
    return TextSample(text=text, sources=sources, n_bytes=len(text.encode("utf-8")))


def _too_large(size: int, limit: int, fix: str, *, n_files: int | None = None) -> str:
    what = f"{size:,} bytes" if n_files is None else f"{size:,} bytes in {n_files} .txt files"
    return (f"{what}, over the limit of {limit:,} bytes for sample text; "
            f"pass {fix}, or cut it to the part you need")


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "an unknown file type"
