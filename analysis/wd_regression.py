"""Weight-decay sensitivity of a random sweep: the marginal effect of log10(wd) with the other
swept hyperparameters as covariates.

In a random (Optuna-like) sweep every run draws its own lr, weight decay and
dropout, so no two runs agree in everything but weight decay and the grouped
estimator of ``analysis.wd_sensitivity`` sees one run per group and no slope.
This module pools the runs of one variant instead and asks: holding the other
swept hyperparameters fixed, how does the run's final (or best) metric change
with log10(wd)?

Inputs per run: its weight decay, its metric value ``y`` (final or best,
chosen by the caller) and its config's scalar entries.

Design matrix (``build_design``):

* ``u = log10(wd)``, first column. Runs with ``wd = 0`` are excluded (log10 0
  is undefined; no floor is invented) and counted in ``n_excluded_wd0`` with a
  note; so are runs without a finite ``y``.
* covariates: every config key whose value varies over the runs kept, numeric
  (int, float, bool as 0/1, or a string that parses as a number) in every one
  of them. A varying key that is missing or not numeric in some run is not
  used and listed in ``unused`` with the reason; so is a key that is an
  identifier or counter (``NOT_HYPERPARAMETERS``: trial number, version,
  step, epoch) or names an outcome (``loss``, ``acc``, ``score``, a ``val_``
  prefix ...: it would explain the value by itself).
* transform: ``log10`` when every value is > 0 and either the key names a
  rate-like hyperparameter (its last dotted part is ``lr``, ``learning_rate``,
  ends in ``_lr``, or is ``eps``/``adam_eps``/``weight_decay``/``wd``), or its
  values span >= ``LOG_SPAN`` (100x) and are less skewed on the log scale than
  on their own (|sample skewness| of log10 x below that of x: drawn
  log-uniformly, like a batch size of 16..1024); otherwise the value itself
  (a dropout drawn uniformly from [0.001, 0.3] stays linear).
* collinearity: covariates are added in name order; one whose standardised
  column has |Pearson r| >= ``MAX_ABS_CORR`` (0.995) with ``u`` or an added
  covariate, or that does not raise the design's rank, is not used (it would
  make the wd coefficient unidentifiable), and ``unused`` says with what.

Linear model (``fit_linear``): ordinary least squares (scikit-learn
``LinearRegression``) of ``y`` on the standardised columns ``z_j = (x_j -
mean_j) / sd_j``; ``wd_coef = beta_u / sd_u`` is d y / d log10(wd) with the
covariates held fixed (units of the metric per decade of weight decay, the
same units as the grouped slope), ``wd_coef_std = beta_u`` per standard
deviation of log10(wd), ``r2`` the in-sample R^2. Interval: a case (pairs)
bootstrap (Efron & Tibshirani 1993, ch. 9.5): ``n_boot`` resamples of the runs
with replacement, the fit repeated on each (a resample whose design is
rank-deficient is skipped and counted out of ``n_boot_used``), and the
percentile interval at ``confidence`` (ch. 13). Needs ``>= MIN_REG_RUNS`` (8)
runs, ``>= MIN_REG_WDS`` (3) distinct weight decays > 0 and at least
``MIN_DOF`` (3) more runs than columns; otherwise every number is None and
``reason`` says why.

Partial dependence (``fit_partial_dependence``): a gradient-boosted tree
regressor (``GradientBoostingRegressor``, ``PD_PARAMS``, ``random_state=seed``)
of ``y`` on the same (untransformed-by-scaling) columns, and
``sklearn.inspection.partial_dependence`` on ``u`` (Friedman 2001, sec. 8.2):
``pd(u) = mean_i f(u, x_i,-u)``, the model's prediction averaged over the
runs' other hyperparameters, on ``PD_GRID`` points from the smallest to the
largest observed u (``method="brute"``, exact averages). Reported:
``pd_weight_decays`` (10^grid), ``pd_values``, ``pd_best_weight_decay`` (the
grid point whose pd is best for the metric's direction: lowest for a loss,
highest for an accuracy, ``analysis.directions``), ``pd_range`` (max - min of
pd) and ``pd_slope`` (least-squares slope of pd against the grid u, comparable
with ``wd_coef``, but shrunk toward 0: step functions flatten an effect at the
edges of the data, to about 0.5-0.95 x the true slope on 40-run sweeps, so the
partial dependence shows the shape and the linear coefficient is the number).
``linear_pd_values`` is the linear model's own partial
dependence on the same grid: ``mean(y) + wd_coef (u - mean(u))``.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from analysis.errors import AnalysisError

#: fewest runs (wd > 0, finite metric) for a regression
MIN_REG_RUNS = 8
#: fewest distinct weight decays > 0 for a regression
MIN_REG_WDS = 3
#: fewest residual degrees of freedom (runs - columns - intercept)
MIN_DOF = 3
#: a positive covariate spanning this ratio (max / min) or more is read on a log10 scale
LOG_SPAN = 100.0
#: a covariate this correlated with log10(wd) or an earlier covariate is not used
MAX_ABS_CORR = 0.995
#: grid points of the partial dependence
PD_GRID = 25
#: the tree model of the partial dependence (random_state is the caller's seed)
PD_PARAMS = dict(n_estimators=200, learning_rate=0.05, max_depth=2, min_samples_leaf=3, subsample=1.0)

#: config keys (their last dotted part) that are identifiers or progress counters, not hyperparameters
NOT_HYPERPARAMETERS = frozenset({"trial", "trial_id", "trial_number", "number", "id", "run_id", "version",
                                 "step", "global_step", "iter_num", "epoch", "current_epoch", "timestamp"})
#: a key naming an outcome (a metric the run reached) is not a covariate: it would explain the value by itself
_OUTCOME = re.compile(r"(^|_)(loss|nll|ppl|perplexity|acc|accuracy|score|metric|top1|top5|f1|auc)(_|$)|^(val|eval|test)_")

_RATE = re.compile(r"^(lr|learning_rate|.*_lr|lr_.*|eps|adam_eps|adam_epsilon|weight_decay|wd)$")

REGRESSION_KEYS = ["reason", "n_runs", "run_ids", "weight_decays", "values", "n_excluded_wd0",
                   "n_excluded_no_value", "excluded_run_ids", "note", "covariates", "unused", "wd_coef",
                   "wd_coef_ci_low", "wd_coef_ci_high", "wd_coef_std", "intercept", "r2", "n_boot",
                   "n_boot_used", "confidence", "direction", "pd_model", "pd_weight_decays", "pd_values",
                   "linear_pd_values", "pd_best_weight_decay", "pd_range", "pd_slope"]


def _number(value) -> float | None:
    """A config value as a float, or None when it is not a number (bools count as 0/1)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            x = float(value.strip())
        except ValueError:
            return None
        return x if math.isfinite(x) else None
    return None


def _skew(x: np.ndarray) -> float:
    """Sample skewness ``mean((x - mean)^3) / sd^3`` (0 for a constant)."""
    sd = x.std()
    return 0.0 if sd == 0 else float(((x - x.mean()) ** 3).mean() / sd ** 3)


def _log_scaled(name: str, values: np.ndarray) -> bool:
    """Read a covariate as log10: positive, and rate-like by name, or spanning >= ``LOG_SPAN`` and
    less skewed on the log scale (a log-uniform draw) than on its own (a uniform one)."""
    if not (values > 0).all():
        return False
    if _RATE.match(name.rsplit(".", 1)[-1].lower()):
        return True
    return values.max() / values.min() >= LOG_SPAN and abs(_skew(np.log10(values))) < abs(_skew(values))


def build_design(u: np.ndarray, configs: list[dict]) -> tuple[np.ndarray, list[dict], list[dict]]:
    """Covariate columns of the runs kept (see module docstring).

    ``u``: ``[n]`` log10(wd) of the runs; ``configs``: their scalar config entries
    (``wd_sensitivity._scalars``). Returns ``X`` ``[n, 1 + k]`` (``u`` first, then the k
    covariates, transformed but not standardised), ``covariates`` (``name, transform``
    per used column after ``u``) and ``unused`` (``name, reason``).
    """
    u = np.asarray(u, float)
    n = len(u)
    keys = sorted(set().union(*configs)) if configs else []
    cols, covariates, unused = [u], [], []
    for key in keys:
        raw = [cfg.get(key) for cfg in configs]
        if len({repr(v) for v in raw}) <= 1:
            continue  # the same in every run: not swept
        last = key.rsplit(".", 1)[-1].lower()
        if last in NOT_HYPERPARAMETERS:
            unused.append({"name": key, "reason": "an identifier or counter, not a hyperparameter"})
            continue
        if _OUTCOME.search(last):
            unused.append({"name": key, "reason": "names an outcome (a metric), not a hyperparameter"})
            continue
        nums = [_number(v) for v in raw]
        missing = sum(x is None for x in nums)
        if missing:
            unused.append({"name": key, "reason": f"missing or not a number in {missing} of {n} runs"})
            continue
        x = np.asarray(nums, float)
        if np.ptp(x) == 0:
            continue
        transform = "log10" if _log_scaled(key, x) else "linear"
        col = np.log10(x) if transform == "log10" else x
        clash = None
        for prev, name in zip(cols, ["log10(weight_decay)"] + [c["name"] for c in covariates]):
            r = np.corrcoef(col, prev)[0, 1]
            if abs(r) >= MAX_ABS_CORR:
                clash = f"collinear with {name} (|r| = {abs(r):.3f})"
                break
        if clash is None:
            z = np.stack([(c - c.mean()) / c.std() for c in cols + [col]], axis=1)  # [n, m]
            if np.linalg.matrix_rank(np.column_stack([np.ones(n), z])) < z.shape[1] + 1:
                clash = "a combination of the other columns (the design's rank does not grow)"
        if clash is not None:
            unused.append({"name": key, "reason": clash})
            continue
        cols.append(col)
        covariates.append({"name": key, "transform": transform})
    return np.stack(cols, axis=1), covariates, unused


def _standardise(X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    mean, sd = X.mean(axis=0), X.std(axis=0)
    return (X - mean) / sd, mean, sd


def _ols(X: np.ndarray, y: np.ndarray):
    from sklearn.linear_model import LinearRegression  # here: scikit-learn loads only when a regression is fitted

    return LinearRegression().fit(X, y)


def ols_coefs(X: np.ndarray, y: np.ndarray, *, tol: float = 1e-10) -> np.ndarray:
    """Least-squares slopes of ``y ~ 1 + X`` for a batch of designs at once (the bootstrap's refits).

    ``X``: ``[B, n, m]``, ``y``: ``[B, n]``; returns ``[B, m]``, NaN rows where a design is
    rank-deficient (a column constant, or the smallest eigenvalue of the columns'
    correlation matrix below ``tol``). The same estimate as ``LinearRegression`` on the
    standardised columns (standardising rescales the slopes and nothing else).
    """
    Xc = X - X.mean(axis=1, keepdims=True)  # [B, n, m]
    yc = y - y.mean(axis=1, keepdims=True)  # [B, n]
    sd = np.sqrt((Xc ** 2).mean(axis=1))  # [B, m]
    ok = (sd > 0).all(axis=1)
    Z = Xc / np.where(sd > 0, sd, 1.0)[:, None, :]  # [B, n, m]
    corr = np.einsum("bnp,bnq->bpq", Z, Z) / X.shape[1]  # [B, m, m]
    ok &= np.linalg.eigvalsh(corr)[:, 0] > tol
    corr[~ok] = np.eye(X.shape[2])
    beta_z = np.linalg.solve(corr, np.einsum("bnp,bn->bp", Z, yc)[..., None] / X.shape[1])[..., 0]  # [B, m]
    beta = beta_z / np.where(sd > 0, sd, 1.0)
    beta[~ok] = np.nan
    return beta


def fit_linear(X: np.ndarray, y: np.ndarray, *, n_boot: int, confidence: float,
               rng: np.random.Generator) -> dict:
    """OLS of ``y`` on the standardised columns of ``X`` (``u`` first) and a case-bootstrap interval
    of the wd coefficient. Returns ``wd_coef, wd_coef_std, intercept, r2, coefs`` (per unit of each
    transformed column), ``wd_coef_ci_low/high``, ``n_boot_used``."""
    Z, mean, sd = _standardise(X)
    model = _ols(Z, y)
    beta = model.coef_ / sd  # per unit of each transformed column
    resid = y - model.predict(Z)
    tss = float(((y - y.mean()) ** 2).sum())
    out = {"wd_coef": float(beta[0]), "wd_coef_std": float(model.coef_[0]),
           "intercept": float(model.intercept_ - (beta * mean).sum()),  # y at every column = 0
           "r2": 1.0 - float((resid ** 2).sum()) / tss if tss > 0 else None, "coefs": beta.tolist()}
    n = X.shape[0]
    idx = rng.integers(0, n, size=(n_boot, n))  # runs drawn with replacement: [B, n]
    draws = ols_coefs(X[idx], y[idx])[:, 0]  # [B]
    draws = draws[np.isfinite(draws)]
    out["n_boot_used"] = len(draws)
    out["wd_coef_ci_low"] = out["wd_coef_ci_high"] = None
    if len(draws):
        lo, hi = np.quantile(draws, [(1 - confidence) / 2, 1 - (1 - confidence) / 2])
        out["wd_coef_ci_low"], out["wd_coef_ci_high"] = float(lo), float(hi)
    return out


def fit_partial_dependence(X: np.ndarray, y: np.ndarray, *, direction: str, seed: int,
                           grid: int = PD_GRID) -> dict:
    """Partial dependence of a gradient-boosted tree model's prediction on ``u = X[:, 0]``
    (see module docstring): ``pd_u`` (grid), ``pd_values``, ``pd_best_u``, ``pd_range``, ``pd_slope``."""
    # here: scikit-learn loads only when a regression is fitted
    from sklearn.ensemble import GradientBoostingRegressor
    from sklearn.inspection import partial_dependence

    model = GradientBoostingRegressor(random_state=seed, **PD_PARAMS).fit(X, y)
    res = partial_dependence(model, X, features=[0], kind="average", method="brute",
                             grid_resolution=grid, percentiles=(0.0, 1.0))
    gu = np.asarray(res["grid_values"][0], float)  # [g]
    pdv = np.asarray(res["average"][0], float)  # [g]
    pick = int(np.argmax(pdv) if direction == "max" else np.argmin(pdv))
    slope = float(np.polyfit(gu, pdv, 1)[0]) if len(gu) > 1 else None
    return {"pd_u": gu, "pd_values": pdv, "pd_best_u": float(gu[pick]), "pd_range": float(pdv.max() - pdv.min()),
            "pd_slope": slope}


def pd_model_name(seed: int) -> str:
    params = ", ".join(f"{k}={v}" for k, v in PD_PARAMS.items())
    return f"GradientBoostingRegressor({params}, random_state={seed})"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def wd_regression(run_ids, wds, values, configs: list[dict], *, direction: str = "min", n_boot: int = 1000,
                  confidence: float = 0.95, seed: int = 0, rng: np.random.Generator | None = None) -> dict:
    """The marginal effect of log10(wd) on ``values`` over one variant's runs (module docstring).

    ``run_ids``, ``wds``, ``values`` (None or NaN: no value), ``configs`` (scalar config
    entries): one entry per run. ``direction``: ``"min"`` or ``"max"`` (which pd value is
    best). Returns a dict with the keys of ``REGRESSION_KEYS``: ``run_ids``,
    ``weight_decays``, ``values`` of the runs used; ``covariates`` (``name, transform,
    coef`` per unit of the transformed covariate); ``unused``; ``note`` on the excluded
    runs; the linear fit, its interval and the partial dependence (None, with
    ``reason``, when there are too few runs).
    """
    if direction not in ("min", "max"):
        raise AnalysisError(f"wd_regression: direction must be 'min' or 'max', got {direction!r}")
    if not (len(run_ids) == len(wds) == len(values) == len(configs)):
        raise AnalysisError(f"wd_regression: run_ids, wds, values, configs differ in length "
                            f"({len(run_ids)}, {len(wds)}, {len(values)}, {len(configs)})")
    rng = np.random.default_rng(seed) if rng is None else rng
    out = dict.fromkeys(REGRESSION_KEYS)
    out.update(n_boot=n_boot, confidence=confidence, direction=direction, covariates=[], unused=[],
               pd_model=pd_model_name(seed))
    wd = np.asarray(wds, float)
    y = np.array([np.nan if v is None else v for v in values], float)
    has_value = np.isfinite(y)
    zero = has_value & (wd == 0)
    keep = has_value & (wd > 0) & np.isfinite(wd)
    ids = [int(r) for r in run_ids]
    out["n_excluded_wd0"] = int(zero.sum())
    out["n_excluded_no_value"] = int((~has_value).sum())
    out["excluded_run_ids"] = [i for i, k in zip(ids, keep) if not k]
    notes = []
    if zero.any():
        notes.append(f"{_plural(int(zero.sum()), 'run')} at wd 0 left out (log10 0 is undefined)")
    if (~has_value).any():
        notes.append(f"{_plural(int((~has_value).sum()), 'run')} without a finite value left out")
    out["note"] = "; ".join(notes) or None
    out["run_ids"] = [i for i, k in zip(ids, keep) if k]
    out["weight_decays"], out["values"] = wd[keep].tolist(), y[keep].tolist()
    out["n_runs"] = int(keep.sum())
    n_wd = len(set(wd[keep].tolist()))
    if out["n_runs"] < MIN_REG_RUNS or n_wd < MIN_REG_WDS:
        out["reason"] = (f"{_plural(out['n_runs'], 'run')} at {_plural(n_wd, 'distinct weight decay')} > 0 "
                         f"with a value; a regression needs >= {MIN_REG_RUNS} runs at >= {MIN_REG_WDS} "
                         "weight decays > 0")
        return out
    u, yk = np.log10(wd[keep]), y[keep]
    X, covariates, unused = build_design(u, [c for c, k in zip(configs, keep) if k])
    out["unused"] = unused
    if out["n_runs"] - X.shape[1] - 1 < MIN_DOF:
        out["covariates"] = covariates
        out["reason"] = (f"{out['n_runs']} runs for {X.shape[1]} columns (log10 wd and "
                         f"{_plural(len(covariates), 'covariate')}) and an intercept; needs >= {MIN_DOF} more runs "
                         "than that")
        return out
    lin = fit_linear(X, yk, n_boot=n_boot, confidence=confidence, rng=rng)
    out["covariates"] = [dict(c, coef=b) for c, b in zip(covariates, lin["coefs"][1:])]
    for k in ("wd_coef", "wd_coef_ci_low", "wd_coef_ci_high", "wd_coef_std", "intercept", "r2", "n_boot_used"):
        out[k] = lin[k]
    pdp = fit_partial_dependence(X, yk, direction=direction, seed=seed)
    out["pd_weight_decays"] = (10.0 ** pdp["pd_u"]).tolist()
    out["pd_values"] = pdp["pd_values"].tolist()
    out["linear_pd_values"] = (yk.mean() + lin["wd_coef"] * (pdp["pd_u"] - u.mean())).tolist()
    out["pd_best_weight_decay"] = 10.0 ** pdp["pd_best_u"]
    out["pd_range"], out["pd_slope"] = pdp["pd_range"], pdp["pd_slope"]
    return out


def choose_method(groups: pd.DataFrame | list[dict], n_fit_runs: int) -> tuple[str, str]:
    """``("grouped" | "regression", reason)`` for one variant's groups (rows of ``wd_sensitivity``).

    Rule: with ``covered`` the runs (with a value) in groups that have runs at >= 2
    distinct weight decays, and ``total`` the variant's runs with a value, the
    regression is chosen when ``covered < total / 2`` (under half of the runs can
    be compared at another weight decay with everything else equal) and
    ``n_fit_runs`` (runs with wd > 0 and a value) >= ``MIN_REG_RUNS``; otherwise the
    grouped estimator is kept.
    """
    rows = groups.to_dict("records") if isinstance(groups, pd.DataFrame) else list(groups)
    covered = total = 0
    for r in rows:
        vals = r["final_val_loss"] if r.get("statistic", "final") == "final" else r["best_val_loss"]
        with_value = [w for w, v in zip(r["weight_decays"], vals) if v is not None and v == v]
        total += len(with_value)
        if len(set(with_value)) >= 2:
            covered += len(with_value)
    share = f"{covered} of {total} runs are in groups with runs at >= 2 weight decays"
    if total == 0:
        return "grouped", "no run with a value"
    if 2 * covered >= total:
        return "grouped", share + " (at least half): grouped"
    if n_fit_runs < MIN_REG_RUNS:
        return "grouped", (share + f" (under half), but {_plural(n_fit_runs, 'run')} with wd > 0: a regression "
                           f"needs >= {MIN_REG_RUNS}; grouped")
    return "regression", share + " (under half): regression over the variant's runs"
