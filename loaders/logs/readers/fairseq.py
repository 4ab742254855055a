"""fairseq / metaseq stdout (``fairseq_cli/train.py``, ``metaseq/cli/train.py``)
in its ``simple`` and ``json`` log formats, old (``| epoch 001: ...``) and
new (``YYYY-MM-DD hh:mm:ss | INFO | train_inner | ...``, hydra's
``[2022-..][train_inner][INFO] - ...``) prefixes alike.

* ``train_inner``: ``epoch 001:    100 / 1000 loss=9.5, ppl=724.4, wps=..,
  num_updates=100, lr=0.0001, gnorm=2.1, ...`` or ``{"epoch": 1, "update":
  0.1, "loss": "9.5", ..., "num_updates": "100", "lr": "0.0001"}`` ->
  ``train/loss``, ``lr``, and ``train/<key>`` for the rest (``train/ppl``,
  ``train/gnorm``, ``train/wps``, ...), at step ``num_updates``;
* ``valid``: ``epoch 001 | valid on 'valid' subset | loss 7.2 | ppl 147 | ...
  | num_updates 1000`` or ``{"epoch": 1, "valid_loss": "7.2", ...,
  "valid_num_updates": "1000"}`` -> ``val/loss``, ``val/<key>`` (another
  subset ``S`` -> ``S/loss``, ...) at its ``num_updates``;
* ``train`` (the end-of-epoch summary): ``epoch 001 | loss 8.5 | ... |
  num_updates 1000`` -> ``epoch/<key>`` at its ``num_updates`` (the epoch's
  mean, kept apart from the curve).

Hyperparameters: the printed ``Namespace(lr=[0.0005], weight_decay=0.01,
seed=1, arch='transformer_lm', ...)`` (fairseq < 0.10) or config dict
(``{'_name': None, 'common': {...}, 'optimization': {'lr': [0.0005]}, ...}``),
read as literals, nothing run; ``lr=[x]`` lists are unwrapped. The model size
is "num. model params: N" / "num. shared model params: N". A line of one of
these kinds whose values do not parse is counted on the file's report line.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from loaders.logs.base import Parsed, RunData, is_text_head, points_frame, steps_went_back
from loaders.logs.readers._text import (call_keywords, head_text, lines_of, literal, no_points_error, read_chunk,
                                        scalar_config, unread_note)

NAME = "fairseq"
PRIORITY = 67
HELP = ("fairseq / metaseq stdout: train_inner 'epoch 001: 100 / 1000 loss=9.5, ..., num_updates=100' "
        "(simple or json log format) and valid 'valid on 'valid' subset | loss 7.2 | ...' lines")
APPENDABLE = True
EXAMPLE = "checkpoints/train.log"

_INNER_SIMPLE = re.compile(r"\bepoch (\d+):\s+(\d+) / (\d+) (.*)$")
_TAGGED = re.compile(r"(?:\| (train_inner|train|valid) \| |\[(train_inner|train|valid)\]\[\w+\] - )(.*)$")
#: The line prefix of older fairseq logs, ``| epoch 001 | ``, then a valid or a train summary.
_OLD_EPOCH = r"^\| epoch (\d+) \| "
_OLD_VALID = re.compile(_OLD_EPOCH + r"(valid on '[^']*' subset \| .*)$")
_OLD_TRAIN = re.compile(_OLD_EPOCH + r"(loss .*)$")
_SUBSET = re.compile(r"valid on '([^']*)' subset")
_PAIR_EQ = re.compile(r"(\w+)=([^,\s]+)")
_PARAMS = re.compile(r"num\. (?:shared )?model params: ([\d,]+)")


def sniff(path: Path, head: bytes) -> bool:
    if not is_text_head(head):
        return False
    text = head_text(head)
    return any(("train_inner" in l and (_TAGGED.search(l) or "num_updates" in l))
               or (_INNER_SIMPLE.search(l) and "num_updates=" in l) or _OLD_VALID.match(l)
               for l in text.split("\n"))


def _float(v) -> float | None:
    if isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _pipes(body: str) -> dict:
    """``k v | k v | ...`` fields of a simple-format summary line."""
    out = {}
    for part in body.split("|"):
        k, _, v = part.strip().partition(" ")
        if k and v:
            out[k] = v.strip()
    return out


def _parse(kind: str, body: str) -> tuple[str, dict] | None:
    """(subset, {key: raw value}) of one line's fields; None when it has none."""
    body = body.strip()
    subset = "train"
    if body.startswith("{"):
        try:
            doc = json.loads(body)
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        if kind in ("valid", "train"):
            prefixes = {k.split("_", 1)[0] for k in doc if "_" in k and k != "num_updates"}
            if kind == "valid":
                subset = next((p for p in sorted(prefixes) if f"{p}_loss" in doc), "valid")
            pre = f"{subset}_"
            doc = {k[len(pre):] if k.startswith(pre) else k: v for k, v in doc.items()}
        return subset, doc
    m = _INNER_SIMPLE.search(body)
    if m:
        return "train", {"epoch": m.group(1), **dict(_PAIR_EQ.findall(m.group(4)))}
    sub = _SUBSET.search(body)
    if sub:
        return sub.group(1), _pipes(body[sub.end():])
    fields = _pipes(body)
    return ("train", fields) if fields else None


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    text, used = read_chunk(path, start, complete)
    state = dict(state or {})
    lines = lines_of(text)
    cand = lines[lines.str.contains(r"train_inner|\| train \||\[train\]|valid|\bepoch \d+\s*[:|]", regex=True)]
    rows, bad = [], []
    for ln, line in cand.items():
        kind, body = _kind(line)
        if kind is None:
            continue
        got = _parse(kind, body)
        vals = {} if got is None else {k: _float(v) for k, v in got[1].items()}
        step = vals.pop("num_updates", None)
        if got is None or step is None or not any(v is not None for v in vals.values()):
            bad.append(int(ln))
            continue
        subset = got[0]
        for key, v in vals.items():
            # "update" is the fractional epoch; a summary's epoch is its label
            if v is None or key == "update" or (key == "epoch" and kind != "train_inner"):
                continue
            rows.append((int(ln), int(step), _name(kind, subset, key), v))
    notes = []
    where = (lambda i: i) if start == 0 else (lambda i: None)
    if bad:
        if not rows:
            raise no_points_error(path, "fairseq train_inner / valid lines with num_updates", len(bad),
                                  lines.iat[bad[0]], where(bad[0]))
        notes.append(unread_note(len(bad), "fairseq train_inner/valid", lines.iat[bad[0]], where(bad[0])))
    config, meta = _config(lines, text) if start == 0 else ({}, {})
    if not rows:
        runs = [RunData(name="", points=points_frame([], [], []), config=config, meta=meta)] if start == 0 else []
        return Parsed(runs=runs, read_bytes=start + used, state=state, notes=notes)
    df = pd.DataFrame(rows, columns=["line", "step", "metric", "value"])
    pts = points_frame(df["step"].to_numpy(), df["metric"].to_numpy(), df["value"].to_numpy())
    return Parsed(runs=[RunData(name="", points=pts, config=config, meta=meta, resumed=steps_went_back(pts))],
                  read_bytes=start + used, state=state, notes=notes)


def _kind(line: str) -> tuple[str | None, str]:
    """(train_inner / valid / train, the line's fields) or (None, "")."""
    m = _TAGGED.search(line)
    if m:
        return (m.group(1) or m.group(2)), m.group(3)
    m = _OLD_VALID.match(line)
    if m:
        return "valid", m.group(2)
    m = _INNER_SIMPLE.search(line)
    if m and "num_updates=" in line:
        return "train_inner", line[m.start():]
    m = _OLD_TRAIN.match(line)
    if m and "num_updates" in line:
        return "train", m.group(2)
    return None, ""


def _name(kind: str, subset: str, key: str) -> str:
    if kind == "train_inner":
        return {"loss": "train/loss", "lr": "lr", "epoch": "epoch"}.get(key, f"train/{key}")
    if kind == "train":
        return f"epoch/{key}"
    return f"{'val' if subset == 'valid' else subset}/{key}"


def _config(lines: pd.Series, text: str) -> tuple[dict, dict]:
    """(config, meta): the printed Namespace or config dict, the parameter count."""
    config: dict = {}
    ns = lines[lines.str.contains("Namespace(", regex=False)]
    if len(ns):
        line = ns.iat[0]
        config = call_keywords(line[line.index("Namespace("):]) or {}
    else:
        cfg = lines[lines.str.contains("{'_name':", regex=False)]
        if len(cfg):
            line = cfg.iat[0]
            doc = literal(line[line.index("{'_name':"):])
            if isinstance(doc, dict):            # its sections' keys, one level down
                config = {k: v for sec in doc.values() if isinstance(sec, dict) for k, v in sec.items()}
    keep = ("lr", "weight_decay", "seed", "arch", "optimizer", "lr_scheduler", "warmup_updates", "max_update",
            "max_tokens", "batch_size", "update_freq", "clip_norm", "dropout", "decoder_layers",
            "decoder_embed_dim", "decoder_attention_heads", "encoder_layers", "encoder_embed_dim",
            "encoder_attention_heads", "tokens_per_sample", "task", "criterion", "save_dir")
    config = scalar_config({k: v for k, v in config.items() if k in keep
                            and (isinstance(v, (int, float, str, bool)) or v is None or
                                 (isinstance(v, list) and len(v) == 1))})
    meta = {}
    m = _PARAMS.findall(text)
    if m:
        meta["model_size"] = int(m[0].replace(",", ""))
    return config, meta
