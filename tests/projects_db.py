"""A database of several projects, as a new user builds one, for the tests of projects and groups.

Built in code from other people's real logs (``/work/shared/realworld/logs``: an HF Trainer
state, an llm.c log of modded-nanogpt, a TensorBoard run of uncover-hidden-geometry; see that
folder's SOURCES.md) plus the bundled demo (language and ViT runs, ``tests/demo_db.py``), each
ingested as its own folder, so each is its own project:

* ``demo``: the bundled demo (47 runs, 55 checkpoints; language and image tasks);
* ``hf-trainer``, ``llmc``: one run each;
* ``tensorboard``: ``add-carryTrue/GPT8L8H`` (the real event file);
* ``carry-sweep``: the same event file under ``add-carryFalse/GPT8L8H``: a second run named
  ``GPT8L8H`` in another folder;
* ``sweep-a`` and ``sweep-b``: a PyTorch Lightning CSVLogger folder each, both named
  ``lightning_logs/version_0`` (CSVLogger's layout: ``metrics.csv`` with ``epoch, step,
  train_loss, val_loss`` rows, train and validation on separate rows, and ``hparams.yaml``;
  as ``tests/loaders/logs/test_formats.py`` writes it); sweep-a holds two seeds of one
  geometry, one of them trained for fewer steps and with another lr, and a wider model.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from tests.demo_db import built_once, copy_to, demo_db

REAL_LOGS = Path("/work/shared/realworld/logs")
TB_RUN = REAL_LOGS / "tensorboard" / "add-carryTrue" / "GPT8L8H"

#: Lightning runs: (project, folder under it, hparams, val losses at steps 49, 99[, 149])
LIGHTNING = [
    ("sweep-a", "lightning_logs/version_0",
     {"n_embd": 128, "n_layer": 4, "n_head": 4, "weight_decay": 0.1, "lr": 3e-4, "seed": 1},
     [2.7, 2.2, 2.0]),
    ("sweep-a", "lightning_logs/version_1",
     {"n_embd": 128, "n_layer": 4, "n_head": 4, "weight_decay": 0.1, "lr": 1e-3, "seed": 2},
     [2.9, 2.4]),
    ("sweep-a", "lightning_logs/version_2",
     {"n_embd": 256, "n_layer": 4, "n_head": 4, "weight_decay": 0.1, "lr": 3e-4, "seed": 1},
     [2.5, 2.0, 1.8]),
    ("sweep-b", "lightning_logs/version_0",
     {"n_embd": 128, "n_layer": 4, "n_head": 4, "weight_decay": 0.1, "lr": 3e-4, "seed": 1},
     [3.1, 2.8, 2.6]),
]


def write_lightning(folder: Path, hparams: dict, val: list[float]) -> None:
    """A CSVLogger folder: ``hparams.yaml`` and ``metrics.csv`` (train and val rows apart)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hparams.yaml").write_text("".join(f"{k}: {v}\n" for k, v in hparams.items()))
    lines = ["epoch,step,train_loss,val_loss"]
    for epoch, loss in enumerate(val):
        step = 49 + 50 * epoch
        lines += [f"{epoch},{step},{loss - 0.1},", f"{epoch},{step},,{loss}"]
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")


def build_projects(tmp_path_factory, dest: Path) -> Path:
    """A fresh copy of the database described in the module docstring at ``dest`` (built once per
    test run: ``tests/demo_db.py``); returns ``dest``."""
    def build(path: Path) -> None:
        _build(tmp_path_factory, path)

    return copy_to(built_once(tmp_path_factory, "projects-db", build), dest)


def _build(tmp_path_factory, dest: Path) -> None:
    from loaders.ingest import ingest_paths
    from loaders.store import Store

    demo_db(tmp_path_factory, dest)
    files = dest.parent / "projects-files"
    shutil.copytree(TB_RUN, files / "carry-sweep" / "add-carryFalse" / "GPT8L8H")
    for project, sub, hparams, val in LIGHTNING:
        write_lightning(files / project / sub, hparams, val)
    store = Store(dest)
    for path in (REAL_LOGS / "hf-trainer", REAL_LOGS / "llmc", REAL_LOGS / "tensorboard",
                 files / "carry-sweep", files / "sweep-a", files / "sweep-b"):
        report = ingest_paths(store, [path])
        assert report.count("error") == 0, report.to_json()
