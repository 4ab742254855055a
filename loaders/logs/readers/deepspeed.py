"""DeepSpeed stdout: the engine's ``log_dist`` progress lines
(``deepspeed/runtime/engine.py`` ``_report_progress``, every
``steps_per_print`` steps) and its throughput timer.

* ``[YYYY-MM-DD hh:mm:ss,mmm] [INFO] [logging.py:96:log_dist] [Rank 0]
  step=10, skipped=0, lr=[0.00015, 0.00015], mom=[(0.9, 0.95), (0.9, 0.95)]``
  -> ``lr`` (the first parameter group's; other groups' differing values as
  ``lr/group1``, ...), ``momentum`` (the first group's beta1 / momentum),
  ``skipped_steps``; any other ``key=number`` on the line under its name, a
  ``loss=`` (printed by some training scripts through ``log_dist``) as
  ``train/loss``;
* ``epoch=0/micro_step=100/global_step=100, RunningAvgSamplesPerSec=..,
  CurrSamplesPerSec=.., MemAllocated=..GB, MaxMemAllocated=..GB`` ->
  ``running_avg_samples_per_sec``, ``curr_samples_per_sec``,
  ``mem_allocated_gb``, ``max_mem_allocated_gb`` at its global step.

Only the lowest rank's lines are read (``log_dist`` prints rank 0's unless
told otherwise). Hyperparameters come from the engine's printed
configuration (``DeepSpeedEngine configuration:`` then ``  optimizer_params
..... {'lr': 0.0001, 'weight_decay': 0.1}``, read as literals) and the user
config it echoes after ``json = {`` (its ``optimizer.params``). A terminal
that wrapped a word of the throughput line (``MemA          llocated``) is
undone. A progress line whose values do not parse is counted on the
file's report line.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from loaders.logs.base import Parsed, RunData, is_text_head, points_frame, steps_went_back
from loaders.logs.readers._text import (head_text, lines_of, literal, no_points_error, read_chunk,
                                        scalar_config, unread_note)

NAME = "deepspeed"
PRIORITY = 66
HELP = ("DeepSpeed stdout: log_dist '[Rank 0] step=N, skipped=K, lr=[...], mom=[...]' lines and the "
        "throughput timer's 'global_step=N, RunningAvgSamplesPerSec=...'")
APPENDABLE = True
EXAMPLE = "ds_train.log"

_STEP_LINE = re.compile(r"\[Rank (\d+)\] (step=\d+,.*)$")
_THROUGHPUT = re.compile(r"epoch=\d+/micro_step=\d+/global_step=(\d+), (RunningAvgSamplesPerSec=.*)$")
#: ``key=value`` pairs of a progress line: values are numbers, lists or tuples.
_PAIR = re.compile(r"(\w+)=(\[[^\]]*\]|\([^)]*\)|[^,\s]+)")
_CONFIG_LINE = re.compile(r"^\s*(?:\[[^\]]*\]\s*)*\s+(\w+) \.{3,} (.*?)\s*$")
#: A word a terminal wrapped (``MemA          llocated``): its parts run together again.
_UNWRAP = re.compile(r"(\w) {2,}(\w)")
_OPT_KEYS = ("lr", "weight_decay", "betas", "eps", "momentum")
_NAMES = {"mom": "momentum", "skipped": "skipped_steps", "loss": "train/loss"}
_TP_NAMES = {"RunningAvgSamplesPerSec": "running_avg_samples_per_sec", "CurrSamplesPerSec": "curr_samples_per_sec",
             "MemAllocated": "mem_allocated_gb", "MaxMemAllocated": "max_mem_allocated_gb"}


def sniff(path: Path, head: bytes) -> bool:
    if not is_text_head(head):
        return False
    text = head_text(head)
    return any(_STEP_LINE.search(l) and "skipped=" in l for l in text.split("\n")) or \
        any(_THROUGHPUT.search(l) for l in text.split("\n"))


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    text, used = read_chunk(path, start, complete)
    state = dict(state or {})
    lines = lines_of(text)
    prog = lines.str.extract(_STEP_LINE).dropna()
    if len(prog):
        rank = state.setdefault("rank", int(prog[0].astype("int64").min()))
        prog = prog[prog[0].astype("int64") == rank]
    rows, bad = [], []
    for ln, body in prog[1].items():
        got = _progress(body)
        if got is None:
            bad.append(int(ln))
        else:
            rows += [(int(ln), got[0], k, v) for k, v in got[1]]
    tp = lines.str.extract(_THROUGHPUT).dropna()
    for ln, step, body in zip(tp.index, tp[0], tp[1]):
        body = _UNWRAP.sub(r"\1\2", body)
        pairs = [(_TP_NAMES.get(k, k), _value(v.removesuffix("GB"))) for k, v in _PAIR.findall(body)]
        pairs = [(k, v) for k, v in pairs if v is not None]
        if pairs:
            rows += [(int(ln), int(step), k, v) for k, v in pairs]
        else:
            bad.append(int(ln))
    where = 0 if start == 0 else None
    notes = []
    if bad:
        bad.sort()
        first = lines.iat[bad[0]]
        if not rows:
            raise no_points_error(path, "DeepSpeed progress lines ('[Rank 0] step=N, skipped=K, lr=[...]')",
                                  len(bad), first, bad[0] if where is not None else None)
        notes.append(unread_note(len(bad), "DeepSpeed progress", first, bad[0] if where is not None else None))
    config = _engine_config(lines) if start == 0 else {}
    if not rows:
        runs = [RunData(name="", points=points_frame([], [], []), config=config)] if start == 0 else []
        return Parsed(runs=runs, read_bytes=start + used, state=state, notes=notes)
    df = pd.DataFrame(rows, columns=["line", "step", "metric", "value"]).sort_values("line", kind="stable")
    pts = points_frame(df["step"].to_numpy(), df["metric"].to_numpy(), df["value"].to_numpy())
    return Parsed(runs=[RunData(name="", points=pts, config=config, resumed=steps_went_back(pts))],
                  read_bytes=start + used, state=state, notes=notes)


def _value(text: str):
    """A number, or the first number of a printed list/tuple (of lists/tuples); None otherwise."""
    v = literal(text)
    while isinstance(v, (list, tuple)) and v:
        v = v[0]
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _progress(body: str) -> tuple[int, list[tuple[str, float]]] | None:
    """(step, [(metric, value)]) of a ``step=N, skipped=K, lr=[...], mom=[...]`` line, None if unreadable."""
    pairs = dict(_PAIR.findall(body))
    try:
        step = int(pairs.pop("step"))
    except (KeyError, ValueError):
        return None
    out = []
    for key, raw in pairs.items():
        if key == "lr":
            lrs = literal(raw)
            lrs = lrs if isinstance(lrs, (list, tuple)) else [lrs]
            nums = [float(x) for x in lrs if isinstance(x, (int, float)) and not isinstance(x, bool)]
            if not nums:
                return None
            out.append(("lr", nums[0]))
            out += [(f"lr/group{i}", x) for i, x in enumerate(nums) if i and x != nums[0]]
            continue
        v = _value(raw)
        if v is None:
            return None
        out.append((_NAMES.get(key, key), v))
    return step, out


def _engine_config(lines: pd.Series) -> dict:
    """What the engine's printed configuration says of the optimiser and seed:
    its ``key ..... value`` lines, and the user config it echoes (``json = {``)."""
    cfg: dict = {}
    echo = lines.index[lines.str.contains(r"\bjson = \{$", regex=True)]
    if len(echo):
        block = ["{"]
        for line in lines.iloc[int(echo[0]) + 1:int(echo[0]) + 2000]:
            block.append(line)
            if line == "}":
                break
        try:
            user = json.loads("\n".join(block))
        except ValueError:
            user = None
        params = user.get("optimizer", {}).get("params") if isinstance(user, dict) else None
        if isinstance(params, dict):
            cfg.update(scalar_config({k: v for k, v in params.items() if k in _OPT_KEYS}))
        if isinstance(user, dict) and isinstance(user.get("optimizer"), dict):
            cfg["optimizer_name"] = user["optimizer"].get("type")
    starts = lines.index[lines.str.contains("DeepSpeedEngine configuration:", regex=False)]
    if not len(starts):
        return cfg
    for line in lines.iloc[int(starts[0]) + 1:int(starts[0]) + 400]:
        m = _CONFIG_LINE.match(line)
        if not m:
            if cfg:
                break
            continue
        key, raw = m.group(1), m.group(2)
        if key == "optimizer_params":
            params = literal(raw)
            if isinstance(params, dict):
                cfg.update(scalar_config({k: v for k, v in params.items() if k in _OPT_KEYS}))
        elif key in ("optimizer_name", "seed", "train_batch_size", "train_micro_batch_size_per_gpu",
                     "gradient_accumulation_steps", "steps_per_print", "zero_optimization_stage"):
            v = literal(raw)
            cfg[key] = v if v is not None else raw
    return cfg
