"""Megatron-LM stdout (NVIDIA/Megatron-LM ``training.py``, also
Megatron-DeepSpeed and NeMo's Megatron core): its ``training_log`` and
``evaluate_and_print_results`` lines.

* `` iteration      100/  500000 | consumed samples: 3200 | elapsed time per
  iteration (ms): 438.3 | learning rate: 1.500E-04 | global batch size: 32 |
  lm loss: 6.7E+00 | loss scale: 1.0 | grad norm: 1.095 | ...`` ->
  ``train/loss`` (``lm loss``), ``lr``, ``grad_norm`` and every other
  ``key: number`` field under its name in snake case (``consumed_samples``,
  ``elapsed_time_per_iteration_ms``, ``global_batch_size``, ...);
  ``consumed tokens`` (Megatron-DeepSpeed) is the points' token count;
* `` validation loss at iteration 1000 [on validation set] | lm loss value:
  7.2E+00 | lm loss PPL: 1.3E+03 |`` -> ``val/loss``, ``val/ppl`` (other
  ``X value`` fields -> ``val/X``); ``on test set`` -> ``test/loss``,
  ``test/ppl``; the closing ``validation loss at the end of training for val
  data`` is at the last iteration logged.

A line may carry a prefix (``[YYYY-MM-DD hh:mm:ss]``, ``[default0]:``, a
rank). Hyperparameters come from the arguments block Megatron prints first
(``------------------------ arguments ------------------------``, then
``  lr ........................ 0.00015``, read as literals, nothing run):
``lr``, ``weight_decay``, ``seed``, and the model's ``num_layers``,
``hidden_size``, ``num_attention_heads``, ``num_query_groups`` kept in the
config; the model size is the sum of the "number of parameters on (tensor,
pipeline) model parallel rank (t, p): N" lines, one per rank pair. An
iteration or validation line whose fields give no number is counted on the
file's report line, as is a line cut short (Megatron ends each line with
``|``; a line without it may end in a cut number).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from loaders.logs.base import Parsed, RunData, is_text_head, points_frame, steps_went_back
from loaders.logs.readers._text import (NUM, head_text, lines_of, literal, no_points_error, read_chunk,
                                        to_float, unread_note)

NAME = "megatron"
PRIORITY = 63
HELP = ("Megatron-LM stdout: ' iteration N/M | ... | learning rate: X | lm loss: Y | ...' and "
        "'validation loss at iteration N | lm loss value: X | lm loss PPL: Y'")
APPENDABLE = True
EXAMPLE = "megatron-gpt/logs/train.log"

_ITER = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
_VALID = re.compile(r"\bvalidation loss at (?:iteration (\d+)|the end of training)(.*?)\|(.*)$")
_LOOKS = re.compile(r"\biteration\s+\d+\s*/\s*\d+|\bvalidation loss at ")
_ARGS_HEADER = re.compile(r"^-+ arguments -+$", re.MULTILINE)
_ARG = re.compile(r"^\s*([A-Za-z_]\w*) \.{2,} (.*?)\s*$")
#: A ``key: number |`` field of a line (after the ``|`` that ends the one before).
_FIELD = re.compile(rf"(?:^|\|)\s*([^:|]+?)\s*:\s*({NUM})\s*(?=\|)")
_NAMES = {"lm_loss": "train/loss", "learning_rate": "lr"}
_NPARAMS = re.compile(r"number of parameters on \(tensor, pipeline\) model parallel rank \((\d+), (\d+)\): (\d+)")
#: Arguments kept in the run's config (the model's shape and the optimiser's settings).
_KEEP = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "group_query_attention",
         "ffn_hidden_size", "seq_length", "max_position_embeddings", "lr", "min_lr", "weight_decay", "seed",
         "clip_grad", "adam_beta1", "adam_beta2", "lr_decay_style", "lr_warmup_iters", "train_iters",
         "global_batch_size", "micro_batch_size", "tensor_model_parallel_size",
         "pipeline_model_parallel_size", "optimizer", "bf16", "fp16", "save", "load", "wandb_exp_name")


def sniff(path: Path, head: bytes) -> bool:
    if not is_text_head(head):
        return False
    text = head_text(head)
    return bool(_ARGS_HEADER.search(text) and "end of arguments" in text) or any(
        _ITER.search(l) and "|" in l and ("loss" in l or "learning rate" in l) for l in text.split("\n"))


def _snake(key: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", key.strip().lower()).strip("_")


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    text, used = read_chunk(path, start, complete)
    state = dict(state or {})
    lines = lines_of(text)
    # Megatron ends each line with " |": one without it was cut short (its last
    # number may be cut too), and is not read.
    whole = lines.str.rstrip().str.endswith("|")
    it = lines.str.extract(_ITER).dropna(subset=[0])
    va = lines.str.extract(_VALID)
    va = va[va[2].notna()]
    cut = sorted(set(it.index[~whole[it.index]]) | set(va.index[~whole[va.index]]))
    it_all = it
    it, va = it[whole[it.index]], va[whole[va.index]]
    frames, bad = [], list(cut)
    if len(it):
        fields = _fields(it[2])
        line_of = fields.index.to_numpy()
        key = _renamed(fields[0], _snake)
        frames.append(pd.DataFrame({"line": line_of, "step": it[0].astype("int64").reindex(line_of).to_numpy(),
                                    "key": key.to_numpy(), "value": to_float(fields[1])}))
        bad += sorted(set(it.index) - set(line_of))
    last_iter = state.get("last_iteration", 0)
    if len(va):
        fields = _fields(va[2])
        line_of = fields.index.to_numpy()
        where = va[1].reindex(line_of).fillna("").to_numpy()
        split = np.where(pd.Series(where).str.contains("test").to_numpy(), "test", "val")
        # The closing validation (no iteration) is at the last iteration logged before it.
        it_lines = it_all.index.to_numpy()
        it_steps = it_all[0].astype("int64").to_numpy()
        prev = np.searchsorted(it_lines, line_of) - 1
        fallback = np.where(prev >= 0, it_steps[np.maximum(prev, 0)], last_iter)
        own = pd.to_numeric(va[0].reindex(line_of), errors="coerce").to_numpy()
        step = np.where(np.isnan(own), fallback, own).astype("int64")
        names = fields[0].str.replace(r"^lm loss (value|PPL)$", lambda m: "loss" if m.group(1) == "value" else "ppl",
                                      regex=True).str.replace(r"\s+value$", "", regex=True)
        names = _renamed(names, _snake)
        frames.append(pd.DataFrame({"line": line_of, "step": step,
                                    "key": [f"{s}/{n}" for s, n in zip(split, names)],
                                    "value": to_float(fields[1])}))
        bad += sorted(set(va.index) - set(line_of))
    looks = lines.str.contains(_LOOKS).to_numpy()
    bad = sorted(set(bad) | (set(np.flatnonzero(looks)) - set(it_all.index) - set(va.index) - set(cut)))
    where = None if start else 0
    notes = []
    if bad:
        first = lines.iat[bad[0]]
        ln = bad[0] if where is not None else None
        if not frames or all(f.empty for f in frames):
            raise no_points_error(path, "Megatron iteration lines (' iteration N/M | ... | lm loss: X |')",
                                  len(bad), first, ln)
        notes.append(unread_note(len(bad), "Megatron iteration/validation", first, ln))
    config, meta = _arguments(lines, text) if start == 0 else ({}, {})
    if not frames:
        runs = [RunData(name="", points=points_frame([], [], []), config=config, meta=meta)] if start == 0 else []
        return Parsed(runs=runs, read_bytes=start + used, state=state, notes=notes)
    df = pd.concat(frames, ignore_index=True).sort_values("line", kind="stable")
    tok_rows = df["key"] == "consumed_tokens"
    tokens = df[tok_rows].drop_duplicates("line").set_index("line")["value"]
    df = df[~tok_rows]
    tok = tokens.reindex(df["line"]).to_numpy() if len(tokens) else None
    pts = points_frame(df["step"].to_numpy(), _renamed(df["key"], lambda k: _NAMES.get(k, k)).to_numpy(),
                       df["value"].to_numpy(),
                       tokens=None if tok is None else pd.array(np.where(np.isnan(tok), None, tok), dtype="Int64"))
    if len(it_all):
        state["last_iteration"] = int(it_all[0].astype("int64").iat[-1])
    return Parsed(runs=[RunData(name="", points=pts, config=config, meta=meta, resumed=steps_went_back(pts))],
                  read_bytes=start + used, state=state, notes=notes)


def _renamed(keys: pd.Series, rename) -> pd.Series:
    """``keys`` renamed, ``rename`` called once per distinct key (a log repeats a few)."""
    return keys.map({k: rename(k) for k in keys.unique()})


def _fields(bodies: pd.Series) -> pd.DataFrame:
    """(key, number) of every ``key: number |`` field, indexed by line (one vectorised pass)."""
    got = bodies.str.extractall(_FIELD)
    got.index = got.index.get_level_values(0)
    return got


def _arguments(lines: pd.Series, text: str) -> tuple[dict, dict]:
    """(config, meta) from the printed arguments block and parameter counts."""
    config: dict = {}
    starts = lines.index[lines.str.match(r"^-+ arguments -+$")]
    if len(starts):
        for line in lines.iloc[int(starts[0]) + 1:int(starts[0]) + 2000]:
            if "end of arguments" in line:
                break
            m = _ARG.match(line)
            if m and m.group(1) in _KEEP:
                v = literal(m.group(2))
                config[m.group(1)] = v if v is not None or m.group(2) == "None" else m.group(2)
    meta = {}
    ranks = {(int(t), int(p)): int(n) for t, p, n in _NPARAMS.findall(text)}
    if ranks:
        meta["model_size"] = sum(ranks.values())
        config["parameters_per_rank"] = {f"{t},{p}": n for (t, p), n in sorted(ranks.items())}
    return config, meta
