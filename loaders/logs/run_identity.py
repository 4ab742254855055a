"""Which run a log file's points feed: the stored run name, and the run's
source, which several files of one training share.

Several files feed one run where their format says they are one training:
the query-free paper's three tensors of a folder, a Hugging Face Trainer's
``trainer_state.json`` in its output dir and in each ``checkpoint-N/`` (as
long as their histories agree: ``hf_shares_run``) and its ``*_results.json``
final metrics, and lm-evaluation-harness results of several checkpoints of one model, TensorBoard event files
of one folder (TensorBoard itself shows a folder as one run), and the files
of one run folder of this project's trainer.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from loaders import run_rows
from loaders.logs.base import RunData
from loaders.logs.readers.hf_trainer import HF_STATE_NAME, hf_run_dir

# File stems that say nothing about the run: the run is named after its folder.
_GENERIC_STEMS = {"metrics", "log", "logs", "train", "training", "trainer_state", "stdout", "output",
                  "out", "progress", "history", "events", "eval_val_tensor", "eval_train_tensor",
                  "tensor", "final_model", "main", "train_log", "run"}

# A run folder of this project's trainer (experiments/train.py) holds config.json,
# metrics.jsonl and TensorBoard events of the same points: one run, not two.
# (TensorBoard event files are folder-keyed in any folder: ``run_source``.)
_RUN_FOLDER_FORMATS = ("jsonl", "csv_wide", "csv_long", "tensorboard")


def is_trainer_run_folder(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(
        (folder / m).is_file() for m in ("metrics.jsonl", "metrics.csv"))


def run_name(path: Path, fmt: str, name: str) -> str:
    """The stored run name: the reader's (W&B run names), else the file's or folder's."""
    if fmt == "lightning":
        return f"{path.parent.parent.name}/{path.parent.name}"
    if fmt in ("hf_trainer", "hf_results", "lm_eval", "query_free", "projection_sharing") and name:
        return name
    if fmt in _RUN_FOLDER_FORMATS and is_trainer_run_folder(path.parent):
        return path.parent.name
    stem = path.name.split(".")[0] if path.name.startswith("events.out") else path.stem
    base = path.parent.name if (stem.lower() in _GENERIC_STEMS or path.name.startswith("events.out")) \
        else stem
    if fmt in ("modded_nanogpt", "nanogpt", "hf_stdout"):      # several runs in one file: #2, #3, ...
        if name in ("", "#1"):
            return base
        # a nanoGPT run named by its printout (its wandb_run_name or out_dir) keeps that name
        return f"{base}{name}" if name.startswith("#") else name
    return name or base


def run_source(path: Path, fmt: str) -> tuple[str, Path, bool]:
    """(runs.source, run folder, shared): several files of one run share a source.

    The query-free paper writes three tensors per run folder, and a Trainer
    writes a trainer_state.json into every checkpoint-N folder (and one into
    its output dir on ``save_state``): those files feed one run whose source
    is the folder.
    """
    resolved = path.resolve()
    if fmt in ("query_free", "tensorboard"):
        return str(resolved.parent), resolved.parent, True
    if fmt == "lm_eval":
        # lm-eval writes OUTPUT/<model_name_sanitized>/results_<time>.json: the
        # checkpoints of one model evaluated into one OUTPUT are one run (by name).
        root = resolved.parent.parent if resolved.name.startswith("results_") else resolved.parent
        return str(root), root, True
    if fmt == "hf_results":                 # final metrics join their output dir's run
        d = hf_run_dir(resolved)
        return str(d), d, True
    if fmt == "hf_trainer":
        d = hf_run_dir(resolved)
        if path.name == HF_STATE_NAME:
            return str(d), d, True
        return str(resolved), d, False      # another name: one file, one training
    if fmt in _RUN_FOLDER_FORMATS and is_trainer_run_folder(resolved.parent):
        return str(resolved.parent), resolved.parent, True
    return str(resolved), resolved.parent, False



#: Trainer-state keys two files of one training agree on.
_HF_SAME_TRAINING = ("max_steps", "logging_steps", "eval_steps", "save_steps", "train_batch_size",
                     "num_train_epochs")


def hf_shares_run(con, source: str, run: RunData, own_ids: set[int]) -> bool:
    """Whether a ``trainer_state.json`` continues the run already stored for its
    output dir: it stored into that run before, or the run's trainer settings
    (``_HF_SAME_TRAINING``) agree with it and its ``train/loss``, ``val/loss``
    and ``lr`` agree at every step both log (to 1e-6, relative), with some
    common step where their step ranges overlap."""
    found = run_rows.find(con, source, run.name, "hf_trainer")
    if found is None or found[0] in own_ids:
        return True
    run_id, cfg = found
    if any(k in cfg and k in run.config and cfg[k] != run.config[k] for k in _HF_SAME_TRAINING):
        return False
    stored = con.execute("SELECT step, metric, value FROM points WHERE run_id = ? AND metric IN "
                         "('train/loss', 'val/loss', 'lr')", [run_id]).df()
    new = run.points if isinstance(run.points, pd.DataFrame) else pd.DataFrame(columns=["step", "metric", "value"])
    new = new[new["metric"].astype(str).isin(["train/loss", "val/loss", "lr"])]
    if stored.empty or new.empty:
        return True
    both = stored.merge(new.assign(metric=new["metric"].astype(str))[["step", "metric", "value"]],
                        on=["step", "metric"], suffixes=("_old", "_new"))
    a, b = both["value_old"].to_numpy("float64"), both["value_new"].to_numpy("float64")
    if len(both) and not np.allclose(a, b, rtol=1e-6, atol=0.0, equal_nan=True):
        return False
    overlap = max(stored["step"].min(), new["step"].min()) <= min(stored["step"].max(), new["step"].max())
    return bool(len(both)) or not overlap

