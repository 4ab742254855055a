"""Comparable groups: which runs a page may average, fit or set side by side.

Two runs are comparable when they agree in project, task, geometry (``d_model``, ``n_layers``,
``n_heads``), variant and head sharing (``n_kv_heads``): ``GROUP_COLUMNS``. The Results table,
the Weight decay fits, the Papers comparison and the Experiments summaries group by
``group_key`` and never across it; runs of unknown project, task or geometry form groups of
their own (an unknown value is ``"?"``, never a wildcard).

Runs of one group may still differ in what the key leaves out. ``differences`` names each such
difference, to be shown beside the row: the length of training (each run's last logged step)
and every logged hyperparameter other than weight decay and seed (the run's ``lr`` and its
config's scalar entries, ``analysis.wd_sensitivity``'s flattening, without what describes the
logging rather than the training: ``NOT_HYPERPARAMETERS``).
"""
from __future__ import annotations

import json
import math

import pandas as pd

#: What a comparable group agrees in, in key order.
GROUP_COLUMNS = ("project", "task", "d_model", "n_layers", "n_heads", "n_kv_heads", "variant")
#: Config entries that say how a run was logged or read, not how it was trained.
NOT_HYPERPARAMETERS = frozenset({"log_format", "format", "format_version", "lr_peak", "lr_initial", "overrides",
                                 "paper_condition", "saved_checkpoints", "task", "variant", "n_kv_heads",
                                 "n_head", "n_heads", "n_layer", "n_layers", "d_model", "n_embd", "d_head"})
_NOT_HP_PREFIXES = ("metadata_", "corpus.", "files.")


def _part(value) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return "?"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def group_key(row) -> str:
    """``"project|task|d_model|n_layers|n_heads|n_kv_heads|variant"`` of one run (a mapping with
    ``GROUP_COLUMNS``; a missing or unknown value is ``?``)."""
    return "|".join(_part(row.get(c)) for c in GROUP_COLUMNS)


def group_keys(runs: pd.DataFrame) -> list[str]:
    """``group_key`` of each row of ``runs``, in row order."""
    cols = {c: (runs[c] if c in runs.columns else pd.Series([None] * len(runs), index=runs.index))
            for c in GROUP_COLUMNS}
    return ["|".join(_part(cols[c].iloc[i]) for c in GROUP_COLUMNS) for i in range(len(runs))]


def _config(value) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def hyperparameters(run) -> dict:
    """A run's logged hyperparameters other than weight decay and seed: its ``lr`` and its
    config's scalar entries (``analysis.wd_sensitivity._scalars``, which leaves out weight decay,
    seed and output folders), without ``NOT_HYPERPARAMETERS``."""
    from analysis.wd_sensitivity import _scalars     # one flattening of a config for both

    out = {k: v for k, v in _scalars(_config(run.get("config"))).items()
           if k not in NOT_HYPERPARAMETERS and not k.startswith(_NOT_HP_PREFIXES)
           and k.rsplit(".", 1)[-1] not in NOT_HYPERPARAMETERS}
    lr = run.get("lr")
    if lr is not None and not (isinstance(lr, float) and math.isnan(lr)):
        out["lr"] = float(lr)
    return out


def _fmt(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _runs_text(ids: list[int]) -> str:
    return ("run " if len(ids) == 1 else "runs ") + ", ".join(str(i) for i in sorted(ids))


def differences(runs: pd.DataFrame) -> list[str]:
    """What the runs of one group differ in besides weight decay and seed, one sentence each:
    ``"length: last step 150 (runs 1, 3), 100 (run 2)"``, ``"lr: 0.0003 (runs 1, 3), 0.001
    (run 2)"``. ``runs``: ``id`` or ``run_id``, and where known ``last_step``, ``lr``,
    ``config``. [] for runs that agree (or one run)."""
    if len(runs) < 2:
        return []
    id_col = "id" if "id" in runs.columns else "run_id"
    records = runs.to_dict("records")
    out = []
    if "last_step" in runs.columns:
        steps = {}
        for r in records:
            s = r.get("last_step")
            steps.setdefault("?" if s is None or (isinstance(s, float) and math.isnan(s)) else int(s), []).append(
                int(r[id_col]))
        if len(steps) > 1:
            out.append("length: last step " + ", ".join(
                f"{s} ({_runs_text(ids)})" for s, ids in sorted(steps.items(), key=lambda kv: str(kv[0]))))
    hps = [hyperparameters(r) for r in records]
    for key in sorted(set().union(*hps)):
        values: dict[str, list[int]] = {}
        for r, hp in zip(records, hps):
            values.setdefault(_fmt(hp[key]) if key in hp else "not logged", []).append(int(r[id_col]))
        if len(values) > 1:
            out.append(f"{key}: " + ", ".join(f"{v} ({_runs_text(ids)})" for v, ids in values.items()))
    return out
