"""The projection-sharing paper's ``final_model.pt``
(Brainchip-Inc/Do-Transformers-Need-3-Projections): its ``val_metrics`` at
its ``step`` (and ``tokens_seen``), with ``model_config`` and ``train_config``.

The file is a checkpoint first (``INSIDE_CHECKPOINT``): ``detect_log`` never
picks this reader; ``loaders.ingest`` stores the val_metrics beside the
checkpoint itself, and ``ingest_log(..., format="projection_sharing")`` reads one.
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from loaders.errors import LogFormatError
from loaders.logs.base import ZIP_MAGIC, Parsed, RunData, points_frame

NAME = "projection_sharing"
PRIORITY = 25
HELP = ("projection-sharing paper checkpoint's val_metrics (final_model.pt: step, tokens_seen, "
        "val_metrics, model_config, train_config)")
APPENDABLE = False
EXAMPLE = "checkpoints/final_model.pt"
INSIDE_CHECKPOINT = True


def sniff(path: Path, head: bytes) -> bool:
    if head[:4] != ZIP_MAGIC:
        return False
    try:
        with zipfile.ZipFile(path) as zf:
            pkl = next((n for n in zf.namelist() if n.endswith("data.pkl")), None)
            if pkl is None:
                return False
            with zf.open(pkl) as fh:
                data = fh.read(1 << 20)
    except (zipfile.BadZipFile, OSError):
        return False
    return b"val_metrics" in data and b"train_config" in data


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    import torch  # here, not at the top: importing loaders.logs (pages, `runs`) needs no torch

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        raise LogFormatError(path, f"expected a checkpoint torch.load(weights_only=True) can read, "
                                   f"found {type(exc).__name__}") from None
    vm = ckpt.get("val_metrics") if isinstance(ckpt, dict) else None
    if not isinstance(vm, dict) or "step" not in ckpt:
        raise LogFormatError(path, "expected a dict with 'step' and a 'val_metrics' dict, found "
                                   f"keys {sorted(ckpt)[:10] if isinstance(ckpt, dict) else type(ckpt).__name__}")
    step = int(ckpt["step"])
    tokens = ckpt.get("tokens_seen")
    names, vals = [], []
    for k, v in vm.items():
        try:
            x = float(v)
        except (TypeError, ValueError):
            continue
        names.append("val/loss" if k == "loss" else f"val/{k}")
        vals.append(x)
    pts = points_frame([step] * len(vals), np.array(names, dtype=object), vals,
                       tokens=[int(tokens)] * len(vals) if tokens is not None else None)
    config = {}
    for key in ("model_config", "train_config"):
        if isinstance(ckpt.get(key), dict):
            config[key] = {k: v for k, v in ckpt[key].items()
                           if isinstance(v, (int, float, str, bool)) or v is None}
    run = RunData(name=path.parent.name, points=pts, config=config)
    return Parsed(runs=[run], read_bytes=path.stat().st_size)
