"""Hugging Face Trainer state files (``trainer_state.json``): the
``log_history`` train, eval, ``eval_<name>_*``, ``predict_*`` and ``test_*``
entries. An entry without a step (metrics a script appended after training,
such as ``trainer.predict``'s) is a point at the state's ``global_step``, the
model that produced it; ``config["entries_without_step"]`` counts them.

The learning rate a Trainer logs is the schedule's value at the logged step
(after warmup and decay), not the configured one: the run's lr comes from
``training_args.json`` / ``training_args.bin`` beside the state
(``loaders.logs.metadata``) or a hyperparameter search's ``trial_params``;
where only logged values exist, the run's notes say so
(``loaders.logs.ingest``).

The file is rewritten at each save, so a changed file is read again whole.
The copies in an output dir and its ``checkpoint-N/`` folders are one training
(``loaders.logs.ingest``), named after the output dir (``hf_run_dir``).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from loaders.errors import LogFormatError
from loaders.logs.base import (Parsed, RunData, empty_points, is_text_head, normalise_metric, points_frame,
                               steps_went_back)
from loaders.logs.training_args import read_training_args

NAME = "hf_trainer"
PRIORITY = 30
HELP = "Hugging Face Trainer trainer_state.json (log_history: train, eval and eval_<name>_* entries)"
APPENDABLE = False
EXAMPLE = "output/checkpoint-500/trainer_state.json"

_HF_NAMES = {"loss": "train/loss", "eval_loss": "val/loss", "learning_rate": "lr"}
_HF_CHECKPOINT_DIR = re.compile(r"^checkpoint-\d+$")
#: The name the Trainer gives its state file; files of this name in an output
#: dir and its checkpoint-N/ folders are one training (``loaders.logs.ingest``).
HF_STATE_NAME = "trainer_state.json"


def hf_run_dir(path: Path) -> Path:
    """The Trainer output dir: ``out/checkpoint-500/trainer_state.json`` -> ``out``."""
    parent = path.parent
    return parent.parent if _HF_CHECKPOINT_DIR.match(parent.name) else parent


def training_args_beside(path: Path) -> Path | None:
    """The ``training_args.bin`` of the training a state file belongs to: in the
    state's own folder, else in the output dir's last ``checkpoint-N/`` (the
    Trainer writes one into each; ``save_state`` puts the state in the output
    dir alone)."""
    own = path.parent / "training_args.bin"
    if own.is_file():
        return own
    run_dir = hf_run_dir(path)
    ckpts = sorted((d for d in run_dir.glob("checkpoint-*") if _HF_CHECKPOINT_DIR.match(d.name)
                    and (d / "training_args.bin").is_file()), key=lambda d: int(d.name.split("-")[1]))
    return ckpts[-1] / "training_args.bin" if ckpts else None


def _has_step(entry: dict) -> bool:
    s = entry.get("step")
    return isinstance(s, (int, float)) and not isinstance(s, bool)


def sniff(path: Path, head: bytes) -> bool:
    return is_text_head(head) and head.lstrip().startswith(b"{") and b'"log_history"' in head


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise LogFormatError(path, f"expected UTF-8 JSON, found invalid byte at offset {exc.start}") from None
    except ValueError as exc:
        raise LogFormatError(path, f"expected a JSON trainer state, found invalid JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("log_history"), list):
        raise LogFormatError(path, "expected a trainer_state.json with a 'log_history' list, "
                                   f"found keys {sorted(doc)[:10] if isinstance(doc, dict) else type(doc).__name__}")
    entries = [e for e in doc["log_history"] if isinstance(e, dict)]
    final = doc.get("global_step")
    stepless = [e for e in entries if not _has_step(e)]
    if stepless and isinstance(final, int) and not isinstance(final, bool):
        entries = [e if _has_step(e) else {**e, "step": final} for e in entries]
    hist = pd.DataFrame(entries)
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
    if isinstance(doc.get("trial_params"), dict):      # a hyperparameter search's trial: its lr, wd, seed
        config["trial_params"] = {k: v for k, v in doc["trial_params"].items()
                                  if isinstance(v, (int, float, str, bool)) or v is None}
    if stepless:
        config["entries_without_step"] = len(stepless)
    args = training_args_beside(path)
    if args is not None:
        config["training_args"] = {"file": str(args), **(read_training_args(args) or {})}
    run_dir = hf_run_dir(path)
    # The Trainer's own file is named after its output dir; any other name
    # (two trainings' states side by side) after itself.
    name = run_dir.name if path.name == HF_STATE_NAME else path.stem
    run = RunData(name=name, points=pts, config=config, resumed=steps_went_back(pts))
    return Parsed(runs=[run], read_bytes=path.stat().st_size)
