"""Sharded sets: a ``*.safetensors.index.json`` or ``pytorch_model.bin.index.json``
weight map and the shard files it names, read as one source.

Reads the index (JSON, ``weight_map``: tensor name -> shard file); shard
names must be plain file names inside the index's folder. safetensors shards
are opened (header only) up front and every key the map gives them checked;
PyTorch shards are loaded the first time one of their tensors is asked for.
Budget: the index's ``metadata`` is walked within the side-data budgets.
Errors: ``CheckpointFormatError`` (not JSON, no weight map, a name outside
the folder, missing shards, shards of another kind, keys a shard lacks).
"""
from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath

import torch

from loaders.budgets import BudgetExceeded
from loaders.errors import CheckpointFormatError
from loaders.sources.files import _Closing
from loaders.sources.safetensors_file import SafetensorsSource
from loaders.sources.side_data import _jsonlike
from loaders.sources.sniff import _file_kind
from loaders.sources.torch_file import TorchSource, strip_key_prefixes
from loaders.tensor_source import TensorSource


def _read_index(p: Path) -> dict:
    try:
        index = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointFormatError(p, f"shard index is not valid JSON ({exc})") from None
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wm, dict) or not wm or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
        raise CheckpointFormatError(
            p, "shard index has no weight_map; expected {\"weight_map\": {tensor name: shard file}}")
    for shard in set(wm.values()):
        sp = PurePosixPath(shard.replace("\\", "/"))
        if sp.is_absolute() or ".." in sp.parts or re.match(r"^[A-Za-z]:", shard):
            raise CheckpointFormatError(
                p, f"shard index names '{shard}', outside the index's folder; expected plain file names")
    return index


def _index_shard_paths(p: Path) -> list[Path]:
    index = _read_index(p)
    return [p.parent / s for s in sorted(set(index["weight_map"].values()))]


class ShardedSource(_Closing, TensorSource):
    """One source over the shards named by a ``*.index.json`` weight map.

    safetensors shards are opened (header only) up front; PyTorch shards are
    loaded (memory-mapped) the first time one of their tensors is asked for.
    """

    def __init__(self, index_path: str | Path):
        p = Path(index_path)
        index = _read_index(p)
        self.path = str(p)
        self._index = p
        self._map: dict[str, str] = {}
        raw_map = index["weight_map"]
        for k, shard in raw_map.items():
            self._map[strip_key_prefixes(k)] = shard
        shards = sorted(set(raw_map.values()))
        missing = [s for s in shards if not (p.parent / s).is_file()]
        if missing:
            raise CheckpointFormatError(
                p, f"shard index names {len(missing)} missing shard file(s): {', '.join(missing)}")
        self._shards: dict[str, TensorSource | None] = {}
        self._closed = False
        self._kinds = {s: _file_kind(p.parent / s) for s in shards}
        bad = sorted(s for s, k in self._kinds.items() if k not in ("safetensors", "torch_zip", "torch_legacy"))
        if bad:
            raise CheckpointFormatError(p, f"shards are not safetensors or PyTorch files: {', '.join(bad)}")
        self.format = ("safetensors-sharded" if all(k == "safetensors" for k in self._kinds.values())
                       else "pytorch-sharded")
        self.config = {}
        try:
            meta = _jsonlike(index.get("metadata") or {})
        except BudgetExceeded as exc:
            raise CheckpointFormatError(p, f"shard index metadata: {exc}") from None
        self.extras = {"index_metadata": meta, "shards": shards}
        try:
            for s, k in self._kinds.items():
                self._shards[s] = SafetensorsSource(p.parent / s) if k == "safetensors" else None
            for s, src in self._shards.items():
                if src is not None:
                    self._check_keys(p, s, src)
            if self.format == "safetensors-sharded":
                self.extras["safetensors_metadata"] = self._shards[shards[0]].extras["safetensors_metadata"]
        except BaseException:
            self.close()
            raise

    def _check_keys(self, p: Path, shard: str, src: TensorSource) -> None:
        have = set(src.keys())
        absent = sorted(k for k, s in self._map.items() if s == shard and k not in have)
        if absent:
            shown = ", ".join(absent[:10]) + (f" and {len(absent) - 10} more" if len(absent) > 10 else "")
            raise CheckpointFormatError(
                p, f"shard index maps {len(absent)} tensor(s) to {shard} that it does not hold: {shown}")

    def _source(self, key: str) -> TensorSource:
        try:
            shard = self._map[key]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {key!r}") from None
        if self._closed:
            raise ValueError(f"{self.path}: source is closed")
        src = self._shards.get(shard)
        if src is None:
            src = TorchSource(self._index.parent / shard, _kind=self._kinds[shard])
            self._shards[shard] = src
            self._check_keys(self._index, shard, src)
        return src

    def keys(self) -> list[str]:
        return list(self._map)

    def shape(self, key: str) -> tuple[int, ...]:
        return self._source(key).shape(key)

    def dtype(self, key: str) -> str:
        return self._source(key).dtype(key)

    def get(self, key: str) -> torch.Tensor:
        return self._source(key).get(key)

    def close(self) -> None:
        for src in self._shards.values():
            if src is not None:
                src.close()
        self._shards = {s: None for s in self._shards}
        self._closed = True
