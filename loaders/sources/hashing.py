"""``content_hash`` (what identifies a checkpoint in the store) and
``validate`` (the cheap checks made before it is hashed).

Reads: ``validate`` only safetensors headers (and one ``lseek`` per large
tensor for sparse holes), so a bad header is refused before gigabytes are
hashed; ``content_hash`` streams the files in 1 MiB chunks, never whole.
Errors: ``CheckpointFormatError`` (missing file, bad header, a tensor in a
hole).
"""
from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

from loaders.checkpoint_names import EXPECTED
from loaders.errors import CheckpointFormatError
from loaders.sources.files import _CHUNK, _check_no_hole
from loaders.sources.safetensors_file import _read_safetensors_header
from loaders.sources.sniff import _file_kind


def content_hash(path: str | Path) -> str:
    """sha256 hex digest identifying a checkpoint's content.

    * a single file: ``sha256(file bytes)`` (equals ``sha256sum FILE``);
    * a sharded index file or a folder: sha256 over the files it is read from,
      sorted by name relative to the index's/folder's directory, each fed as
      ``name`` + NUL + 8-byte little-endian size + bytes.

    Files are streamed in 1 MiB chunks, never read whole.
    """
    p = Path(path)
    validate(p)
    if p.is_dir():
        return _hash_files(p, _folder_plan(p).files)
    if p.name.endswith(".index.json"):
        return _hash_files(p.parent, [p, *_index_shard_paths(p)])
    h = hashlib.sha256()
    _feed(h, p)
    return h.hexdigest()


def validate(path: str | Path) -> None:
    """Cheap checks of a checkpoint before it is hashed or read: the file(s)
    exist and every safetensors file's header is valid (``_read_safetensors_header``:
    header length, JSON, dtypes, shapes, offsets that tile the data area).
    Reads only headers; raises ``CheckpointFormatError``. ``content_hash`` calls it."""
    p = Path(path)
    if not p.exists():
        raise CheckpointFormatError(p, f"no such file or folder; {EXPECTED}")
    configs: set[Path] = set()
    if p.is_dir():
        plan = _folder_plan(p)
        files = plan.files
        if plan.config_file is not None:     # config.json / model_config.yaml: read as config, not sniffed
            configs.add(plan.config_file)
    elif p.name.endswith(".index.json"):
        files = [f for f in _index_shard_paths(p) if f.is_file()]
    else:
        files = [p]
    for f in files:
        if f in configs:
            continue
        if f.suffix.lower() != ".json" and f.is_file() and _file_kind(f) == "safetensors":
            entries, _, start = _read_safetensors_header(f)
            fd = os.open(f, os.O_RDONLY)
            try:
                for key, e in entries.items():
                    begin, end = e["data_offsets"]
                    _check_no_hole(f, fd, key, start + begin, end - begin)
            finally:
                os.close(fd)


def _folder_plan(p: Path):
    """``folder._folder_plan``: which files of a folder the checkpoint is read from."""
    from loaders.sources.folder import _folder_plan as plan  # here: folders only (it loads the torch/yaml readers)

    return plan(p)


def _index_shard_paths(p: Path) -> list[Path]:
    """``sharded._index_shard_paths``: the shard files an ``*.index.json`` names."""
    from loaders.sources.sharded import _index_shard_paths as shards  # here: sharded indexes only

    return shards(p)


def _feed(h, p: Path) -> None:
    with open(p, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)


def _hash_files(base: Path, files: list[Path]) -> str:
    h = hashlib.sha256()
    for name, f in sorted((f.relative_to(base).as_posix(), f) for f in set(files)):
        if not f.is_file():
            raise CheckpointFormatError(f, "is missing; cannot hash the checkpoint")
        h.update(name.encode("utf-8") + b"\0" + struct.pack("<Q", f.stat().st_size))
        _feed(h, f)
    return h.hexdigest()
