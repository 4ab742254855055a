"""modded-nanogpt logs (KellerJordan/modded-nanogpt): the training script's
code, then ``step:N/M val_loss:X train_loss:X train_time:Yms step_avg:Zms``.

-> ``val/loss``, ``train/loss``, wall_time (seconds from ``train_time``),
``step_avg_ms``. The code header that starts each run is skipped (read only
for metadata, ``loaders.logs.codeheader``: parsed, never run); each
``step:0/M`` starts a new run; runs without their own header (trials of one
process) inherit the last one.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pandas as pd

from loaders.logs.base import Parsed, RunData, is_text_head, points_frame, steps_went_back
from loaders.logs.codeheader import header_hyperparameters
from loaders.logs.readers._text import KV, head_text, lines_of, read_chunk, to_float

NAME = "modded_nanogpt"
PRIORITY = 61
HELP = ("modded-nanogpt log: code header, then 'step:N/M val_loss:X train_time:Yms step_avg:Zms'; "
        "each step:0/M starts a new run")
APPENDABLE = True
EXAMPLE = "logs/0f8a7c6e-2b1d-4c5e-9a3f-1d2e3f4a5b6c.txt"

MODDED_STEP = re.compile(r"^step:(\d+)/(\d+)\b")
_MODDED_CODE_HINT = re.compile(r"step:\{[^}]*\}/\{")
_MODDED_NAMES = {"val_loss": "val/loss", "train_loss": "train/loss", "step_avg": "step_avg_ms"}
_CODE_LINE = re.compile(r"^(?:import \w|from [\w.]+ import )", re.MULTILINE)


def header_metadata(header: str) -> dict:
    """Hyperparameters the script in a modded-nanogpt code header used
    (``loaders.logs.codeheader.header_hyperparameters``: its top-level
    assignments and optimizer calls, never a signature default); {} for text
    that holds no code (the lines between two runs of one process)."""
    if not _CODE_LINE.search(header):
        return {}
    return header_hyperparameters(header)


def sniff(path: Path, head: bytes) -> bool:
    if path.suffix == ".py" or not is_text_head(head):
        return False
    text = head_text(head)
    if any(MODDED_STEP.match(l) for l in text.split("\n")):
        return True
    # A long code header can fill the first 64 KB; its print format gives it away.
    return bool(_MODDED_CODE_HINT.search(text)) and "val_loss" in text and \
        not text.lstrip().startswith(("#!", '"""'))


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    text, used = read_chunk(path, start, complete)
    state = dict(state or {"run_index": 0, "prev_step": None})
    lines = lines_of(text)
    m = lines.str.extract(r"^step:(\d+)/(\d+)\s*(.*)$").dropna(subset=[0])
    if not len(m):
        # Only code/banner so far: consume nothing, the header is re-read with its run.
        return Parsed(runs=[], read_bytes=start, state=state)
    step = m[0].astype("int64").to_numpy()
    total = m[1].astype("int64").to_numpy()
    prev = np.concatenate([[state["prev_step"] if state["prev_step"] is not None else -1], step[:-1]])
    new_run = (step == 0) & (prev != 0)
    run_no = state["run_index"] + np.cumsum(new_run)
    if state["run_index"] == 0 and not new_run[0]:
        run_no = run_no + 1  # file starts mid-run (no step:0 line): still run 1
    line_idx = m.index.to_numpy()
    pairs = m[2].str.extractall(KV)
    pairs.index = pairs.index.set_names(["line", "match"])
    line_of = pairs.index.get_level_values("line").to_numpy()
    pos = pd.Index(line_idx).get_indexer(line_of)
    key = pairs[0].to_numpy()
    raw = pairs[1].str.replace(r"(ms|s)$", "", regex=True)
    val = to_float(raw)
    unit_s = pairs[1].str.endswith("ms").to_numpy()
    wall_line = np.full(len(line_idx), np.nan)
    is_time = key == "train_time"
    wall_line[pos[is_time]] = np.where(unit_s[is_time], val[is_time] / 1000.0, val[is_time])
    keep = ~is_time
    metric = pd.Series(key[keep]).map(lambda k: _MODDED_NAMES.get(k, k)).to_numpy()
    pts_all = pd.DataFrame({"run": run_no[pos[keep]], "step": step[pos[keep]], "metric": metric,
                            "value": val[keep], "wall_time": wall_line[pos[keep]]})
    runs = []
    all_lines = lines.to_numpy()
    # Runs of one process (a loop over trials) share the code header printed
    # once before the first: a run without its own header inherits the last one.
    inherited = dict(state.get("header_config") or {})
    for r in pd.unique(run_no):
        sel = run_no == r
        first_line = int(line_idx[sel][0])
        prev_end = int(line_idx[:np.argmax(sel)][-1]) + 1 if np.argmax(sel) > 0 else 0
        header = "\n".join(all_lines[prev_end:first_line])
        config = header_metadata(header) if header.strip() else {}
        if config or _CODE_LINE.search(header):
            config["code_sha256"] = hashlib.sha256(header.encode()).hexdigest()
            config["code_header_of"] = f"#{int(r)}"
            inherited = dict(config)
        elif inherited and (new_run[sel].any() or state["run_index"] == 0):
            config = dict(inherited)          # names the run whose header it is
        config["total_steps"] = int(total[sel][0])
        p = pts_all[pts_all["run"] == r].drop(columns="run")
        pts = points_frame(p["step"], p["metric"].to_numpy(), p["value"], p["wall_time"])
        meta = {k: config[k] for k in ("weight_decay", "lr", "seed", "n_kv_heads", "variant")
                if k in config}
        runs.append(RunData(name=f"#{int(r)}", points=pts, config=config, meta=meta,
                            resumed=steps_went_back(pts)))
    state["run_index"] = int(run_no[-1])
    state["prev_step"] = int(step[-1])
    state["header_config"] = {k: v for k, v in inherited.items() if k != "total_steps"}
    # Consume up to the last step line: a following header is re-read with its run.
    last = int(line_idx[-1])
    consumed = sum(len(s.encode("utf-8")) + 1 for s in all_lines[:last + 1])
    return Parsed(runs=runs, read_bytes=start + min(consumed, used), state=state)
