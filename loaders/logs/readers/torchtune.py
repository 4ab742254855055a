"""torchtune's ``DiskLogger`` files (``<output_dir>/logs/log_<unix time>.txt``)
and ``StdoutLogger`` output (``torchtune/training/metric_logging.py``). A
``log_<time>.txt`` run is named after its output dir.

Each ``log_dict`` call writes one line, ``Step 1 | loss:10.37 lr:2e-05
tokens_per_second_per_gpu:1234.5 `` (``log`` writes one ``name:value`` per
line): ``loss`` -> ``train/loss``, ``lr``, every other name as logged
(``tokens_per_second_per_gpu``, ``peak_memory_alloc``, ``grad_norm``, ...),
at the line's step. A value written from a tensor (``loss:tensor(10.37,
device='cuda:0')``) is its number. Values that are no number (``lr:None``)
are counted on the file's report line; a file with no number at all is an
error.

The logger writes no configuration; the ``torchtune_config.yaml`` torchtune
saves in the output dir (the log's folder or the one above ``logs/``) is read
for the run's hyperparameters (``optimizer.lr``, ``optimizer.weight_decay``,
``seed``), within the YAML budgets of ``loaders.budgets``.
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import yaml

from loaders.budgets import BudgetExceeded, load_yaml
from loaders.logs.base import Parsed, RunData, is_text_head, points_frame, steps_went_back
from loaders.logs.readers._text import head_text, lines_of, no_points_error, read_chunk

NAME = "torchtune"
PRIORITY = 68
HELP = "torchtune DiskLogger / StdoutLogger: 'Step N | loss:X lr:Y tokens_per_second_per_gpu:Z'"
APPENDABLE = True
EXAMPLE = "lora_finetune_output/logs/log_1727452384.txt"

_LINE = re.compile(r"^Step (\d+) \| (\w+:.*)$")
_PAIR = re.compile(r"(\w+):(tensor\([^)]*\)|\S+)")
_TENSOR = re.compile(r"^tensor\(\s*([^,)\s]+)")
_DISK_NAME = re.compile(r"^log_\d+\.txt$")
_NAMES = {"loss": "train/loss"}
_CONFIG_NAME = "torchtune_config.yaml"


def sniff(path: Path, head: bytes) -> bool:
    if not is_text_head(head):
        return False
    lines = [l for l in head_text(head).split("\n")[:400] if l.strip()]
    hits = sum(bool(_LINE.match(l)) for l in lines)
    return hits > 0 and (bool(_DISK_NAME.match(path.name)) or hits * 5 >= len(lines))


def _number(raw: str) -> float | None:
    m = _TENSOR.match(raw)
    try:
        return float(m.group(1) if m else raw)
    except ValueError:
        return None


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    text, used = read_chunk(path, start, complete)
    lines = lines_of(text)
    m = lines.str.extract(_LINE).dropna()
    rows, bad, odd = [], [], []          # odd: (line, "name:value") of values that are no number
    for ln, step, body in zip(m.index, m[0], m[1]):
        raw = _PAIR.findall(body)
        pairs = [(k, _number(v)) for k, v in raw]
        if not any(v is not None for _, v in pairs):
            bad.append(int(ln))
        odd += [(int(ln), f"{k}:{v}") for (k, v), (_, x) in zip(raw, pairs) if x is None]
        rows += [(int(step), _NAMES.get(k, k), v) for k, v in pairs if v is not None]
    notes = []
    if bad and not rows:
        raise no_points_error(path, "torchtune 'Step N | name:value ...' lines with numbers", len(bad),
                              lines.iat[bad[0]], bad[0] if start == 0 else None)
    if odd:
        where = f"line {odd[0][0] + 1} " if start == 0 else ""
        notes.append(f"{len(odd)} value{'s' * (len(odd) != 1)} not numbers, not read (first: {where}"
                     f"{odd[0][1][:80]!r})")
    config = _saved_config(path) if start == 0 else {}
    name = _run_name(path)
    if not rows:
        runs = [RunData(name=name, points=points_frame([], [], []), config=config)] if start == 0 else []
        return Parsed(runs=runs, read_bytes=start + used, state=dict(state or {}), notes=notes)
    df = pd.DataFrame(rows, columns=["step", "metric", "value"])
    pts = points_frame(df["step"].to_numpy(), df["metric"].to_numpy(), df["value"].to_numpy())
    return Parsed(runs=[RunData(name=name, points=pts, config=config, resumed=steps_went_back(pts))],
                  read_bytes=start + used, state=dict(state or {}), notes=notes)


def _run_name(path: Path) -> str:
    """A DiskLogger file's name says only when it was opened: the run is named
    after its output dir (the folder above ``logs/``); "" for other names
    (the file or folder then names the run)."""
    if not _DISK_NAME.match(path.name):
        return ""
    return path.parent.parent.name if path.parent.name == "logs" else path.parent.name


def _saved_config(path: Path) -> dict:
    """The recipe config torchtune saved beside the log (or above ``logs/``), as ``{"torchtune_config": ...}``."""
    for folder in (path.parent, path.parent.parent):
        cfg = folder / _CONFIG_NAME
        if cfg.is_file():
            try:
                doc = load_yaml(cfg)
            except (BudgetExceeded, OSError, UnicodeDecodeError, ValueError, yaml.YAMLError):
                return {}       # unreadable or over a budget: not used
            return {"torchtune_config": doc, "torchtune_config_file": str(cfg)} if isinstance(doc, dict) else {}
    return {}
