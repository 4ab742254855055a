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

import ast
import hashlib
import re
from pathlib import Path

import numpy as np
import pandas as pd

from loaders.logs.base import (Parsed, RunData, complete_lines, decode_text, empty_points,
                               points_frame, steps_went_back)
from loaders.logs.codeheader import header_hyperparameters

_NUM = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+|nan|inf|NaN|Inf)"

NANOGPT_ITER = re.compile(rf"^iter (\d+): loss ({_NUM}), time ({_NUM})ms(?:, mfu ({_NUM})%)?")
NANOGPT_EVAL = re.compile(rf"^step (\d+): train loss ({_NUM}), val loss ({_NUM})")
MODDED_STEP = re.compile(r"^step:(\d+)/(\d+)\b")
LLMC_LINE = re.compile(r"^s:(\d+) ")
_MODDED_CODE_HINT = re.compile(r"step:\{[^}]*\}/\{")


def _read_chunk(path: Path, start: int, complete: bool = False) -> tuple[str, int]:
    """(text of ``path`` from ``start`` to parse, bytes of its complete lines)."""
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read()
    chunk, used = complete_lines(data, complete)
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

    def parse(self, path: Path, *, start: int = 0, state: dict | None = None,
              complete: bool = False) -> Parsed:
        text, used = _read_chunk(path, start, complete)
        state = dict(state or {})
        lines = _lines(text)
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
                                            "value": _to_float(vals[ok])}))
        if len(ev):
            step = ev[0].astype("int64").to_numpy()
            for col, metric in ((1, "eval/train_loss"), (2, "val/loss")):
                frames.append(pd.DataFrame({"line": ev.index.to_numpy(), "order": ev.index.to_numpy() * 4 + col,
                                            "step": step, "metric": metric, "value": _to_float(ev[col])}))
        df = pd.concat(frames, ignore_index=True).sort_values("order", kind="stable")
        df["run"] = run_no[np.searchsorted(met_line, df["line"].to_numpy())]
        eval_idx = ev.index.to_numpy()
        eval_steps = ev[0].astype("int64").to_numpy() if len(ev) else np.array([], "int64")
        first_of = {}
        for i, r in enumerate(run_no):
            first_of.setdefault(int(r), i)
        run_ids = list(first_of)
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
            sel = df[df["run"] == r]
            tok = sel["step"].to_numpy() * tpi if tpi else None
            pts = points_frame(sel["step"].to_numpy(), sel["metric"].to_numpy(), sel["value"].to_numpy(),
                               tokens=tok)
            resumed_flag = bool(resume[i:][run_no[i:] == r].any()) or bool(meta.get("resumed_from_checkpoint"))
            if resumed_flag:
                meta["resumed_from_checkpoint"] = True
            runs.append(RunData(name="" if r == 1 else f"#{r}", points=pts, config=config, meta=meta,
                                resumed=steps_went_back(pts) or resumed_flag))
            state["tokens_per_iter"] = tpi
        last = int(met_line[-1])
        # A printout after the last step belongs to the next run (read on the next append).
        state["pending"] = _nanogpt_block(facts, last + 1, n_lines, {})[0]
        state["pending_block"] = bool(cum_cfg[-1] - cum_cfg[last])
        state["pending_resume"] = bool(cum_res[-1] - cum_res[last])
        state["run_index"] = int(run_no[-1])
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
    }


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
    text = text.strip()
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


# -- modded-nanogpt ------------------------------------------------------------
_KV = r"(\w+):(\S+)"
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

    def parse(self, path: Path, *, start: int = 0, state: dict | None = None,
              complete: bool = False) -> Parsed:
        text, used = _read_chunk(path, start, complete)
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

    def parse(self, path: Path, *, start: int = 0, state: dict | None = None,
              complete: bool = False) -> Parsed:
        text, used = _read_chunk(path, start, complete)
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
