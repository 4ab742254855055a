"""Sweeps: a grid of runs (variant x weight decay x head sharing) and a runner.

Each run is an ordinary trainer run folder ``<out>/<name>``, named
``<variant>-<mha|gqaN|mqa>-wd<wd>`` (e.g. ``k_eq_v-mqa-wd0.1``; vision runs
``vit-k_eq_v-mqa-wd0.1``). Runs are
independent processes (``jobs`` at a time, one torch thread each by
default), so a sweep is resumable run by run: finished runs are skipped,
unfinished ones continue from their resume state.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable

from experiments.model import GPTConfig
from experiments.train import TrainConfig, train


@dataclass
class RunSpec:
    name: str
    model: GPTConfig
    train: TrainConfig


def sharing_label(n_head: int, n_kv_heads: int) -> str:
    """``mha`` (n_kv = n_head), ``mqa`` (n_kv = 1) or ``gqa<n_kv>``."""
    if n_kv_heads == n_head:
        return "mha"
    if n_kv_heads == 1:
        return "mqa"
    return f"gqa{n_kv_heads}"


def run_name(mc: GPTConfig, tc: TrainConfig) -> str:
    """``<variant>-<sharing>-wd<wd>``, with ``vit-`` in front for the image task."""
    prefix = "vit-" if mc.task == "image" else ""
    return f"{prefix}{mc.variant}-{sharing_label(mc.n_head, mc.n_kv_heads)}-wd{tc.weight_decay:g}"


def grid(variants: Iterable[str], weight_decays: Iterable[float], *,
         n_kv_heads: Iterable[int | None] = (None,), model: GPTConfig | None = None,
         training: TrainConfig | None = None) -> list[RunSpec]:
    """The cross product, in the order given; ``None`` kv heads means MHA."""
    model = model or GPTConfig()
    training = training or TrainConfig()
    specs = []
    for kv in n_kv_heads:
        for v in variants:
            for wd in weight_decays:
                mc = replace(model, variant=v, n_kv_heads=kv if kv is not None else model.n_head)
                tc = replace(training, weight_decay=float(wd))
                specs.append(RunSpec(run_name(mc, tc), mc, tc))
    return specs


def _exit_with_parent(parent: int, interval: float = 1.0) -> None:
    """Pool initializer: end this worker when the sweep process is gone.

    A ``ProcessPoolExecutor`` worker outlives a parent killed by SIGTERM or
    SIGKILL and keeps training (even picking up queued runs), writing into
    run folders a restarted sweep also writes; a daemon thread polls the
    parent pid and exits the worker at once when it changes.
    """
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os._exit(1)
    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _worker(spec: RunSpec, out: str, resume: bool) -> dict:
    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    summary = train(spec.model, spec.train, Path(out) / spec.name, resume=resume, progress=progress)
    summary["name"] = spec.name
    return summary


def run_sweep(specs: list[RunSpec], out: str | Path, *, jobs: int = 1, resume: bool = True,
              progress: Callable[[str], None] | None = None) -> list[dict]:
    """Train every spec into ``out/<name>``, ``jobs`` processes at a time.

    Returns one summary per run (see :func:`experiments.train.train`) plus
    ``name``, in the order of ``specs``; also writes ``out/sweep.json``.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"duplicate run names in sweep: {', '.join(dup)}")
    progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    t0 = time.time()
    results: dict[str, dict] = {}
    if jobs <= 1:
        for s in specs:
            results[s.name] = _worker(s, str(out), resume)
            progress(f"finished {s.name}: val_loss {results[s.name]['final_val_loss']:.4f}")
    else:
        ctx = mp.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_exit_with_parent,
                                 initargs=(os.getpid(),)) as pool:
            futs = {pool.submit(_worker, s, str(out), resume): s.name for s in specs}
            for f in as_completed(futs):
                results[futs[f]] = f.result()
                progress(f"finished {futs[f]}: val_loss {results[futs[f]]['final_val_loss']:.4f} "
                         f"({len(results)}/{len(specs)}, {time.time() - t0:.0f} s)")
    ordered = [results[n] for n in names]
    (out / "sweep.json").write_text(json.dumps(
        {"wall_s": time.time() - t0, "jobs": jobs,
         "runs": [{k: v for k, v in r.items() if k != "checkpoint"} | {
             "checkpoint": str(Path(r["checkpoint"]).relative_to(out))} for r in ordered]},
        indent=2) + "\n")
    return ordered
