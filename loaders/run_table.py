"""Stored runs as one table, with what each run's config says about its task and geometry.

``run_table(store)`` is the one reader behind the Experiments, Results and Weight decay
pages: ``loaders.logs.list_runs`` (overrides applied) as a DataFrame, ``project`` filled with
``loaders.projects.NO_PROJECT`` where a run has none, ``name`` the run's display name, unique in
the database (``loaders.run_names``; the stored name is ``stored_name``), plus per run

* ``task``: ``config["task"]``, ``"language"`` when the config names none
  (``DEFAULT_TASK``);
* ``n_heads``, ``n_layers``, ``d_model``, ``d_head``: from the config (``run_facts``);
  ``n_kv_heads``: the run's own (with the user's corrections), the config where it has none;
* ``condition``: the paper's own name for the run's condition where ingest kept one
  (``config["paper_condition"]``, paper B's file tags: ``"QVV(3)"``), else None;
* with ``geometry=True``: its latest checkpoint's geometry (``loaders.curves.run_geometry``),
  which wins over the config's (it is what was trained), and ``dtype``,
  ``params_attention``, ``kv_bytes_per_token``.

``run_facts(config)`` reads one config: top level, the papers' nestings
(``model_config`` / ``model_args`` / ``model``), then each file ingest read beside the
log (``{"files": {"config.json": {...}}}``).
"""
from __future__ import annotations

import math

import pandas as pd

from loaders.curves import run_geometry
from loaders.logs.runs import RUN_FIELDS, list_runs
from loaders.projects import NO_PROJECT
from loaders.run_names import display_names
from loaders.store import Store

#: Task of a run whose config names none.
DEFAULT_TASK = "language"
#: Config keys read for each geometry fact, first match wins.
_KEYS = {
    "n_heads": ("n_head", "n_heads", "num_attention_heads", "num_heads"),
    "n_kv_heads": ("n_kv_heads", "n_kv_head", "num_key_value_heads", "n_query_groups", "kv_heads"),
    "n_layers": ("n_layer", "n_layers", "num_hidden_layers", "num_layers", "depth"),
    "d_model": ("d_model", "n_embd", "hidden_size", "dim", "embed_dim"),
    "d_head": ("d_head", "head_dim", "head_size"),
}
#: Columns ``run_table`` adds to ``list_runs``' fields.
FACT_COLUMNS = ("task", "n_heads", "n_layers", "d_model", "d_head", "condition")
#: Columns ``run_table(geometry=True)`` takes from the latest checkpoint.
GEOMETRY_COLUMNS = ("n_heads", "n_kv_heads", "n_layers", "d_model", "d_head")
CHECKPOINT_COLUMNS = ("dtype", "params_attention", "kv_bytes_per_token")


def _num(v) -> int | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(f) if math.isfinite(f) and f > 0 else None


def _scopes(config: dict) -> list[dict]:
    """The dicts of a run config to read, in order: itself, its ``model_config`` / ``model_args`` /
    ``model`` (the papers' nestings), then each file's contents under ``files`` (as ingest keeps
    them: ``{"files": {"config.json": {...}}}``) with their nestings."""
    out = []
    for d in [config] + [v for v in (config.get("files") or {}).values() if isinstance(v, dict)]:
        out.append(d)
        out.extend(d[k] for k in ("model_config", "model_args", "model") if isinstance(d.get(k), dict))
    return out


def run_facts(config: dict | None) -> dict:
    """``task, n_heads, n_kv_heads, n_layers, d_model, d_head`` from a run config (``_scopes``:
    top level, the papers' nestings, the files ingest read); None where absent.
    ``task`` is ``config["task"]`` (``"language"`` when missing); ``n_kv_heads`` defaults to
    ``n_heads`` (no head sharing stated) and ``d_head`` to ``d_model / n_heads``."""
    config = config if isinstance(config, dict) else {}
    scopes = _scopes(config)
    out: dict = {}
    for field, names in _KEYS.items():
        out[field] = next((_num(s[n]) for s in scopes for n in names if n in s and _num(s[n]) is not None), None)
    task = next((s["task"] for s in scopes if isinstance(s.get("task"), str) and s["task"].strip()), None)
    out["task"] = task.strip() if task else DEFAULT_TASK
    if out["n_kv_heads"] is None:
        out["n_kv_heads"] = out["n_heads"]
    if out["d_head"] is None and out["d_model"] and out["n_heads"] and out["d_model"] % out["n_heads"] == 0:
        out["d_head"] = out["d_model"] // out["n_heads"]
    return out


def _condition(config) -> str | None:
    value = config.get("paper_condition") if isinstance(config, dict) else None
    text = str(value).strip() if value is not None else ""
    return text or None


def with_facts(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (``list_runs`` rows: ``config``, ``n_kv_heads``) with ``FACT_COLUMNS`` added and
    ``n_kv_heads`` filled from the config where the run has none."""
    out = frame.copy()
    configs = out["config"] if "config" in out.columns else pd.Series([None] * len(out), index=out.index)
    facts = pd.DataFrame([run_facts(c) for c in configs], index=out.index,
                         columns=["task", "n_heads", "n_kv_heads", "n_layers", "d_model", "d_head"])
    for col in ("task", "n_heads", "n_layers", "d_model", "d_head"):
        out[col] = facts[col]
    own = out["n_kv_heads"] if "n_kv_heads" in out.columns else pd.Series([None] * len(out), index=out.index)
    # the run's own n_kv_heads (with the user's corrections) wins; the config fills gaps
    out["n_kv_heads"] = own.where(own.notna(), facts["n_kv_heads"])
    out["condition"] = [_condition(c) for c in configs]
    return out


def run_table(store: Store, *, geometry: bool = False) -> pd.DataFrame:
    """Every stored run (``loaders.logs.list_runs``: id order, overrides applied) with
    ``FACT_COLUMNS``; with ``geometry`` its latest checkpoint's ``GEOMETRY_COLUMNS`` win over the
    config's and ``CHECKPOINT_COLUMNS`` are added (None for a run without a checkpoint).
    No runs: an empty frame with those columns."""
    runs = list_runs(store)
    frame = pd.DataFrame(runs) if runs else pd.DataFrame(columns=list(RUN_FIELDS))
    frame = with_facts(frame)
    frame["project"] = frame["project"].where(frame["project"].notna(), NO_PROJECT) if len(frame) else frame["project"]
    # names unique in the database (loaders.run_names); the stored one stays as stored_name
    frame["stored_name"] = frame["name"]
    if len(frame):
        shown = display_names(frame["id"], frame["name"], frame["source"])
        frame["name"] = [shown[int(i)] for i in frame["id"]]
    if not geometry:
        return frame
    geo = run_geometry(store)
    ck = frame[["id"]].merge(geo.rename(columns={"run_id": "id"}), on="id", how="left").set_index(frame.index)
    for col in GEOMETRY_COLUMNS:
        # a checkpoint's geometry is what was trained; the config fills runs without one
        frame[col] = ck[col].where(ck[col].notna(), frame[col]) if col in ck.columns else frame[col]
    for col in CHECKPOINT_COLUMNS:
        frame[col] = ck[col] if col in ck.columns else None
    return frame
