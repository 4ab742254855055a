"""Hugging Face Trainer metrics files: ``all_results.json``,
``train_results.json``, ``eval_results.json`` (``test_`` / ``predict_``
likewise), written by ``Trainer.save_metrics``: one JSON object of a run's
final metrics.

Each metric is one point at the run's final step: the ``global_step`` of the
``trainer_state.json`` beside the file (or of the newest ``checkpoint-N/``
state) when there is one, else step 0 with a note saying the step is
unknown. Names are normalised as the ``hf_trainer`` reader does:
``eval_loss`` -> ``val/loss``, ``eval_accuracy`` -> ``val/accuracy``, other
``eval_*`` keys as logged; ``train_*`` keys (``train_loss`` is the mean over
the run, no point of the curve), ``test_*``, ``predict_*``, ``epoch`` and
``total_flos`` keep their names.

These files join the run of their output dir (``JOINS_RUN``): the run the
``trainer_state.json`` beside them feeds (``loaders.logs.run_identity``),
not a run of their own; the run keeps its format.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from loaders.errors import LogFormatError
from loaders.logs.base import Parsed, RunData, is_text_head, normalise_metric, points_frame
from loaders.logs.readers.hf_trainer import HF_STATE_NAME, hf_run_dir

NAME = "hf_results"
PRIORITY = 31
HELP = ("Hugging Face Trainer metrics files (all_results.json, train_/eval_/test_results.json): "
        "final metrics, joined to the run of the trainer_state.json beside them")
APPENDABLE = False
EXAMPLE = "output/all_results.json"
#: Its points join the run of the folder it sits in, which keeps its format.
JOINS_RUN = True

_FILE = re.compile(r"^(?:all|train|eval|test|predict)_results\.json$")
_PREFIXES = ("train_", "eval_", "test_", "predict_")
_NAMES = {"eval_loss": "val/loss"}


def sniff(path: Path, head: bytes) -> bool:
    if not (_FILE.match(path.name) and is_text_head(head) and head.lstrip().startswith(b"{")):
        return False
    try:
        doc = json.loads(head.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    return _is_metrics(doc)


def _is_metrics(doc) -> bool:
    """An object with a number under a ``train_``/``eval_``/... key."""
    return isinstance(doc, dict) and any(
        str(k).startswith(_PREFIXES) and isinstance(v, (int, float)) and not isinstance(v, bool)
        for k, v in doc.items())


def final_step(path: Path) -> int | None:
    """The ``global_step`` of the trainer state beside ``path`` (its output
    dir's, else its newest ``checkpoint-N/``'s), None when there is none."""
    run_dir = hf_run_dir(path)
    states = [run_dir / HF_STATE_NAME] + sorted(
        run_dir.glob(f"checkpoint-*/{HF_STATE_NAME}"),
        key=lambda p: int(p.parent.name.split("-")[-1]) if p.parent.name.split("-")[-1].isdigit() else -1,
        reverse=True)
    for p in states:
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        step = doc.get("global_step") if isinstance(doc, dict) else None
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            return step
    return None


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise LogFormatError(path, f"expected UTF-8 JSON, found invalid byte at offset {exc.start}") from None
    except ValueError as exc:
        raise LogFormatError(path, f"expected a Trainer metrics file (JSON), found invalid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise LogFormatError(path, f"expected a JSON object of final metrics, found {type(doc).__name__}")
    values = {k: float(v) for k, v in doc.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    skipped = sorted(k for k in doc if k not in values)
    if not values:
        raise LogFormatError(path, f"expected numeric final metrics, found none (keys {sorted(doc)[:10]})")
    step = final_step(path)
    notes = [] if step is not None else [
        f"{path.name}: no {HF_STATE_NAME} beside it gives the final step; its metrics are stored at step 0"]
    names = [k if k.startswith(("train_", "test_", "predict_")) else _NAMES.get(k, normalise_metric(k))
             for k in values]
    pts = points_frame([step or 0] * len(values), names, list(values.values()))
    config = {"metadata_notes": notes} if notes else {}
    report = [f"{len(skipped)} value{'s' * (len(skipped) != 1)} not numbers: {', '.join(skipped[:5])}"] \
        if skipped else []
    return Parsed(runs=[RunData(name=hf_run_dir(path).name, points=pts, config=config)],
                  read_bytes=path.stat().st_size, notes=report)
