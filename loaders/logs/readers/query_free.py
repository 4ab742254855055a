"""The query-free paper's loss tensors (MarkoKarbevski/Wqkv_necessity):
``tensor.pt`` (per-step train loss in column 0) and ``eval_train_tensor.pt``
/ ``eval_val_tensor.pt`` (rows ``[eval_iters, mean, std]`` per eval).

Told apart from checkpoints by the zip's pickle index (a lone tensor), read
with ``torch.load(weights_only=True)``. The three tensors of a folder are one
run (``loaders.logs.ingest.run_source``); a changed file is read again whole.
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

from loaders.budgets import tensor_problem
from loaders.errors import LogFormatError
from loaders.logs.base import ZIP_MAGIC, Parsed, RunData, points_frame

NAME = "query_free"
PRIORITY = 20
HELP = ("query-free paper loss tensors: tensor.pt (per-step train loss, column 0), "
        "eval_train_tensor.pt / eval_val_tensor.pt (rows [eval_iters, mean, std] per eval)")
APPENDABLE = False
EXAMPLE = "out/tensor.pt"

QUERY_FREE_FILES = {"tensor.pt": "train", "eval_train_tensor.pt": "eval_train",
                    "eval_val_tensor.pt": "eval_val"}
#: One eval row per this many steps (the paper's eval interval; stored in the run's config).
QUERY_FREE_EVAL_INTERVAL = 1000


def _load_tensor(path: Path):
    """The saved tensor, refused unless it owns its bytes (``budgets.tensor_problem``:
    ``zeros(1).expand(10**9, 3)`` is 24 GB once converted to float64)."""
    import torch  # here, not at the top: importing loaders.logs (pages, `runs`) needs no torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several unrelated types for corrupt/unsafe files
        raise LogFormatError(path, f"expected a tensor saved by torch.save, found a file "
                                   f"torch.load(weights_only=True) refuses ({type(exc).__name__})") from None
    if isinstance(obj, torch.Tensor):
        problem = tensor_problem(obj)
        if problem is not None:
            raise LogFormatError(path, f"loss tensor {problem}; refused")
    return obj


def sniff(path: Path, head: bytes) -> bool:
    if path.name not in QUERY_FREE_FILES or head[:4] != ZIP_MAGIC:
        return False
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            pkl = next((n for n in names if n.endswith("data.pkl")), None)
            if pkl is None or zf.getinfo(pkl).file_size > 4096:
                return False
            data = zf.read(pkl)
    except (zipfile.BadZipFile, OSError):
        return False
    # A lone tensor pickles as one top-level call to torch._utils._rebuild_tensor_v2
    # (after the 2-byte protocol header); a dict or a module would start otherwise.
    return data[2:].startswith(b"ctorch._utils\n_rebuild_tensor")


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    import torch  # here, not at the top: importing loaders.logs (pages, `runs`) needs no torch

    kind = QUERY_FREE_FILES.get(path.name)
    t = _load_tensor(path)
    if kind is None or not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[1] < 1 \
            or (kind != "train" and t.shape[1] < 3):
        shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise LogFormatError(path, f"expected a [rows, 3] loss tensor named tensor.pt, "
                                   f"eval_train_tensor.pt or eval_val_tensor.pt, found {shape}")
    with torch.inference_mode():
        arr = t.detach().to(torch.float64).cpu().numpy().copy()  # (rows, 3)
    interval = QUERY_FREE_EVAL_INTERVAL
    if kind == "train":
        logged = arr[:, 0] != 0.0  # unwritten rows stay zero
        steps = np.flatnonzero(logged)
        pts = points_frame(steps, "train/loss", arr[logged, 0])
    else:
        done = arr[:, 0] > 0  # column 0 is eval_iters; 0 = not evaluated yet
        rows = np.flatnonzero(done)
        base = "val/loss" if kind == "eval_val" else "eval/train_loss"
        pts = pd.concat([points_frame(rows * interval, base, arr[done, 1]),
                         points_frame(rows * interval, base + "_std", arr[done, 2])],
                        ignore_index=True).sort_values("step", kind="stable").reset_index(drop=True)
    run = RunData(name=path.parent.name, points=pts,
                  config={"eval_interval": interval, "query_free_file": path.name},
                  meta={"variant_hint": "query_free"})
    return Parsed(runs=[run], read_bytes=path.stat().st_size)
