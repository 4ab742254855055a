"""Typed errors for user input.

Every error a user can cause with a file names that file, says what was
expected and what was found. The CLI prints ``str(error)`` on one line and
exits non-zero; the app shows it as a message. Anything else propagates.
"""
from __future__ import annotations

from pathlib import Path


class QkvscopeError(Exception):
    """Base of all errors caused by user input (files, arguments, database)."""


class FileError(QkvscopeError):
    """A problem with one file: ``path`` and ``problem`` are kept for callers."""

    def __init__(self, path: str | Path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class CheckpointFormatError(FileError):
    """A checkpoint file that cannot be read: truncated, corrupt, lying header,
    shapes that contradict the config, unsupported container."""


class UnsafeCheckpointError(CheckpointFormatError):
    """A checkpoint that would need unpickling of arbitrary objects (possible
    code execution). Refused; nothing in it is run."""


class UnknownArchitectureError(FileError):
    """A readable checkpoint whose attention layout matches no converter."""


class LogFormatError(FileError):
    """A training log that no log reader understands, or a broken one."""


class StoreError(QkvscopeError):
    """The database file cannot be opened or is not a qkvscope database."""


class DatabaseBusyError(StoreError):
    """Another process holds the database's write lock for longer than we wait."""


class QueryError(QkvscopeError):
    """A query for the SQL page that was refused, failed or ran out of time."""


class HubModelError(FileError):
    """A Hugging Face model name (``org/name``, ``models--org--name``) that names no
    file or folder and cannot be found in, or fetched into, the local cache."""
