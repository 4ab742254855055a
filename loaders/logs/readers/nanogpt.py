"""nanoGPT stdout (karpathy/nanoGPT ``train.py``).

* ``iter N: loss X, time Yms, mfu Z%`` -> ``train/loss`` (the batch loss),
  ``time_ms``, ``mfu`` (percent, -100 until measured);
* ``step N: train loss X, val loss Y`` -> ``eval/train_loss``, ``val/loss``;
* ``saving checkpoint to DIR`` -> ``config["saved_checkpoints"]``.

Each configuration printout (``Overriding config with FILE:`` and the file
echoed, ``name = value``, ``Overriding: name = value``) followed by steps
from 0 starts a new run with its printed hyperparameters in its config; a
step back without a printout is a resume.

A run is named by what its printout overrides on the command line (a grid
script's ``--wandb_run_name=...`` / ``--out_dir=...``, printed as
``Overriding: wandb_run_name = run_lr3e-4``): its ``wandb_run_name``, else
the last part of its ``out_dir`` (``run_name_of``); a name a run of the same
file already has gets ``#N`` (its run number). A run without such an
override is named after the file (``#2``, ``#3``, ... after the first).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pandas as pd

from loaders.logs.base import Parsed, RunData, empty_points, is_text_head, points_frame, steps_went_back
from loaders.logs.readers._text import NUM, head_text, lines_of, literal, read_chunk, to_float

NAME = "nanogpt"
PRIORITY = 62
HELP = "nanoGPT stdout: 'iter N: loss X, time Yms, mfu Z%' and 'step N: train loss X, val loss Y'"
APPENDABLE = True
EXAMPLE = "out-shakespeare-char/train.log"

NANOGPT_ITER = re.compile(rf"^iter (\d+): loss ({NUM}), time ({NUM})ms(?:, mfu ({NUM})%)?")
NANOGPT_EVAL = re.compile(rf"^step (\d+): train loss ({NUM}), val loss ({NUM})")


def sniff(path: Path, head: bytes) -> bool:
    if not is_text_head(head):
        return False
    text = head_text(head)
    return any(NANOGPT_ITER.match(l) or NANOGPT_EVAL.match(l) for l in text.split("\n"))


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    text, used = read_chunk(path, start, complete)
    state = dict(state or {})
    lines = lines_of(text)
    n_lines = len(lines)
    it = lines.str.extract(NANOGPT_ITER).dropna(subset=[0])
    ev = lines.str.extract(NANOGPT_EVAL).dropna(subset=[0])
    # Metric lines in file order: (line, step).
    met_line = np.concatenate([it.index.to_numpy(), ev.index.to_numpy()]).astype("int64")
    met_step = np.concatenate([it[0].astype("int64").to_numpy(), ev[0].astype("int64").to_numpy()])
    order = np.argsort(met_line, kind="stable")
    met_line, met_step = met_line[order], met_step[order]
    # What a configuration printout says, by line.
    facts = _nanogpt_facts(lines)
    is_cfg = np.zeros(n_lines + 1, dtype="int64")
    is_cfg[facts["config_lines"]] = 1
    is_res = np.zeros(n_lines + 1, dtype="int64")
    is_res[facts["resume_lines"]] = 1
    cum_cfg, cum_res = np.cumsum(is_cfg), np.cumsum(is_res)             # (lines + 1,)
    prev_line = np.r_[-1, met_line[:-1]]                                # (metric lines,)
    # A config printout between two metric lines, and a step back at 0 after
    # it, starts a new run; a step back without one is a resume.
    def between(cum, pending):
        before = cum[met_line] - np.where(prev_line >= 0, cum[np.maximum(prev_line, 0)], 0)
        out = before > 0
        if len(out) and pending:
            out[0] = True
        return out
    block = between(cum_cfg, state.get("pending_block", False))
    resume = between(cum_res, state.get("pending_resume", False))
    has_prev = np.r_[state.get("prev_step") is not None, np.ones(max(len(met_line) - 1, 0), bool)]
    new_run = block & (met_step == 0) & has_prev & ~resume
    run_no = state.get("run_index", 1) + np.cumsum(new_run)            # (metric lines,)
    runs = []
    if not len(met_line):
        if state.get("run_index") is None:          # a log with no step yet: its config so far
            config, meta = _nanogpt_block(facts, 0, n_lines, dict(state.get("pending", {})))
            runs.append(RunData(name="", points=empty_points(), config=config, meta=meta))
            state["pending"] = {}
        else:
            state["pending"] = _nanogpt_block(facts, 0, n_lines, dict(state.get("pending", {})))[0]
        state["pending_block"] = state.get("pending_block", False) or bool(cum_cfg[-1])
        state["pending_resume"] = state.get("pending_resume", False) or bool(cum_res[-1])
        return Parsed(runs=runs, read_bytes=start + used, state=state)
    frames = []
    if len(it):
        step = it[0].astype("int64").to_numpy()
        for col, metric in ((1, "train/loss"), (2, "time_ms"), (3, "mfu")):
            vals = it[col]
            ok = vals.notna().to_numpy()
            frames.append(pd.DataFrame({"line": it.index.to_numpy()[ok], "order": it.index.to_numpy()[ok] * 4 + col,
                                        "step": step[ok], "metric": metric,
                                        "value": to_float(vals[ok])}))
    if len(ev):
        step = ev[0].astype("int64").to_numpy()
        for col, metric in ((1, "eval/train_loss"), (2, "val/loss")):
            frames.append(pd.DataFrame({"line": ev.index.to_numpy(), "order": ev.index.to_numpy() * 4 + col,
                                        "step": step, "metric": metric, "value": to_float(ev[col])}))
    df = pd.concat(frames, ignore_index=True).sort_values("order", kind="stable")
    df["run"] = run_no[np.searchsorted(met_line, df["line"].to_numpy())]
    eval_idx = ev.index.to_numpy()
    eval_steps = ev[0].astype("int64").to_numpy() if len(ev) else np.array([], "int64")
    first_of = {}
    for i, r in enumerate(run_no):
        first_of.setdefault(int(r), i)
    run_ids = list(first_of)
    names_used = set(state.get("run_names", []))
    for k, r in enumerate(run_ids):
        i = first_of[r]
        lo = int(prev_line[i]) + 1                    # the printout before the run's first step
        pending = dict(state.get("pending", {})) if i == 0 else {}
        config, meta = _nanogpt_block(facts, lo, int(met_line[i]), pending)
        continuing = i == 0 and not new_run[0] and state.get("prev_step") is not None
        tpi = config.get("tokens_per_iter") or (state.get("tokens_per_iter") if continuing else None)
        # Checkpoint saves up to the next run's printout follow this run's evals.
        hi = int(prev_line[first_of[run_ids[k + 1]]]) + 1 if k + 1 < len(run_ids) else n_lines
        saves = [(ln, d) for ln, d in facts["saves"] if lo <= ln < hi]
        if saves:
            saved = []
            for ln, d in saves:
                prior = eval_steps[(eval_idx < ln) & (eval_idx >= lo)]
                saved.append({"step": int(prior[-1]) if len(prior) else
                              (state.get("last_eval_step") if continuing else None), "dir": d})
            config["saved_checkpoints"] = saved
        label = run_name_of(facts, lo, int(met_line[i]))
        if continuing:
            name = state.get("run_name", "")
        elif label:
            name = label if label not in names_used else f"{label}#{r}"
        else:
            name = "" if r == 1 else f"#{r}"
        names_used.add(name)
        sel = df[df["run"] == r]
        tok = sel["step"].to_numpy() * tpi if tpi else None
        pts = points_frame(sel["step"].to_numpy(), sel["metric"].to_numpy(), sel["value"].to_numpy(),
                           tokens=tok)
        resumed_flag = bool(resume[i:][run_no[i:] == r].any()) or bool(meta.get("resumed_from_checkpoint"))
        if resumed_flag:
            meta["resumed_from_checkpoint"] = True
        runs.append(RunData(name=name, points=pts, config=config, meta=meta,
                            resumed=steps_went_back(pts) or resumed_flag))
        state["run_name"] = name
        state["tokens_per_iter"] = tpi
    last = int(met_line[-1])
    # A printout after the last step belongs to the next run (read on the next append).
    state["pending"] = _nanogpt_block(facts, last + 1, n_lines, {})[0]
    state["pending_block"] = bool(cum_cfg[-1] - cum_cfg[last])
    state["pending_resume"] = bool(cum_res[-1] - cum_res[last])
    state["run_index"] = int(run_no[-1])
    state["run_names"] = sorted(names_used)
    state["prev_step"] = int(met_step[-1])
    if len(ev):
        state["last_eval_step"] = int(ev[0].iloc[-1])
    return Parsed(runs=runs, read_bytes=start + used, state=state)


_NANOGPT_ASSIGN = re.compile(r"^[A-Za-z_]\w*\s*=[^=]")
_NANOGPT_OVERRIDE = re.compile(r"^Overriding: (\w+) = (.+)$")


def _nanogpt_facts(lines: pd.Series) -> dict:
    """Lines of a nanoGPT stdout that describe a run, by line number.

    ``config_lines``: the configuration printout (a config file echoed after
    ``Overriding config with FILE:``, its ``name = value`` lines, and
    ``Overriding: name = value``); ``assign``: (line, name, value) of both
    kinds, read with ``ast.literal_eval`` (nothing is executed); and the
    parameter count, tokens per iteration, checkpoint saves and resumes.
    """
    assign_mask = lines.str.match(_NANOGPT_ASSIGN).fillna(False).to_numpy()
    over = lines.str.extract(_NANOGPT_OVERRIDE).dropna()
    header = lines.str.startswith("Overriding config with").fillna(False).to_numpy()
    assign = []
    for ln in np.flatnonzero(assign_mask):
        kv = _assignment(lines.iat[ln])
        if kv is not None:
            assign.append((int(ln), *kv))
    assign += [(int(ln), k, _literal(v)) for ln, k, v in zip(over.index, over[0], over[1])]
    overrides = [(int(ln), k, str(v).strip()) for ln, k, v in zip(over.index, over[0], over[1])]
    assign.sort(key=lambda t: t[0])
    n_params = lines.str.extract(r"^number of parameters: ([\d.]+)M").dropna()
    tpi = lines.str.extract(r"^tokens per iteration will be: ([\d,]+)").dropna()
    saves = lines.str.extract(r"^saving checkpoint to (.+)$").dropna()
    cfg_lines = sorted({t[0] for t in assign} | set(np.flatnonzero(header).tolist()))
    return {
        "config_lines": np.asarray(cfg_lines, dtype="int64"),
        "resume_lines": np.flatnonzero(lines.str.startswith("Resuming training from").fillna(False).to_numpy()),
        "assign": assign,
        "n_params": [(int(ln), int(round(float(v) * 1e6))) for ln, v in zip(n_params.index, n_params[0])],
        "tpi": [(int(ln), int(v.replace(",", ""))) for ln, v in zip(tpi.index, tpi[0])],
        "saves": [(int(ln), v.strip()) for ln, v in zip(saves.index, saves[0])],
        "overrides": overrides,
    }


#: Overrides that name a run, first found wins (``run_name_of``).
_NAMING_OVERRIDES = ("wandb_run_name", "out_dir")


def run_name_of(facts: dict, lo: int, hi: int) -> str:
    """The run's name from its printout's ``Overriding:`` lines on lines ``lo``
    to ``hi`` (excluded): ``wandb_run_name``, else the last part of ``out_dir``
    (the last override of each counts); ``""`` when neither is overridden."""
    got = {k: v for ln, k, v in facts["overrides"] if lo <= ln < hi and k in _NAMING_OVERRIDES}
    for key in _NAMING_OVERRIDES:
        value = str(_literal(got[key])).strip() if key in got else ""
        if key == "out_dir":
            value = value.rstrip("/").rsplit("/", 1)[-1]
        if value:
            return value
    return ""


def _nanogpt_block(facts: dict, lo: int, hi: int, config: dict) -> tuple[dict, dict]:
    """(config, meta) stated on lines ``lo`` to ``hi`` (excluded), over ``config``."""
    meta: dict = {}
    for ln, k, v in facts["assign"]:
        if lo <= ln < hi:
            config[k] = v
    for ln, n in facts["n_params"]:
        if lo <= ln < hi:
            meta["model_size"] = n
    for ln, n in facts["tpi"]:
        if lo <= ln < hi:
            config["tokens_per_iter"] = n
    return config, meta


def _assignment(line: str) -> tuple[str, object] | None:
    """(name, value) of a ``name = <literal>  # comment`` line, else None
    (also for a line over 1,000 characters: no config line is that long)."""
    if len(line) > 1000:
        return None
    try:
        tree = ast.parse(line.strip())
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assign):
        return None
    node = tree.body[0]
    if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
        return None
    try:
        return node.targets[0].id, ast.literal_eval(node.value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _literal(text: str):
    """The literal ``text`` spells, else ``text`` itself (an unquoted string)."""
    text = text.strip()
    value = literal(text)
    return value if value is not None or text == "None" else text
