"""Tensors whose memory was read for one ``get`` alone, so the layout converters need not copy them.

The converters hand out "fresh" tensors that share no memory with the source
(``loaders/layouts/_common.py:fresh``), because a source may hand out memory it
keeps or maps (a memory-mapped file, an unpickled state dict). A source that
reads a tensor into memory of its own for each ``get`` (the safetensors
``preadv`` path, the copied tensors of a memory-mapped torch zip) marks it
``private``; ``claim`` then lets ``fresh`` return a view that covers all of that
memory as it is, once (a second view of the same memory is copied, so two
outputs never alias). That copy was a third of reading a bfloat16 layer of
the 7B shape (43 of 136 ms).

The registry maps a storage's address to its size while the marked tensor
lives (a ``weakref.finalize`` drops the entry when it goes), so an address
that memory is later reused at is never taken for private.
"""
from __future__ import annotations

import threading
import weakref

import torch

_lock = threading.Lock()
_private: dict[int, int] = {}                  # storage address -> its size in bytes


def private(t: torch.Tensor) -> torch.Tensor:
    """Mark ``t``'s storage as read for this call alone (no one else holds it); returns ``t``."""
    storage = t.untyped_storage()
    size = storage.nbytes()
    if size:
        ptr = storage.data_ptr()
        with _lock:
            _private[ptr] = size
        weakref.finalize(t, _forget, ptr)
    return t


def _forget(ptr: int) -> None:
    with _lock:
        _private.pop(ptr, None)


def claim(view: torch.Tensor) -> bool:
    """Whether ``view`` covers all of a ``private`` storage; if so, the storage is no longer
    private (a later view of it is copied)."""
    storage = view.untyped_storage()
    size = storage.nbytes()
    if not size or view.numel() * view.element_size() != size:
        return False
    with _lock:
        if _private.get(storage.data_ptr()) != size:
            return False
        del _private[storage.data_ptr()]
    return True
