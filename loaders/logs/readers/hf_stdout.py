"""Hugging Face Trainer stdout (also accelerate and axolotl runs, which log
through the Trainer): the dicts its ``ProgressCallback`` prints.

* ``{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 4.9e-05, 'epoch': 0.01}``
  -> ``train/loss``, ``grad_norm``, ``lr``, ``epoch`` (transformers 5 prints
  the values as formatted strings, ``'loss': '3.249'``: read as numbers);
* ``{'eval_loss': 2.1, 'eval_runtime': 3.2, ..., 'epoch': 0.5}`` -> ``val/loss``
  and the other ``eval_*`` keys as logged;
* the closing ``{'train_runtime': ..., 'train_loss': ...}`` summary keeps its
  logged names (its ``train_loss`` is the mean over the run, no point of the
  curve), as the ``hf_trainer`` reader keeps them.

A line may carry a prefix (``[rank0]:``, ``[YYYY-MM-DD hh:mm:ss,mmm] [INFO]``)
and tqdm's progress bars written over each other with ``\\r``: each dict is
found by its brace span anywhere in the line and read with
``ast.literal_eval`` on that span alone (never ``eval``). A span that starts
like one (``{'loss':``, ``{'eval_``, ``{'train_runtime':``) but does not
parse is counted on the file's report line.

Steps. The Trainer prints no step with these dicts, so the step is derived,
and ``config["metadata_notes"]`` says how, for how many dicts:

1. a ``step`` / ``global_step`` key in the dict (some forks print one);
2. else the training progress bar: tqdm redraws it right after each dict it
   prints (``tqdm.write``), ``| 10/4854 [``, so its count is the step the
   dict was logged at (the bar counts optimizer steps); it is the training
   bar when its total is the "Total optimization steps = N" the Trainer
   prints (else the total most bars after train dicts show), not an eval bar;
3. else, for a train dict, k x ``logging_steps`` when the log prints its
   ``TrainingArguments`` (the k-th train dict; with ``logging_first_step=True``
   the first is at step 1 and the k-th after it at (k - 1) x N), else its
   ordinal k (1, 2, ...); for an eval dict, k x ``eval_steps`` (the k-th
   eval, when the printed arguments say ``eval_strategy`` steps), else the
   step of the train dict before it (0 before the first); for the summary,
   ``max_steps`` (when printed and positive), else "Total optimization
   steps = N", else the last train step.

Each "***** Running training *****" banner after a dict starts another
training (a script that trains several models in turn): its own run, named
``#2``, ``#3``, ... after the file, with the arguments printed before it;
a banner followed by "Continuing training from checkpoint" is a resume of
the same run.

Hyperparameters come from the printed ``TrainingArguments(...)`` block
(``learning_rate=``, ``weight_decay=``, ``seed=``) and the Trainer's
"Number of trainable parameters = N" (the model size; of a LoRA run, the
adapters' count, which is all the Trainer prints).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from loaders.logs.base import Parsed, RunData, is_text_head, normalise_metric, points_frame, steps_went_back
from loaders.logs.readers._text import head_text, lines_of, literal, no_points_error, read_chunk, unread_note

NAME = "hf_stdout"
PRIORITY = 65
HELP = ("Hugging Face Trainer / accelerate / axolotl stdout: printed dicts {'loss': ..., "
        "'learning_rate': ..., 'epoch': ...}, {'eval_loss': ...}, {'train_runtime': ...}")
APPENDABLE = False
EXAMPLE = "output/train.log"

#: The first key of a dict the Trainer prints.
_FIRST_KEY = r"(?:loss|eval_[\w/.-]+|train_runtime|learning_rate|grad_norm|epoch|train_loss|step)"
#: A printed dict: its brace span, no nested braces.
_SPAN = re.compile(rf"\{{'{_FIRST_KEY}':[^{{}}]*\}}")
#: How a printed dict starts (a line with one that does not parse is reported).
_START = re.compile(r"\{'(?:loss|eval_[\w/.-]+|train_runtime)':")
_NAMES = {"loss": "train/loss", "eval_loss": "val/loss", "learning_rate": "lr"}
_ARG_LINE = re.compile(r"^(\w+)=(.*?),?$")
_RESUME = "Continuing training from checkpoint"
_BANNER = re.compile(r"\*\*\*\*\* Running training \*\*\*\*\*")
#: A train dict that did not parse: it took its logging step all the same.
_LOST: dict = {"loss": None}


def sniff(path: Path, head: bytes) -> bool:
    """A printed Trainer dict in the head, or the Trainer's "Running training"
    banner (its first dict may come after the first 64 KB, behind DeepSpeed's
    progress lines: the log is still the Trainer's)."""
    if not is_text_head(head):
        return False
    text = head_text(head)
    if "***** Running training *****" in text and "Total optimization steps = " in text:
        return True
    return any(isinstance(literal(m.group(0)), dict) for m in _SPAN.finditer(text))


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    text, used = read_chunk(path, 0, True)
    entries: list[tuple[int, dict | None, int | None]] = []    # (offset, dict, bar step) in file order
    covered = set()
    for m in _SPAN.finditer(text):
        d = literal(m.group(0))
        if isinstance(d, dict):
            entries.append((m.start(), d, _bar_after(text, m.end())))
            covered.add(m.start())
    bad = [m.start() for m in _START.finditer(text) if m.start() not in covered]
    if not entries:
        if bad:
            ln, first = _line_at(text, bad[0])
            raise no_points_error(path, "Trainer log dicts ({'loss': ..., 'learning_rate': ...})",
                                  len(bad), first, ln)
        return Parsed(runs=[RunData(name="", points=points_frame([], [], []))], read_bytes=used)
    # A train dict that did not parse still took its logging step.
    entries += [(pos, _LOST, None) for pos in bad if text.startswith("{'loss':", pos)]
    entries.sort(key=lambda e: e[0])
    # Each "Running training" banner after the first starts another training
    # (a script that trains several models in turn): its own run, #2, #3, ...
    # A banner followed by "Continuing training from checkpoint" resumes the same run.
    banners = [m.start() for m in _BANNER.finditer(text)]
    cuts = [b for b in banners[1:] if any(pos < b for pos, _, _ in entries)
            and _RESUME not in text[b:next((pos for pos, _, _ in entries if pos > b), len(text))]]
    bounds = [0, *cuts, len(text) + 1]
    lines = lines_of(text)
    arg_blocks = _training_arguments(lines, text)
    runs = []
    for lo, hi in zip(bounds, bounds[1:]):
        seg = [e for e in entries if lo <= e[0] < hi]
        if not seg:
            continue
        # The arguments printed last before this training's dicts.
        args = next((a for off, a in reversed(arg_blocks) if off < seg[0][0]), {})
        run = _run(seg, args, _facts(text[lo:hi]))
        run.name = f"#{len(runs) + 1}" if runs else ""
        runs.append(run)
    report = []
    if bad:
        ln, first = _line_at(text, bad[0])
        report.append(unread_note(len(bad), "Trainer-dict", first, ln))
    return Parsed(runs=runs, read_bytes=used, notes=report)


def _run(entries: list, args: dict, facts: dict) -> RunData:
    """One training's dicts as a run: their steps (module docstring), points, config."""
    kinds = [_kind(d) for _, d, _ in entries]
    n_train = sum(k == "train" for k in kinds)
    total = facts.get("total_optimization_steps") or _common_total(entries)
    logging_steps = args.get("logging_steps")
    first_step = args.get("logging_first_step") is True
    if not (isinstance(logging_steps, int) and logging_steps > 0):
        logging_steps = None
    eval_steps = args.get("eval_steps")
    if not (str(args.get("eval_strategy", args.get("evaluation_strategy", ""))).lower().endswith("steps")
            and isinstance(eval_steps, int) and eval_steps > 0):
        eval_steps = None
    rows = []                                       # (order, step, metric, value)
    how: dict[str, int] = {}
    k, k_eval, last = 0, 0, 0
    for (pos, d, bar), kind in zip(entries, kinds):
        if d is _LOST:
            k += 1
            continue
        own = d.get("step", d.get("global_step"))
        if isinstance(own, (int, float)) and not isinstance(own, bool):
            step, why = int(own), "the step the dict prints"
        elif bar is not None and bar[1] == total:
            step, why = bar[0], "the training progress bar tqdm redraws under the dict"
        elif kind == "train":
            if logging_steps:
                step = 1 if first_step and k == 0 else (k + 1 - first_step) * logging_steps
                why = f"logging_steps={logging_steps} x the train dict's ordinal"
            else:
                step, why = k + 1, "the train dict's ordinal (1, 2, ...): no step, bar or logging_steps printed"
        elif kind == "summary":
            step, why = _final_step(args, facts, last), "max_steps / the total optimization steps"
        elif eval_steps:
            step, why = (k_eval + 1) * eval_steps, f"eval_steps={eval_steps} x the eval dict's ordinal"
        else:
            step, why = last, "the step of the train dict before it"
        k += kind == "train"
        k_eval += kind == "eval"
        if kind == "train":
            last = step
        how[f"{kind} dicts: {why}"] = how.get(f"{kind} dicts: {why}", 0) + 1
        for i, (key, v) in enumerate(d.items()):
            value = _number(v)
            if key in ("step", "global_step") or value is None:
                continue
            name = key if kind == "summary" else _NAMES.get(key, normalise_metric(key))
            rows.append((pos * 64 + i, step, name, value))
    df = pd.DataFrame(rows, columns=["order", "step", "metric", "value"]).sort_values("order", kind="stable")
    pts = points_frame(df["step"].to_numpy(), df["metric"].to_numpy(), df["value"].to_numpy())
    config = {k: v for k, v in args.items() if isinstance(v, (int, float, str, bool)) or v is None}
    config.update(facts)
    config["n_train_logs"] = n_train
    config["metadata_notes"] = [f"steps of {n} {w}" for w, n in how.items()]
    meta = {"model_size": facts["trainable_parameters"]} if "trainable_parameters" in facts else {}
    return RunData(name="", points=pts, config=config, meta=meta, resumed=steps_went_back(pts))


#: A tqdm bar's count, ``| 10/4854 [``.
_BAR = re.compile(r"\|\s*(\d+)/(\d+) \[")


def _bar_after(text: str, end: int) -> tuple[int, int] | None:
    """(n, total) of the progress bar tqdm redraws right after a dict it
    printed (``tqdm.write``): the first bar before the next dict, if close."""
    window = text[end:end + 400]
    nxt = window.find("{'")
    m = _BAR.search(window if nxt < 0 else window[:nxt])
    return (int(m.group(1)), int(m.group(2))) if m else None


def _common_total(entries) -> int | None:
    """The total of the bars drawn after train dicts most often: the training bar's."""
    totals = pd.Series([b[1] for _, d, b in entries if b is not None and _kind(d) == "train"], dtype="int64")
    return int(totals.mode().iat[0]) if len(totals) else None


def _line_at(text: str, pos: int) -> tuple[int, str]:
    """(0-based line number of offset ``pos``, its line's text from ``pos`` on)."""
    hi = text.find("\n", pos)
    return text.count("\n", 0, pos), text[pos:hi if hi >= 0 else len(text)]


def _number(v) -> float | None:
    """A logged value: a number, or the formatted string recent Trainers print
    (``'loss': '3.249'``); None for anything else."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _kind(d: dict) -> str:
    if "train_runtime" in d:
        return "summary"
    if any(str(k).startswith(("eval_", "test_", "predict_")) for k in d):
        return "eval"
    return "train"


def _final_step(args: dict, facts: dict, last: int) -> int:
    if isinstance(args.get("max_steps"), int) and args["max_steps"] > 0:
        return args["max_steps"]
    return facts.get("total_optimization_steps", last)


def _training_arguments(lines: pd.Series, text: str) -> list[tuple[int, dict]]:
    """(text offset, its ``name=value`` lines) of every printed ``TrainingArguments(`` block
    (values are literals where they are one, else the printed text)."""
    starts = np.flatnonzero(lines.str.contains(r"TrainingArguments\($", regex=True).to_numpy())
    if not len(starts):
        return []
    offsets = np.cumsum([0] + [len(l) + 1 for l in lines.iloc[:int(starts[-1])]])
    blocks = []
    for st in starts:
        out: dict = {}
        for line in lines.iloc[int(st) + 1:int(st) + 1000]:
            if line.strip() == ")":
                break
            m = _ARG_LINE.match(line.strip())
            if m:
                v = literal(m.group(2))
                out[m.group(1)] = v if v is not None or m.group(2) == "None" else m.group(2)
        blocks.append((int(offsets[int(st)]), out))
    return blocks


def _facts(text: str) -> dict:
    """Numbers the Trainer's "***** Running training *****" banner prints."""
    out = {}
    for key, pat in (("total_optimization_steps", r"Total optimization steps = ([\d,]+)"),
                     ("trainable_parameters", r"Number of trainable parameters = ([\d,]+)")):
        m = re.findall(pat, text)
        if m:
            out[key] = int(m[-1].replace(",", ""))
    return out
