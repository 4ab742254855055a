"""The interface between file formats and layout converters.

A ``TensorSource`` is what a checkpoint file (or folder, or zip) looks like
once its container format is understood but before its layout is: a flat
mapping of tensor names to lazily readable tensors, plus whatever configuration
came with it. File formats (``loaders/sources/``) produce sources; layout
converters (``loaders/layouts/``) consume them.

* ``keys()``: every tensor name, prefixes such as ``_orig_mod.`` or
  ``model_state_dict.`` already removed by the format reader.
* ``shape(key)`` and ``dtype(key)``: without reading the data.
* ``get(key)``: reads that one tensor (the caller must not modify it).
* ``config``: the model configuration that came with the file, as a dict:
  ``config.json`` of a Hugging Face folder, ``model_args`` of a nanoGPT
  checkpoint, ``model_config`` of the projection-sharing paper, else ``{}``.
* ``extras``: other non-tensor top-level entries (``config``, ``train_config``,
  ``iter_num``, ``step``, ``val_metrics``...), JSON-like values only.
* ``path``: what the user pointed at (file or folder), for error messages.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Mapping

import torch


class TensorSource(ABC):
    """Base class; subclasses implement ``keys``, ``shape``, ``dtype``, ``get``."""

    path: str = "<memory>"
    config: dict
    extras: dict

    @abstractmethod
    def keys(self) -> list[str]:
        ...

    @abstractmethod
    def shape(self, key: str) -> tuple[int, ...]:
        ...

    @abstractmethod
    def dtype(self, key: str) -> str:
        """Storage dtype as torch names it, without the ``torch.`` prefix."""
        ...

    @abstractmethod
    def get(self, key: str) -> torch.Tensor:
        ...

    def numel(self, key: str) -> int:
        n = 1
        for s in self.shape(key):
            n *= s
        return n

    def close(self) -> None:
        """Release file handles; the default holds none."""

    def __contains__(self, key: str) -> bool:
        return key in set(self.keys())


class DictSource(TensorSource):
    """A source over tensors already in memory (state dicts built in code)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], *, config: dict | None = None,
                 extras: dict | None = None, path: str = "<memory>"):
        self._tensors = dict(tensors)
        self.config = dict(config or {})
        self.extras = dict(extras or {})
        self.path = path

    def keys(self) -> list[str]:
        return list(self._tensors)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._tensors[key].shape)

    def dtype(self, key: str) -> str:
        return str(self._tensors[key].dtype).replace("torch.", "")

    def get(self, key: str) -> torch.Tensor:
        return self._tensors[key]
