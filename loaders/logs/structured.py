"""Logs that are not text lines: TensorBoard events, HF ``trainer_state.json``,
the query-free paper's loss tensors, the projection-sharing paper's
``final_model.pt`` ``val_metrics``.

These files are rewritten (or appended in a framing we do not split), so a
changed file is read again whole and its points replace what it stored before.
"""
from __future__ import annotations

import json
import os
import re
import struct
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

from loaders.budgets import budget
from loaders.errors import LogFormatError
from loaders.logs.base import (Parsed, RunData, empty_points, normalise_metric, points_frame,
                               steps_went_back)


# -- TensorBoard ---------------------------------------------------------------
def check_record_lengths(path: Path) -> None:
    """Walk a TFRecord file's framing before any record is read.

    Each record is ``u64 length``, ``u32 masked crc32c(length)``, ``length``
    bytes, ``u32 crc`` (TensorFlow ``core/lib/io/record_writer``). Only the
    12-byte headers are read, with one seek per record. A length over
    ``QKVSCOPE_RECORD_BYTES`` (64 MiB) is refused; a header whose length runs
    past the end of the file (or whose checksum is wrong) ends the walk: the
    event loader stops at that record too, reading no more than the file holds.
    """
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    cap = budget("QKVSCOPE_RECORD_BYTES")
    size = path.stat().st_size
    with open(path, "rb") as f:
        pos = 0
        while pos + 12 <= size:
            f.seek(pos)
            head = f.read(12)
            if len(head) < 12:
                return
            length, crc = struct.unpack("<QI", head)
            if masked_crc32c(head[:8]) != crc:
                return
            if length > cap:
                raise LogFormatError(path, f"TensorBoard record at byte {pos:,} claims {length:,} bytes, "
                                           f"over the budget of {cap:,} (QKVSCOPE_RECORD_BYTES; set it "
                                           f"in the environment to raise it)")
            if length + 4 > size - pos - 12:
                return
            pos += 12 + length + 4


class TensorBoardReader:
    name = "tensorboard"
    help = "TensorBoard event file (events.out.tfevents.*), scalars only; read without TensorFlow"
    appendable = False

    @staticmethod
    def sniff(path: Path, head: bytes) -> bool:
        # TFRecord framing (8-byte length, 4-byte CRC), then the first Event,
        # which always carries file_version "brain.Event:N".
        return len(head) > 16 and b"brain.Event:" in head[:64]

    def parse(self, path: Path, *, start: int = 0, state: dict | None = None) -> Parsed:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        from tensorboard.util import tensor_util

        check_record_lengths(path)
        steps, tags, values, walls = [], [], [], []
        n_events = 0
        try:
            for event in EventFileLoader(str(path)).Load():
                n_events += 1
                if not event.HasField("summary"):
                    continue
                for v in event.summary.value:
                    if v.HasField("simple_value"):
                        x = float(v.simple_value)
                    elif v.HasField("tensor") and v.metadata.plugin_data.plugin_name == "scalars":
                        arr = tensor_util.make_ndarray(v.tensor)
                        if arr.size != 1 or not np.issubdtype(arr.dtype, np.number):
                            continue
                        x = float(arr.reshape(()))
                    else:
                        continue
                    steps.append(event.step)
                    tags.append(v.tag)
                    values.append(x)
                    walls.append(event.wall_time)
        except Exception as exc:  # the loader raises its own DataLossError and protobuf errors
            raise LogFormatError(path, f"expected TensorBoard event records, found a corrupt record "
                                       f"({type(exc).__name__}: {exc})") from None
        if n_events == 0:
            # The loader stops quietly at the first bad CRC; a file with no
            # readable record at all is corrupt, not an empty run.
            raise LogFormatError(path, "expected TensorBoard event records, found none with a valid "
                                       "checksum (corrupt or truncated file)")
        metrics = pd.Series(tags, dtype="object").map(normalise_metric).to_numpy() if tags else []
        pts = points_frame(steps, metrics, values, walls) if steps else empty_points()
        return Parsed(runs=[RunData(name="", points=pts, resumed=steps_went_back(pts))],
                      read_bytes=path.stat().st_size)


# -- Hugging Face Trainer --------------------------------------------------------
_HF_NAMES = {"loss": "train/loss", "eval_loss": "val/loss", "learning_rate": "lr"}
_HF_CHECKPOINT_DIR = re.compile(r"^checkpoint-\d+$")
#: The name the Trainer gives its state file; files of this name in an output
#: dir and its checkpoint-N/ folders are one training (``loaders.logs.ingest``).
HF_STATE_NAME = "trainer_state.json"


def hf_run_dir(path: Path) -> Path:
    """The Trainer output dir: ``out/checkpoint-500/trainer_state.json`` -> ``out``."""
    parent = path.parent
    return parent.parent if _HF_CHECKPOINT_DIR.match(parent.name) else parent


class HfTrainerReader:
    name = "hf_trainer"
    help = "Hugging Face Trainer trainer_state.json (log_history: train, eval and eval_<name>_* entries)"
    appendable = False

    @staticmethod
    def sniff(path: Path, head: bytes) -> bool:
        return head.lstrip().startswith(b"{") and b'"log_history"' in head

    def parse(self, path: Path, *, start: int = 0, state: dict | None = None) -> Parsed:
        try:
            doc = json.loads(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise LogFormatError(path, f"expected UTF-8 JSON, found invalid byte at offset {exc.start}") from None
        except ValueError as exc:
            raise LogFormatError(path, f"expected a JSON trainer state, found invalid JSON ({exc})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("log_history"), list):
            raise LogFormatError(path, "expected a trainer_state.json with a 'log_history' list, "
                                       f"found keys {sorted(doc)[:10] if isinstance(doc, dict) else type(doc).__name__}")
        hist = pd.DataFrame([e for e in doc["log_history"] if isinstance(e, dict)])
        if "step" in hist:
            # An entry without a finite integer step is no point of any curve.
            steps = pd.to_numeric(hist["step"], errors="coerce")
            hist = hist[np.isfinite(steps.to_numpy(dtype="float64")) & (steps.abs() < 2.0**63)]
            hist = hist.assign(step=steps[hist.index]).reset_index(drop=True)
        if hist.empty or "step" not in hist:
            pts = empty_points()
        else:
            # The closing summary entry (train_runtime, train_loss = mean over the
            # run) keeps its logged names: its train_loss is no point of the curve.
            summary = hist["train_runtime"].notna() if "train_runtime" in hist else pd.Series(False, index=hist.index)
            tokens = hist["num_input_tokens_seen"] if "num_input_tokens_seen" in hist else None
            cols = [c for c in hist.columns if c not in ("step", "num_input_tokens_seen")
                    and pd.api.types.is_numeric_dtype(hist[c])]
            frames = []
            for i, c in enumerate(cols):
                v = hist[c]
                ok = v.notna().to_numpy()
                names = np.where(summary.to_numpy()[ok], c, _HF_NAMES.get(c, normalise_metric(c)))
                frames.append(pd.DataFrame({
                    "order": np.flatnonzero(ok) * (len(cols) + 1) + i, "step": hist["step"][ok].astype("int64"),
                    "metric": names, "value": v[ok].astype("float64"),
                    "tokens": tokens[ok] if tokens is not None else pd.NA}))
            df = pd.concat(frames, ignore_index=True).sort_values("order", kind="stable")
            pts = points_frame(df["step"], df["metric"].to_numpy(), df["value"],
                               tokens=pd.to_numeric(df["tokens"], errors="coerce").round().astype("Int64"))
        config = {k: v for k, v in doc.items() if k not in ("log_history", "stateful_callbacks")
                  and not isinstance(v, (list, dict))}
        run_dir = hf_run_dir(path)
        # The Trainer's own file is named after its output dir; any other name
        # (two trainings' states side by side) after itself.
        name = run_dir.name if path.name == HF_STATE_NAME else path.stem
        run = RunData(name=name, points=pts, config=config, resumed=steps_went_back(pts))
        return Parsed(runs=[run], read_bytes=path.stat().st_size)


# -- query-free paper (MarkoKarbevski/Wqkv_necessity) ------------------------------
QUERY_FREE_FILES = {"tensor.pt": "train", "eval_train_tensor.pt": "eval_train",
                    "eval_val_tensor.pt": "eval_val"}
#: One eval row per this many steps unless the run's config says otherwise.
QUERY_FREE_EVAL_INTERVAL = 1000


def _is_torch_zip(head: bytes) -> bool:
    return head[:4] == b"PK\x03\x04"


def _load_tensor(path: Path):
    """The saved tensor, refused unless it owns its bytes (``budgets.tensor_problem``:
    ``zeros(1).expand(10**9, 3)`` is 24 GB once converted to float64)."""
    import torch

    from loaders.budgets import tensor_problem
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


class QueryFreeReader:
    name = "query_free"
    help = ("query-free paper loss tensors: tensor.pt (per-step train loss, column 0), "
            "eval_train_tensor.pt / eval_val_tensor.pt (rows [eval_iters, mean, std] per eval)")
    appendable = False

    @staticmethod
    def sniff(path: Path, head: bytes) -> bool:
        if path.name not in QUERY_FREE_FILES or not _is_torch_zip(head):
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

    def parse(self, path: Path, *, start: int = 0, state: dict | None = None,
              eval_interval: int | None = None) -> Parsed:
        import torch
        kind = QUERY_FREE_FILES.get(path.name)
        t = _load_tensor(path)
        if kind is None or not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[1] < 1 \
                or (kind != "train" and t.shape[1] < 3):
            shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise LogFormatError(path, f"expected a [rows, 3] loss tensor named tensor.pt, "
                                       f"eval_train_tensor.pt or eval_val_tensor.pt, found {shape}")
        with torch.inference_mode():
            arr = t.detach().to(torch.float64).cpu().numpy().copy()  # (rows, 3)
        interval = eval_interval or QUERY_FREE_EVAL_INTERVAL
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


# -- projection-sharing paper (Brainchip-Inc/Do-Transformers-Need-3-Projections) ----
class ProjectionSharingReader:
    name = "projection_sharing"
    help = ("projection-sharing paper checkpoint's val_metrics (final_model.pt: step, tokens_seen, "
            "val_metrics, model_config, train_config)")
    appendable = False

    @staticmethod
    def sniff(path: Path, head: bytes) -> bool:
        if not _is_torch_zip(head):
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

    def parse(self, path: Path, *, start: int = 0, state: dict | None = None) -> Parsed:
        import torch
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
