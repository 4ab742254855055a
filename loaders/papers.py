"""Reads for the Papers page: what ``analysis.paper_claims.measure`` sets beside each claim.

One function, :func:`paper_inputs`, reads the checkpoints compared (every
stored checkpoint, or each run's latest one plus the checkpoints no run owns),
their stored analysis results with chance levels and token counts (latest
metric version; ``chance`` may be NULL in databases analysed before chance
levels existed), every run with its final value of the loss metric (from
``run_stats``) and the head counts and MLP ratio its checkpoints or config
record, and the loss points the weight-decay statistics need.
"""
from __future__ import annotations

import pandas as pd

from analysis import paper_claims
from analysis.paper_claims import loss_unit
from loaders import curves
from loaders.logs import list_runs
from loaders.projects import NO_PROJECT
from loaders.run_table import run_facts
from loaders.store import Store

#: The stored metrics the claims compare against: what ``analysis.paper_claims``' measurements read.
METRICS = paper_claims.METRICS
SCOPES = ("latest", "all")

_CHECKPOINT_COLUMNS = ["id", "run_id", "step", "variant", "n_layers", "n_heads", "n_kv_heads", "d_model",
                       "d_head", "attn_scale", "params_total", "params_attention", "kv_bytes_per_token", "project"]
_RESULT_COLUMNS = ["checkpoint_id", "variant", "layer", "head", "metric", "value", "chance", "n_tokens",
                   "ci_low", "ci_high"]
_RUN_COLUMNS = ["run_id", "name", "project", "variant", "n_kv_heads", "n_heads", "d_model", "n_layers",
                "weight_decay", "seed", "mlp_ratio", "loss_unit", "config", "final"]


def _config_value(cfg: dict, keys: tuple[str, ...]):
    """The first of ``keys`` in a run config, at the top level or in a config file found beside the log."""
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    for inner in (cfg.get("files") or {}).values():
        if isinstance(inner, dict):
            for key in keys:
                if inner.get(key) is not None:
                    return inner[key]
    return None


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _image_runs(store: Store) -> set[int]:
    """Runs whose config says ``task: image`` (vision runs): the papers' claims compared here are
    language-model claims (perplexity, a 300M LM's weights), so these stay out of the comparison."""
    return {int(r["id"]) for r in list_runs(store) if (r.get("config") or {}).get("task") == "image"}


def _in_projects(frame: pd.DataFrame, projects) -> pd.DataFrame:
    """``frame``'s rows whose ``project`` is one of ``projects`` (every row for None or [])."""
    if not projects:
        return frame
    return frame[frame["project"].isin(list(projects))].reset_index(drop=True)


def compared_checkpoints(store: Store, scope: str = "latest", projects=None) -> pd.DataFrame:
    """``_CHECKPOINT_COLUMNS`` of the checkpoints compared: ``all``, or ``latest`` (each run's
    highest-step checkpoint, plus every checkpoint linked to no run), of ``projects`` (all for
    None); checkpoints of vision runs (``_image_runs``) are left out. ``project`` is
    ``loaders.projects.NO_PROJECT`` for a checkpoint without one."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    where = "" if scope == "all" else """
        WHERE c.run_id IS NULL OR c.id IN (
            SELECT arg_max(id, coalesce(step, -1)) FROM checkpoints WHERE run_id IS NOT NULL GROUP BY run_id)"""
    with store.connect() as con:
        frame = con.execute(f"SELECT {', '.join('c.' + c for c in _CHECKPOINT_COLUMNS[:-1])}, "
                            f"coalesce(c.project, ?) AS project FROM checkpoints c"
                            f"{where} ORDER BY c.id", [NO_PROJECT]).df()
    frame = _in_projects(frame, projects)
    image = _image_runs(store)
    return frame[~frame["run_id"].isin(image)].reset_index(drop=True) if image else frame


def stored_results(store: Store, checkpoint_ids, metric_version: int, metrics=METRICS) -> pd.DataFrame:
    """``_RESULT_COLUMNS`` of these checkpoints' stored ``metrics`` at ``metric_version``."""
    ids = [int(i) for i in checkpoint_ids]
    if not ids:
        return pd.DataFrame(columns=_RESULT_COLUMNS)
    sql = """
    SELECT a.checkpoint_id, c.variant, a.layer, a.head, a.metric, a.value, a.chance, a.n_tokens,
           a.ci_low, a.ci_high
    FROM analysis_results a JOIN checkpoints c ON c.id = a.checkpoint_id
    WHERE a.checkpoint_id IN (SELECT unnest($ids)) AND a.metric_version = $v
      AND a.metric IN (SELECT unnest($metrics))
    ORDER BY a.checkpoint_id, a.metric, a.layer, a.head"""
    with store.connect() as con:
        return con.execute(sql, {"ids": ids, "v": int(metric_version), "metrics": list(metrics)}).df()


def runs_with_finals(store: Store, loss_metric: str = "val/loss", projects=None) -> pd.DataFrame:
    """``_RUN_COLUMNS``: every language run of ``projects`` (all for None; vision runs left out), its final finite ``loss_metric`` (NaN when it logged none), its head
    count (from a linked checkpoint, else its config), its MLP ratio (config ``mlp_ratio``) and what its
    loss is per (``analysis.paper_claims.loss_unit`` of its config's vocabulary size and tokenizer)."""
    runs = [r for r in list_runs(store) if (r.get("config") or {}).get("task") != "image"
            and (not projects or (r["project"] or NO_PROJECT) in projects)]
    if not runs:
        return pd.DataFrame(columns=_RUN_COLUMNS)
    finals = curves.final_values(store, loss_metric).set_index("run_id")["final"]
    with store.connect() as con:
        heads = dict(con.execute("SELECT run_id, any_value(n_heads) FROM checkpoints WHERE run_id IS NOT NULL "
                                 "GROUP BY run_id").fetchall())
    rows = []
    for r in runs:
        cfg = r.get("config") or {}
        n_heads = heads.get(r["id"]) or _number(_config_value(cfg, ("n_head", "n_heads", "num_heads",
                                                                    "num_attention_heads")))
        facts = run_facts(cfg)
        rows.append({"run_id": r["id"], "name": r["name"], "project": r["project"] or NO_PROJECT,
                     "d_model": facts["d_model"], "n_layers": facts["n_layers"],
                     "variant": r["variant"], "n_kv_heads": r["n_kv_heads"],
                     "n_heads": n_heads, "weight_decay": r["weight_decay"], "seed": r["seed"],
                     "mlp_ratio": _number(_config_value(cfg, ("mlp_ratio",))),
                     "loss_unit": loss_unit(_config_value(cfg, ("vocab_size", "n_vocab", "padded_vocab_size")),
                                            _config_value(cfg, ("tokenizer", "tokenizer_name",
                                                                "tokenizer_name_or_path"))),
                     "config": cfg,
                     "final": finals.get(r["id"], float("nan"))})
    return pd.DataFrame(rows, columns=_RUN_COLUMNS)


def loss_metrics(store: Store) -> list[str]:
    """Logged loss metrics, validation first (the choices for the comparison)."""
    names = curves.metric_names(store)
    losses = [m for m in names if "loss" in m.lower()]
    return [m for m in ("val/loss", "train/loss") if m in losses] + [m for m in losses
                                                                      if m not in ("val/loss", "train/loss")]


def paper_inputs(store: Store, *, metric_version: int, scope: str = "latest", loss_metric: str = "val/loss",
                 projects=None) -> dict:
    """Everything ``analysis.paper_claims.measure`` needs, read from ``store`` (the runs and
    checkpoints of ``projects``; all for None): the keyword arguments of
    ``analysis.paper_claims.Inputs`` (``checkpoints, results, runs, points, loss_metric``), the
    results those stored at ``metric_version``."""
    checkpoints = compared_checkpoints(store, scope, projects)
    runs = runs_with_finals(store, loss_metric, projects)
    points = curves.StoredCurves(store, loss_metric, tuple(int(r) for r in runs["run_id"]))
    return {"checkpoints": checkpoints, "results": stored_results(store, checkpoints["id"].tolist(), metric_version),
            "runs": runs, "points": points, "loss_metric": loss_metric}
