"""The batch's one error type (user-facing, one line), raised by every part of ``app.batch``."""
from __future__ import annotations

from loaders.errors import QkvscopeError


class BatchError(QkvscopeError):
    """A batch cannot start or its results cannot be read back (user-facing, one line)."""
