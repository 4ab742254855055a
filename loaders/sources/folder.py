"""Folders: which file of a Hugging Face folder or a run folder holds the
weights (``_folder_plan``), and the config read beside it.

A folder with ``config.json`` is read from ``model.safetensors``, its index,
``pytorch_model.bin`` or its index, in that order. A run folder (nanoGPT,
paper code, llama2.c ``out/``) must hold one checkpoint file once llama2.c
tokenizers, tensor-only log files, a llama2.c export beside its training
checkpoint and the intermediate checkpoints beside ``final_model.pt`` are
set aside (each said in ``folder_note``); its config is ``config.json`` or
``model_config.yaml``. Budgets: YAML within ``QKVSCOPE_YAML_BYTES`` with
aliases counted in full, then the side-data budgets. Errors:
``CheckpointFormatError`` (no checkpoint file, several, a config that is not
valid JSON/YAML or not a mapping).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
import yaml

from loaders import llama2c
from loaders.budgets import BudgetExceeded, load_yaml
from loaders.checkpoint_names import EXPECTED, HF_WEIGHT_FILES, TORCH_SUFFIXES
from loaders.errors import CheckpointFormatError
from loaders.sources.pickles import _torch_load
from loaders.sources.sharded import _index_shard_paths
from loaders.sources.side_data import _jsonlike
from loaders.sources.sniff import _file_kind


class _FolderPlan:
    """What a folder is read from: ``target`` (file or index), the config file
    (``config.json`` / ``model_config.yaml``) and every file read (for hashing)."""

    def __init__(self, target: Path, config_file: Path | None, files: list[Path], note: str = ""):
        self.target, self.config_file, self.files, self.note = target, config_file, files, note


def _holds_bare_tensor(p: Path) -> bool:
    try:
        kind = _file_kind(p)
        if kind not in ("torch_zip", "torch_legacy"):
            return False
        obj = _torch_load(p, kind)
    except CheckpointFormatError:
        return False
    bare = isinstance(obj, torch.Tensor) or not isinstance(obj, Mapping)
    del obj
    return bare


def _folder_plan(d: Path) -> _FolderPlan:
    files = sorted(c for c in d.iterdir() if c.is_file() and not c.name.startswith("."))
    names = {c.name: c for c in files}
    cfg = names.get("config.json")
    if cfg is not None:
        for w in HF_WEIGHT_FILES:
            if w in names:
                target = names[w]
                extra = _index_shard_paths(target) if w.endswith(".index.json") else []
                return _FolderPlan(target, cfg, [cfg, target, *extra])
    for w in HF_WEIGHT_FILES:                       # an index without config.json: a sharded set
        if w.endswith(".index.json") and w in names:
            return _FolderPlan(names[w], None, [names[w], *_index_shard_paths(names[w])])
    cands = [c for c in files if c.suffix.lower() in TORCH_SUFFIXES + (".safetensors",)]
    if not cands:
        found = ", ".join(c.name for c in files[:10]) or "nothing"
        raise CheckpointFormatError(
            d, f"folder holds no checkpoint file (found: {found}); {EXPECTED}")
    note = ""
    toks = [c for c in cands if c.suffix.lower() == ".bin" and llama2c.is_tokenizer(c)]
    if toks:
        cands = [c for c in cands if c not in toks]
        note = f"skipped llama2.c tokenizer: {', '.join(c.name for c in toks)}"
    if len(cands) > 1:
        logs = [c for c in cands if _holds_bare_tensor(c)]
        cands = [c for c in cands if c not in logs]
        if logs:
            note = "; ".join(x for x in (note, f"skipped tensor-only files: {', '.join(c.name for c in logs)}") if x)
    exports = [c for c in cands if c.suffix.lower() == ".bin" and _is_llama2c(c)]
    if exports and len(cands) - len(exports) == 1:
        # llama2.c out/: ckpt.pt beside the .bin exported from it; the training checkpoint wins
        kept = [c for c in cands if c not in exports]
        note = "; ".join(x for x in (note, f"chose {kept[0].name} over its llama2.c export "
                                           f"{', '.join(c.name for c in exports)}") if x)
        cands = kept
    if len(cands) > 1 and "final_model.pt" in {c.name for c in cands}:
        # projection-sharing paper runs: final_model.pt beside intermediate checkpoints
        others = [c.name for c in cands if c.name != "final_model.pt"]
        note = "; ".join(x for x in (note, f"chose final_model.pt over {', '.join(others)}") if x)
        cands = [names["final_model.pt"]]
    if len(cands) != 1:
        listed = ", ".join(c.name for c in cands) or "none besides tensor-only log files"
        raise CheckpointFormatError(
            d, f"folder holds {len(cands)} checkpoint files ({listed}); expected exactly one "
               f"(open one of them by its path)")
    cfg_file = cfg or names.get("model_config.yaml")
    return _FolderPlan(cands[0], cfg_file, [cands[0]] + ([cfg_file] if cfg_file else []), note)


def _is_llama2c(p: Path) -> bool:
    try:
        return _file_kind(p) == "llama2c"
    except CheckpointFormatError:
        return False


def _read_json_config(p: Path) -> dict:
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointFormatError(p, f"config is not valid JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise CheckpointFormatError(p, f"config is a JSON {type(cfg).__name__}, expected an object")
    return cfg


def _read_yaml_config(p: Path) -> dict:
    try:
        cfg = load_yaml(p)
        if not isinstance(cfg, dict):
            raise CheckpointFormatError(p, f"model config is a YAML {type(cfg).__name__}, expected a mapping")
        return _jsonlike(cfg)
    except BudgetExceeded as exc:
        raise CheckpointFormatError(p, f"model config: {exc}; refused") from None
    except UnicodeDecodeError as exc:
        raise CheckpointFormatError(p, f"model config is not UTF-8 (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0]
        raise CheckpointFormatError(p, f"model config is not valid YAML ({first})") from None
