"""The notebook API: qkvscope's commands as functions that return Python objects.

``from app import api`` (the packages keep the project's layout: ``app``,
``analysis``, ``loaders``, ``experiments``; there is no ``qkvscope`` module).
Each function runs the same code as its command: it builds the command's own
arguments (``app.cli.build_parser``, so the defaults are the command's) and
calls the function the command calls, so ``api.analyze(path)`` and
``qkvscope analyze PATH --json`` give the same rows.

>>> from app import api
>>> api.info("runs/kv-mqa/checkpoints/final.safetensors")["variant"]        # doctest: +SKIP
'k_eq_v'
>>> df = api.analyze("runs/kv-mqa/checkpoints/final.safetensors")          # doctest: +SKIP
>>> df.pivot_table(index="layer", columns="metric", values="value")         # doctest: +SKIP

``db`` is a database file, as ``--db`` (default: ``$QKVSCOPE_DB``, else
``data/qkvscope.duckdb`` in a checkout, else the user data folder:
``loaders.bundled``). Bad input raises the commands' typed errors
(``loaders.errors.QkvscopeError``, ``analysis.errors.AnalysisError``) with the
message the command prints.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from analysis.results_table import metric_order, results_table
from app.cli import build_parser, command_module
from app.commands._common import checkpoint_path, json_ready
from app.commands.analyze import analyze_targets
from app.commands.info import read_info
from app.commands.kv_cost import costing
from loaders import curves
from loaders.logs import list_runs
from loaders.run_table import run_table
from loaders.store import Store

__all__ = ["info", "analyze", "kv_cost", "runs", "points", "results"]

PathLike = str | Path


def _args(command: str, argv: Iterable[str] = (), **options: Any) -> argparse.Namespace:
    """The arguments ``command`` gets from ``argv`` (its defaults from its own parser), then each
    keyword set as the option of that name (``dest``: ``--kv-heads`` is ``kv_heads``)."""
    module = command_module(command)
    args = build_parser(module).parse_args([command, *argv])
    for name, value in options.items():
        if not hasattr(args, name):
            raise TypeError(f"{command}: no option {name!r} (the options are the command's: "
                            f"qkvscope {command} --help)")
        setattr(args, name, value)
    return args


def info(path: PathLike) -> dict:
    """What ``qkvscope info PATH --json`` prints: architecture, variant, geometry, parameters,
    KV bytes per token, and ``tied`` (what the tensors show). Nothing is stored.

    >>> api.info("data/demo/k_eq_v-mha-wd0/checkpoints/final_step_004000.safetensors")["n_heads"]  # doctest: +SKIP
    4
    """
    return read_info(checkpoint_path(str(path), False))


def analyze(path: PathLike | int, activations: bool = False, device: str | None = None, *,
            db: PathLike | None = None, force: bool = False, text: PathLike | None = None,
            tokens: int | None = None) -> pd.DataFrame:
    """The metrics of one checkpoint (a file or folder, ingested first, or a stored checkpoint's
    id): the rows of ``qkvscope analyze PATH --json``, one per layer, head and metric, with
    columns ``layer, head, metric, value, chance, n_tokens, ci_low, ci_high`` (``head`` NA for a
    per-layer metric; the last three NA but for activation metrics). Results are stored in ``db`` and read back
    the next time, as the command does.

    ``df.attrs`` holds the rest of the JSON: ``checkpoint`` (id, path), ``notes`` (why a metric
    is absent), ``cached``, and ``tied`` / ``sample`` where the command prints them.

    >>> df = api.analyze("data/demo/k_eq_v-mha-wd0/checkpoints/final_step_004000.safetensors")  # doctest: +SKIP
    >>> df[df.metric == "kv_cosine"][["layer", "head", "value", "chance"]]                 # doctest: +SKIP
    """
    args = _args("analyze", [str(path)], activations=activations, device=device, db=_path(db), force=force,
                 text=None if text is None else str(text), tokens=tokens)
    payload = analyze_targets(args)[0]
    columns = ["layer", "head", "metric", "value", "chance", "n_tokens", "ci_low", "ci_high"]
    frame = pd.DataFrame(payload["metrics"]).reindex(columns=columns)   # weight rows: no n_tokens, ci_*
    frame = frame.astype({"head": "Int64", "n_tokens": "Int64", "value": float, "chance": float,
                          "ci_low": float, "ci_high": float})
    frame.attrs = {k: v for k, v in payload.items() if k != "metrics"}
    return frame


def kv_cost(preset: str | None = None, *, checkpoint: PathLike | None = None, **options: Any) -> dict:
    """What ``qkvscope kv-cost ... --json`` prints: KV-cache bytes, users per GPU, GPUs, tokens/s
    and USD per million tokens of a variant, its ``baseline`` and the ``savings``. The geometry
    comes from ``preset``, ``checkpoint`` or the typed options ``layers, heads, d_head, d_model``;
    every other option of the command is a keyword of the same name (``variant``, ``kv_heads``,
    ``context``, ``users``, ``gpu``, ``compare=True`` for the table of every variant, ...).

    >>> c = api.kv_cost("llama-3-8b", variant="k_eq_v", gpu="h100-sxm")     # doctest: +SKIP
    >>> c["bytes_per_token"], c["savings"]["saving_bytes_per_token"]          # doctest: +SKIP
    (65536.0, 0.5)
    """
    args = _args("kv-cost", preset=preset, checkpoint=None if checkpoint is None else str(checkpoint), **options)
    return json_ready(costing(args).to_json())


def _store(db: PathLike | None):
    return Store(_path(db))


def _path(db: PathLike | None) -> Path | None:
    return None if db is None else Path(db)


def runs(db: PathLike | None = None) -> pd.DataFrame:
    """The stored training runs, one row each (``qkvscope runs --json --config``): ``id, name,
    source, format, variant, n_kv_heads, weight_decay, lr, seed, model_size, resumed, n_points,
    metrics, first_step, last_step, config, overrides``.

    >>> api.runs()[["id", "name", "variant", "weight_decay"]].head()       # doctest: +SKIP
    """
    return pd.DataFrame(list_runs(_store(db)))


def points(db: PathLike | None, metric: str, *, runs: Iterable[int] | None = None,
           x: str = "step", max_points: int | None = None) -> pd.DataFrame:
    """The logged points of one metric (its stored name: ``val/loss`` for a logged ``val_loss``,
    ``runs(db)["metrics"]`` lists them): columns ``run_id, x, value, step`` sorted by run and
    ``x`` (``x``: ``step``, ``tokens`` or ``wall_time``, as the Experiments page plots them).
    ``runs``: run ids (default all). ``max_points``: at most this many points per run, the
    minimum and maximum of equal x buckets (``loaders.curves.curves``); default every point.

    >>> api.points(None, "val/loss").groupby("run_id")["value"].min()      # doctest: +SKIP
    """
    store = _store(db)
    ids = [r["id"] for r in list_runs(store)] if runs is None else list(runs)
    return curves.curves(store, ids, metric, x=x, max_points=sys.maxsize if max_points is None else max_points)


def results(db: PathLike | None = None, metrics: Iterable[str] | None = None, *, statistic: str = "final",
            weight_decay: float | None = None, task: str | None = None, perplexity: bool = False,
            bytes_per_elem: int | None = None) -> pd.DataFrame:
    """The Results page's table: one row per task, variant and head sharing (MHA, GQA, MQA), per
    metric ``<m> mean, <m> std, <m> n, <m> vs qkv %`` over the row's runs, then ``KV bytes/token``
    and ``attention params`` (``analysis.results_table.results_table``, where the formulas are).

    ``metrics``: default the first the runs logged (the page's default); ``statistic``:
    ``final`` (each run's last value) or ``best``; ``weight_decay``: keep the runs of this one
    (default all); ``task``: keep one task's rows; ``perplexity``: add ``exp(loss)`` columns;
    ``bytes_per_elem``: KV-cache bytes per element (default the checkpoint's dtype).

    >>> api.results(metrics=["val/loss"], weight_decay=0.1)[["label", "sharing", "val/loss mean"]]  # doctest: +SKIP
    """
    store = _store(db)
    table = run_table(store, geometry=True)
    if metrics is None:
        names = {str(m) for ms in table["metrics"] for m in list(ms)} if not table.empty else set()
        metrics = [m for m in metric_order(names) if m not in ("lr", "learning_rate")][:1]
    metrics = list(metrics)
    if weight_decay is not None:
        table = table[table["weight_decay"].map(lambda w: w is not None and not pd.isna(w) and
                                                float(w) == float(weight_decay))]
    if task is not None:
        table = table[table["task"].astype(str) == task]
    values = curves.run_metric_summary(store, metrics)
    return results_table(table, values, metrics, statistic=statistic, perplexity=perplexity,
                         bytes_per_elem=bytes_per_elem, overrides=curves.metric_directions(store))
