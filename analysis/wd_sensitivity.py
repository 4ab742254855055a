"""Weight-decay sensitivity across runs that differ in weight decay and agree otherwise.

Inputs are plain DataFrames (the app reads them from the store):

* ``runs``: one row per run with ``run_id``, ``variant``, ``weight_decay`` and
  ``config`` (dict or JSON string; may be empty);
* ``points``: ``run_id, step, value`` of the validation loss (``val/loss``).

Grouping: runs are grouped by ``variant`` and by their ``config`` minus the
keys in ``IGNORED_KEYS`` (weight decay itself, seeds, output folders, run
names): everything but weight decay. A group's ``group`` label lists the
config entries that tell it apart from the other groups of its variant
(``"all"`` when the variant has one group).

Per group, with ``u = log10(weight_decay)`` over runs with ``weight_decay > 0``:

* ``slope``: d(final val loss)/du, robust linear fit (scikit-learn
  ``HuberRegressor``, ``alpha=0``, ``epsilon=1.35``) when there are >= 3 runs
  with >= 2 distinct ``u``; the two-point difference quotient with 2 runs;
  None with fewer.
* ``curvature``: d^2(final val loss)/du^2 = ``2 c2`` of a least-squares
  quadratic ``c0 + c1 u + c2 u^2``; needs >= 3 distinct ``u``.
* ``best_weight_decay``: the weight decay whose mean final val loss is lowest.
* per run: ``final_val_loss`` (last finite point), ``best_val_loss`` (min),
  ``spikes`` (rises more than ``spike_ratio`` above the best value seen so far,
  counted once per excursion) and ``diverged`` (a non-finite value, or final
  loss above ``diverge_ratio`` times the best).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
from sklearn.linear_model import HuberRegressor

from analysis.errors import AnalysisError

#: Config keys that do not define a group (besides weight decay itself).
IGNORED_KEYS = frozenset({
    "weight_decay", "wd", "seed", "out_dir", "output_dir", "run_dir", "logging_dir", "run_name",
    "name", "wandb_run_name", "wandb_project", "wandb_log", "exp_name", "tag", "tags", "init_from",
    "log_dir", "checkpoint_dir", "save_dir", "resume", "device", "threads", "num_workers",
    # when checkpoints are written or logs printed does not change the training
    "save_steps", "save_interval", "checkpoint_interval", "log_interval", "keep_checkpoints",
})

OUTPUT_COLUMNS = ["variant", "group", "weight_decays", "final_val_loss", "best_val_loss", "slope",
                  "curvature", "best_weight_decay", "n_runs", "run_ids", "spikes", "diverged"]


def _config(value) -> dict:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            return {}
    return dict(value) if isinstance(value, dict) else {}


def _scalars(cfg: dict) -> dict:
    """Scalar config entries that define a group (nested dicts flattened with dots)."""
    out = {}
    for key, val in cfg.items():
        if key in IGNORED_KEYS:
            continue
        if key == "files" and isinstance(val, dict):
            # Config files found beside a log ({file name: contents}): their
            # keys name the hyperparameters; the file name adds only noise.
            for inner in val.values():
                if isinstance(inner, dict):
                    for k2, v2 in _scalars(inner).items():
                        out.setdefault(k2, v2)
        elif isinstance(val, dict):
            for k2, v2 in _scalars(val).items():
                out[f"{key}.{k2}"] = v2
        elif isinstance(val, (str, int, float, bool)) or val is None:
            out[key] = val
        else:
            out[key] = json.dumps(val, sort_keys=True, default=str)
    return out


def run_curve_stats(values: np.ndarray, *, spike_ratio: float = 0.1,
                    diverge_ratio: float = 1.5) -> dict:
    """``final``, ``best``, ``spikes``, ``diverged`` of one loss curve (in step order)."""
    vals = np.asarray(values, dtype=float)
    finite = vals[np.isfinite(vals)]
    if finite.size == 0:
        return {"final": None, "best": None, "spikes": 0, "diverged": bool(vals.size)}
    best_so_far = math.inf
    spikes, in_spike = 0, False
    for x in vals:
        if not math.isfinite(x):
            continue
        if math.isfinite(best_so_far) and x > best_so_far * (1 + spike_ratio):
            if not in_spike:
                spikes += 1
            in_spike = True
        else:
            in_spike = False
        best_so_far = min(best_so_far, x)
    final, best = float(finite[-1]), float(finite.min())
    diverged = bool((~np.isfinite(vals)).any() or final > diverge_ratio * best)
    return {"final": final, "best": best, "spikes": spikes, "diverged": diverged}


def robust_slope(u: np.ndarray, y: np.ndarray) -> float | None:
    """d y / d u: Huber regression (>= 3 points, >= 2 distinct u) or two-point quotient."""
    u, y = np.asarray(u, float), np.asarray(y, float)
    if len(u) < 2 or len(np.unique(u)) < 2:
        return None
    if len(u) == 2:
        return float((y[1] - y[0]) / (u[1] - u[0]))
    model = HuberRegressor(alpha=0.0, epsilon=1.35, max_iter=1000).fit(u.reshape(-1, 1), y)
    return float(model.coef_[0])


def curvature(u: np.ndarray, y: np.ndarray) -> float | None:
    """Second derivative ``2 c2`` of a least-squares quadratic in ``u`` (>= 3 distinct u)."""
    u, y = np.asarray(u, float), np.asarray(y, float)
    if len(np.unique(u)) < 3:
        return None
    c2 = np.polyfit(u, y, 2)[0]
    return float(2 * c2)


def wd_sensitivity(runs: pd.DataFrame, points: pd.DataFrame, *, spike_ratio: float = 0.1,
                   diverge_ratio: float = 1.5) -> pd.DataFrame:
    """One row per (variant, group); columns ``OUTPUT_COLUMNS`` (see module docstring)."""
    for name, frame, cols in (("runs", runs, ("run_id", "variant", "weight_decay")),
                              ("points", points, ("run_id", "step", "value"))):
        missing = sorted(set(cols) - set(frame.columns))
        if missing:
            raise AnalysisError(f"wd_sensitivity: {name} frame lacks columns {missing}; "
                                f"found {sorted(frame.columns)}")
    runs = runs[runs["weight_decay"].notna()].copy()
    if runs.empty:
        return pd.DataFrame(columns=OUTPUT_COLUMNS)
    cfgs = runs["config"] if "config" in runs.columns else pd.Series([{}] * len(runs), index=runs.index)
    runs["_key"] = [_scalars(_config(c)) for c in cfgs]

    curves = {rid: g.sort_values("step")["value"].to_numpy(dtype=float)
              for rid, g in points.groupby("run_id")}
    rows = []
    for variant, vruns in runs.groupby("variant", sort=True):
        keys = [json.dumps(k, sort_keys=True, default=str) for k in vruns["_key"]]
        vruns = vruns.assign(_gkey=keys)
        all_keys = set().union(*vruns["_key"])
        varying = sorted(k for k in all_keys
                         if len({json.dumps(d.get(k), default=str) for d in vruns["_key"]}) > 1)
        for gkey, grp in vruns.groupby("_gkey", sort=True):
            cfg = json.loads(gkey)
            label = ", ".join(f"{k}={cfg.get(k)}" for k in varying) or "all"
            grp = grp.sort_values(["weight_decay", "run_id"])
            wds, finals, bests, spikes, diverged, ids = [], [], [], [], [], []
            for r in grp.itertuples():
                st = run_curve_stats(curves.get(r.run_id, np.array([])), spike_ratio=spike_ratio,
                                     diverge_ratio=diverge_ratio)
                wds.append(float(r.weight_decay))
                finals.append(st["final"])
                bests.append(st["best"])
                spikes.append(st["spikes"])
                diverged.append(st["diverged"])
                ids.append(int(r.run_id))
            fit = [(math.log10(w), f) for w, f in zip(wds, finals) if w > 0 and f is not None]
            u = np.array([p[0] for p in fit])
            y = np.array([p[1] for p in fit])
            means = pd.Series([f for f in finals], index=wds, dtype=float).groupby(level=0).mean().dropna()
            rows.append({
                "variant": variant, "group": label, "weight_decays": wds,
                "final_val_loss": finals, "best_val_loss": bests,
                "slope": robust_slope(u, y), "curvature": curvature(u, y),
                "best_weight_decay": float(means.idxmin()) if len(means) else None,
                "n_runs": len(ids), "run_ids": ids, "spikes": spikes, "diverged": diverged,
            })
    return pd.DataFrame(rows, columns=OUTPUT_COLUMNS)


def projection_norms_vs_wd(runs: pd.DataFrame, norms: pd.DataFrame) -> pd.DataFrame:
    """Projection norms of each run's latest checkpoint against weight decay.

    ``norms``: ``run_id, step, metric, value`` rows of the per-layer Frobenius
    norms (``norm_q``, ``norm_k``, ``norm_v``, ``norm_o``). Returns
    ``variant, weight_decay, run_id, step, metric, value`` with ``value`` the
    root-sum-square over layers (the whole model's projection norm) at the
    run's latest step.
    """
    cols = ["variant", "weight_decay", "run_id", "step", "metric", "value"]
    if norms.empty:
        return pd.DataFrame(columns=cols)
    last = norms[norms["step"] == norms.groupby("run_id")["step"].transform("max")]
    agg = (last.assign(sq=last["value"] ** 2).groupby(["run_id", "step", "metric"], as_index=False)["sq"]
           .sum())
    agg["value"] = np.sqrt(agg["sq"])
    out = agg.merge(runs[["run_id", "variant", "weight_decay"]], on="run_id")
    return out[cols].sort_values(["variant", "metric", "weight_decay"]).reset_index(drop=True)
