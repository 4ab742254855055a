"""Checkpoint container formats: files, folders and zips -> ``TensorSource``.

``open_source(path)`` understands the container (not the layout) of a
checkpoint and returns a ``TensorSource`` whose tensors are read one at a time:

=======================================  ============================================
what ``path`` is                         how it is read
=======================================  ============================================
safetensors file                         header validated here, one tensor per
                                         ``get`` (``os.preadv``; ``safe_open`` mmap
                                         on request)
``*.safetensors.index.json`` + shards    one source over all shards, lazy per key
PyTorch zip file (.pt/.pth/.ckpt/.bin)   ``torch.load(weights_only=True, mmap=True)``
PyTorch legacy (pre-1.6) pickle file     ``torch.load(weights_only=True)`` (no mmap)
llama2.c export (v0, v1, v2 ``.bin``)    ``loaders/llama2c.py``: header checked against
                                         the file size, one tensor per ``get``
``pytorch_model.bin.index.json``         one source over the torch shards
Hugging Face folder (``config.json``)    config.json + model.safetensors / index /
                                         pytorch_model.bin
run folder (nanoGPT, paper code,         its one checkpoint file (+ model_config.yaml);
llama2.c ``out/``)                       a llama2.c ``tokenizer.bin`` is not a checkpoint
``.zip`` of any of these                 extracted safely to a temporary folder that
                                         ``close()`` deletes
=======================================  ============================================

One module per format, each with its budgets and errors in its docstring:

=======================  ==========================================================
module                   holds
=======================  ==========================================================
``opening.py``           ``open_source``: the dispatch on content, folders opened
``sniff.py``             ``_file_kind`` (magic bytes), ``is_checkpoint_candidate``
``safetensors_file.py``  ``SafetensorsSource``, the header validation
``torch_file.py``        ``TorchSource``, weights split from training state,
                         ``check_tensor``, ``strip_key_prefixes``
``pickles.py``           the pickle allow-list: ``torch.load(weights_only=True)``
                         with numpy scalars, ``load_plain_pickle`` (no globals)
``sharded.py``           ``ShardedSource`` over a ``*.index.json`` weight map
``folder.py``            which file of a folder is read, and its config
``zip_upload.py``        ``ZipSource``: safe extraction of an upload
``hashing.py``           ``content_hash``, ``validate``
``side_data.py``         side data walked within the side-data budgets
``files.py``             file identity, change and sparse-hole checks
=======================  ==========================================================

The file names and suffixes (``EXPECTED``, ``CHECKPOINT_SUFFIXES``, the
Hugging Face weight files) live in ``loaders/checkpoint_names.py`` (standard
library only). A new container format is one module here shaped like
``safetensors_file.py`` (a ``TensorSource`` subclass with ``format``,
``config``, ``extras``, ``keys``/``shape``/``dtype``/``get``/``close``), a
branch in ``sniff._file_kind`` and one in ``opening._open_file``.

The format is decided by content (magic bytes; for llama2.c's headerless v0
a header whose implied size is the file's), the suffix only breaks ties.
Nothing is ever unpickled beyond plain tensors and containers: a pickle that
asks for any other callable raises ``UnsafeCheckpointError`` and runs nothing.
``load_plain_pickle`` is the restricted unpickler for side files such as
nanoGPT's ``meta.pkl``: no global at all may be imported, and the result is
walked within the side-data budgets.

``content_hash(path)`` is the sha256 of a file, or of the files a folder or
sharded set is read from (names and contents), streamed in 1 MiB chunks; it
calls ``validate(path)`` first, so a safetensors file with a bad header is
refused before gigabytes are hashed.

Budgets (``loaders/budgets.py``), checked before allocating: every unpickled
tensor must use its own storage (``tensor_problem``: no zero or overlapping
strides, its bytes inside the file); side data is walked within
``QKVSCOPE_SIDE_ITEMS`` / ``_DEPTH`` / ``_BYTES``; YAML configs within
``QKVSCOPE_YAML_BYTES`` with aliases counted in full; zip entries may not
overlap and extraction writes at most ``QKVSCOPE_ZIP_TOTAL_BYTES``; a
safetensors tensor lying in a hole of a sparse file is refused. A file that
changes (size or mtime) after it was opened fails with one line before the
next tensor is read, never a bus error from a shrunken memory map.

Everything other modules import stays importable from ``loaders.sources``:
the public names of ``__all__`` and, for ``loaders/llama2c.py``, the file
checks ``_identity``, ``_check_unchanged`` and ``_check_no_hole``. Each is
imported from its module when first asked for (``__getattr__``): opening a
safetensors file loads the safetensors reader, not the pickle, zip and torch
readers beside it.
"""
from __future__ import annotations

import importlib

#: name -> the module of this package that defines it (imported on first use).
_HOME: dict[str, str] = {
    "CHECKPOINT_SUFFIXES": "loaders.checkpoint_names", "EXPECTED": "loaders.checkpoint_names",
    "_check_no_hole": "loaders.sources.files", "_check_unchanged": "loaders.sources.files",
    "_identity": "loaders.sources.files",
    "content_hash": "loaders.sources.hashing", "validate": "loaders.sources.hashing",
    "open_source": "loaders.sources.opening",
    "load_plain_pickle": "loaders.sources.pickles",
    "SafetensorsSource": "loaders.sources.safetensors_file",
    "ShardedSource": "loaders.sources.sharded",
    "is_checkpoint_candidate": "loaders.sources.sniff",
    "TorchSource": "loaders.sources.torch_file", "check_tensor": "loaders.sources.torch_file",
    "strip_key_prefixes": "loaders.sources.torch_file",
    "ZipSource": "loaders.sources.zip_upload",
}

__all__ = [
    "open_source", "content_hash", "validate", "is_checkpoint_candidate", "check_tensor",
    "load_plain_pickle",
    "SafetensorsSource", "TorchSource", "ShardedSource", "ZipSource",
    "EXPECTED", "CHECKPOINT_SUFFIXES",
]


def __getattr__(name: str):
    """``loaders.sources.NAME``: NAME from the module ``_HOME`` gives (PEP 562)."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
