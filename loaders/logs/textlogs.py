"""Training stdout logs: nanoGPT, modded-nanogpt, llm.c.

Lines are matched with vectorised pandas string operations (``str.extract``),
not a Python loop per line. Lines that match no pattern (banners, code,
warnings) are skipped. Metric names:

* nanoGPT ``iter N: loss X, time Yms, mfu Z%`` -> ``train/loss`` (the batch
  loss), ``time_ms``, ``mfu`` (percent, -100 until measured);
  ``step N: train loss X, val loss Y`` -> ``eval/train_loss``, ``val/loss``;
  ``saving checkpoint to DIR`` -> ``config["saved_checkpoints"]``.
* modded-nanogpt ``step:N/M val_loss:X train_loss:X train_time:Yms
  step_avg:Zms`` -> ``val/loss``, ``train/loss``, wall_time (seconds from
  ``train_time``), ``step_avg_ms``. The code header that starts each run is
  skipped (read only for metadata); each ``step:0/M`` starts a new run.
* llm.c ``s:N trl:X lr:Y norm:Z`` / ``s:N tel:X`` -> ``train/loss``, ``lr``,
  ``norm``, ``val/loss``; other ``key:value`` pairs kept as logged.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pandas as pd

from loaders.logs.base import (Parsed, RunData, complete_lines, decode_text, empty_points,
                               points_frame, steps_went_back)

_NUM = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+|nan|inf|NaN|Inf)"

NANOGPT_ITER = re.compile(rf"^iter (\d+): loss ({_NUM}), time ({_NUM})ms(?:, mfu ({_NUM})%)?")
NANOGPT_EVAL = re.compile(rf"^step (\d+): train loss ({_NUM}), val loss ({_NUM})")
MODDED_STEP = re.compile(r"^step:(\d+)/(\d+)\b")
LLMC_LINE = re.compile(r"^s:(\d+) ")
_MODDED_CODE_HINT = re.compile(r"step:\{[^}]*\}/\{")


def _read_chunk(path: Path, start: int) -> tuple[str, int]:
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read()
    chunk, used = complete_lines(data)
    return decode_text(path, chunk, start), used


def _lines(text: str) -> pd.Series:
    return pd.Series(text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"),
                     dtype="object")


def _to_float(s: pd.Series) -> np.ndarray:
    return pd.to_numeric(s, errors="coerce").to_numpy(dtype="float64")


def _head_text(head: bytes) -> str:
    try:
        return head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return head[:exc.start].decode("utf-8") if exc.start > len(head) - 4 else ""


# -- nanoGPT -----------------------------------------------------------------
class NanoGptReader:
    name = "nanogpt"
    help = "nanoGPT stdout: 'iter N: loss X, time Yms, mfu Z%' and 'step N: train loss X, val loss Y'"
    appendable = True

    @staticmethod
    def sniff(path: Path, head: bytes) -> bool:
        text = _head_text(head)
        return any(NANOGPT_ITER.match(l) or NANOGPT_EVAL.match(l) for l in text.split("\n"))

    def parse(self, path: Path, *, start: int = 0, state: dict | None = None) -> Parsed:
        text, used = _read_chunk(path, start)
        state = dict(state or {})
        lines = _lines(text)
        frames = []
        it = lines.str.extract(NANOGPT_ITER).dropna(subset=[0])
        if len(it):
            step = it[0].astype("int64").to_numpy()
            for col, metric in ((1, "train/loss"), (2, "time_ms"), (3, "mfu")):
                vals = it[col]
                ok = vals.notna().to_numpy()
                frames.append(pd.DataFrame({"order": it.index.to_numpy()[ok] * 4 + col,
                                            "step": step[ok], "metric": metric,
                                            "value": _to_float(vals[ok])}))
        ev = lines.str.extract(NANOGPT_EVAL).dropna(subset=[0])
        if len(ev):
            step = ev[0].astype("int64").to_numpy()
            for col, metric in ((1, "eval/train_loss"), (2, "val/loss")):
                frames.append(pd.DataFrame({"order": ev.index.to_numpy() * 4 + col, "step": step,
                                            "metric": metric, "value": _to_float(ev[col])}))
        config: dict = {}
        meta: dict = {}
        over = lines.str.extract(r"^Overriding: (\w+) = (.+)$").dropna()
        for key, val in zip(over[0], over[1]):
            config[key] = _literal(val)
        n_params = lines.str.extract(r"^number of parameters: ([\d.]+)M").dropna()
        if len(n_params):
            meta["model_size"] = int(round(float(n_params[0].iloc[0]) * 1e6))
        tpi = lines.str.extract(r"^tokens per iteration will be: ([\d,]+)").dropna()
        if len(tpi):
            state["tokens_per_iter"] = int(tpi[0].iloc[0].replace(",", ""))
            config["tokens_per_iter"] = state["tokens_per_iter"]
        saves = lines.str.extract(r"^saving checkpoint to (.+)$").dropna()
        if len(saves):
            # The save follows the eval line of the same step.
            eval_idx = ev.index.to_numpy()
            eval_steps = ev[0].astype("int64").to_numpy() if len(ev) else np.array([], "int64")
            saved = []
            for idx, d in zip(saves.index, saves[0]):
                prior = eval_steps[eval_idx < idx]
                saved.append({"step": int(prior[-1]) if len(prior) else state.get("last_eval_step"),
                              "dir": d.strip()})
            config["saved_checkpoints"] = saved
        if len(ev):
            state["last_eval_step"] = int(ev[0].iloc[-1])
        if lines.str.startswith("Resuming training from").any():
            meta["resumed_from_checkpoint"] = True
        if frames:
            df = pd.concat(frames, ignore_index=True).sort_values("order", kind="stable")
            tok = None
            if state.get("tokens_per_iter"):
                tok = df["step"].to_numpy() * state["tokens_per_iter"]
            pts = points_frame(df["step"].to_numpy(), df["metric"].to_numpy(), df["value"].to_numpy(),
                               tokens=tok)
        else:
            pts = empty_points()
        run = RunData(name="", points=pts, config=config, meta=meta,
                      resumed=steps_went_back(pts) or bool(meta.get("resumed_from_checkpoint")))
        return Parsed(runs=[run], read_bytes=start + used, state=state)


def _literal(text: str):
    text = text.strip()
    try:
        import ast
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


# -- modded-nanogpt ------------------------------------------------------------
_KV = r"(\w+):(\S+)"
_MODDED_NAMES = {"val_loss": "val/loss", "train_loss": "train/loss", "step_avg": "step_avg_ms"}
_ASSIGN = r"\s*(?::\s*\w+\s*)?[=:]\s*"  # "name = v", "name: v", "name : int = v"
_HEADER_PATTERNS = {
    "weight_decay": re.compile(rf"weight_decay{_ASSIGN}([-+\d.eE]+)"),
    "lr": re.compile(rf"\blr{_ASSIGN}([-+\d.eE]+)"),
    "seed": re.compile(rf"\bseed{_ASSIGN}(\d+)"),
    "n_kv_heads": re.compile(rf"\b(?:n_kv_heads|num_kv_heads|n_kv_head){_ASSIGN}(\d+)"),
    "num_iterations": re.compile(rf"\bnum_iterations{_ASSIGN}(\d+)"),
    "variant": re.compile(rf"\bvariant{_ASSIGN}['\"]?([\w=-]+)"),
}


def header_metadata(header: str) -> dict:
    """Hyperparameters stated in a modded-nanogpt code header (first occurrence wins)."""
    out: dict = {}
    for key, pat in _HEADER_PATTERNS.items():
        m = pat.search(header)
        if m:
            raw = m.group(1)
            try:
                out[key] = int(raw) if key in ("seed", "n_kv_heads", "num_iterations") else (
                    raw if key == "variant" else float(raw))
            except ValueError:
                continue
    return out


class ModdedNanoGptReader:
    name = "modded_nanogpt"
    help = ("modded-nanogpt log: code header, then 'step:N/M val_loss:X train_time:Yms step_avg:Zms'; "
            "each step:0/M starts a new run")
    appendable = True

    @staticmethod
    def sniff(path: Path, head: bytes) -> bool:
        if path.suffix == ".py":
            return False
        text = _head_text(head)
        if any(MODDED_STEP.match(l) for l in text.split("\n")):
            return True
        # A long code header can fill the first 64 KB; its print format gives it away.
        return bool(_MODDED_CODE_HINT.search(text)) and "val_loss" in text and \
            not text.lstrip().startswith(("#!", '"""'))

    def parse(self, path: Path, *, start: int = 0, state: dict | None = None) -> Parsed:
        text, _ = _read_chunk(path, start)
        state = dict(state or {"run_index": 0, "prev_step": None})
        lines = _lines(text)
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
        pairs = m[2].str.extractall(_KV)
        pairs.index = pairs.index.set_names(["line", "match"])
        line_of = pairs.index.get_level_values("line").to_numpy()
        pos = pd.Index(line_idx).get_indexer(line_of)
        key = pairs[0].to_numpy()
        raw = pairs[1].str.replace(r"(ms|s)$", "", regex=True)
        val = _to_float(raw)
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
        for r in pd.unique(run_no):
            sel = run_no == r
            first_line = int(line_idx[sel][0])
            prev_end = int(line_idx[:np.argmax(sel)][-1]) + 1 if np.argmax(sel) > 0 else 0
            header = "\n".join(all_lines[prev_end:first_line])
            config = header_metadata(header) if header.strip() else {}
            if header.strip():
                config["code_sha256"] = hashlib.sha256(header.encode()).hexdigest()
            config["total_steps"] = int(total[sel][0])
            p = pts_all[pts_all["run"] == r].drop(columns="run")
            pts = points_frame(p["step"], p["metric"].to_numpy(), p["value"], p["wall_time"])
            meta = {k: config[k] for k in ("weight_decay", "lr", "seed", "n_kv_heads", "variant")
                    if k in config}
            runs.append(RunData(name=f"#{int(r)}", points=pts, config=config, meta=meta,
                                resumed=steps_went_back(pts)))
        state["run_index"] = int(run_no[-1])
        state["prev_step"] = int(step[-1])
        # Consume up to the last step line: a following header is re-read with its run.
        last = int(line_idx[-1])
        consumed = sum(len(s.encode("utf-8")) + 1 for s in all_lines[:last + 1])
        return Parsed(runs=runs, read_bytes=start + consumed, state=state)


# -- llm.c -------------------------------------------------------------------
_LLMC_NAMES = {"trl": "train/loss", "tel": "val/loss", "lr": "lr"}


class LlmcReader:
    name = "llmc"
    help = "llm.c log (-o): 's:N trl:X lr:Y norm:Z' train lines and 's:N tel:X' eval lines"
    appendable = True

    @staticmethod
    def sniff(path: Path, head: bytes) -> bool:
        text = _head_text(head)
        lines = [l for l in text.split("\n")[:200] if l.strip()]
        return bool(lines) and sum(bool(re.match(r"^s:\d+ \w+:", l)) for l in lines) >= max(1, len(lines) // 2)

    def parse(self, path: Path, *, start: int = 0, state: dict | None = None) -> Parsed:
        text, used = _read_chunk(path, start)
        lines = _lines(text)
        m = lines.str.extract(r"^s:(\d+)\s+(.*)$").dropna(subset=[0])
        if not len(m):
            return Parsed(runs=[RunData(name="", points=empty_points())], read_bytes=start + used,
                          state=dict(state or {}))
        pairs = m[1].str.extractall(_KV)
        line_of = pairs.index.get_level_values(0).to_numpy()
        steps = m[0].astype("int64").reindex(line_of).to_numpy()
        metric = pairs[0].map(lambda k: _LLMC_NAMES.get(k, k)).to_numpy()
        pts = points_frame(steps, metric, _to_float(pairs[1]))
        return Parsed(runs=[RunData(name="", points=pts, resumed=steps_went_back(pts))],
                      read_bytes=start + used, state=dict(state or {}))
