"""What may be opened, and how a failure to read one file is said in one line.

Folder scans meet files built to hang or crash a reader: a FIFO named
``model.pt`` blocks ``open`` for ever, ``/dev/zero`` never ends, a symbolic
link can lead anywhere (``/proc/self/mem``) or loop. ``refusal`` says why
such a path is not opened; only regular files are. ``failure`` turns any
exception raised while one untrusted file was parsed into the one-line
reason the ingest report and the CLI print.
"""
from __future__ import annotations

import os
import resource
import stat
from pathlib import Path

from loaders.budgets import memory_exceeded
from loaders.errors import FileError

#: Folder levels below an ingested folder that a scan descends (deeper ones
#: are skipped with the reason). Python's own recursion ends near 1,000.
MAX_FOLDER_DEPTH = 64

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def special_kind(mode: int) -> str | None:
    """'a FIFO', 'a socket', ... for what is neither a regular file nor a folder; else None."""
    for test, words in _KINDS:
        if test(mode):
            return words
    return None


def refusal(path: Path, root: Path | None = None) -> str | None:
    """Why ``path`` must not be opened, or None when it may.

    ``root``: the folder being ingested; a symbolic link whose target leaves
    it is refused (a link the user names directly, ``root=None``, is followed).
    Never opens anything: ``lstat``/``stat`` only.
    """
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    link = ""
    if stat.S_ISLNK(st.st_mode):
        try:
            target = Path(os.path.realpath(path, strict=True))
        except (OSError, RuntimeError) as exc:
            if getattr(exc, "errno", None) == 40 or isinstance(exc, RuntimeError):   # ELOOP
                return "is a chain of symbolic links that loop"
            return "is a symbolic link to nothing"
        if root is not None and not target.is_relative_to(Path(os.path.realpath(root))):
            return f"is a symbolic link to {target}, which leads out of the ingested folder"
        st = os.stat(target)
        link = f"a link to {target}, "
    kind = special_kind(st.st_mode)
    if kind:
        return f"is {link}{kind}, not a regular file"
    return None


def check_openable(path: str | Path) -> None:
    """Raise ``FileError(path, reason)`` unless ``path`` is a folder or a regular
    file (through links); for a folder, every file directly in it is checked."""
    path = Path(path)
    why = refusal(path)
    if why:
        raise FileError(path, why)
    if path.is_dir():
        for child in sorted(path.iterdir()):
            why = refusal(child, root=path)
            if why and "leads out of" not in why:     # a Hub cache snapshot links into ../../blobs
                raise FileError(path, f"{child.name} {why}")


def unencodable_name(path: Path) -> str | None:
    """The reason a name cannot be stored (bytes that are not UTF-8), or None."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        return "file name is not valid UTF-8, so the database cannot store it; rename the file"
    return None


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation that failed: Python's ``MemoryError``,
    torch's ``DefaultCPUAllocator: can't allocate memory`` (a ``RuntimeError``),
    DuckDB's ``OutOfMemoryException``, a C++ ``std::bad_alloc`` passed up."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryException":
        return True
    return isinstance(exc, RuntimeError) and any(
        words in str(exc) for words in ("can't allocate memory", "std::bad_alloc", "Cannot allocate memory"))


def data_limit() -> int | None:
    """This process's soft ``RLIMIT_DATA`` in bytes (the reading child's memory limit,
    ``loaders.sandbox``), or None when it has none."""
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    return None if soft == resource.RLIM_INFINITY else soft


def failure(exc: BaseException) -> str:
    """One line on why parsing a file failed, for an exception no reader turned
    into a typed error (``FileError`` already says ``PATH: problem``). An
    allocation that failed under a memory limit (the reading process of
    ``loaders.sandbox``) names the limit and its budget."""
    if isinstance(exc, RecursionError):
        return "content nested deeper than can be followed (RecursionError)"
    if out_of_memory(exc):
        limit = data_limit()
        if limit is not None:
            # the reading child's soft limit is what it held before the file plus the file's budget
            # (loaders.sandbox): the line names the budget, not what the imports hold
            held = int(os.environ.get("QKVSCOPE_PARSE_HELD_BYTES") or 0)
            return memory_exceeded(limit - held if 0 < held < limit else limit)
        return "ran out of memory while parsing it (MemoryError)"
    if isinstance(exc, OSError):
        return f"cannot be read ({exc.strerror or type(exc).__name__})"
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
