"""Weight-decay sensitivity across runs that differ in weight decay and agree otherwise.

Inputs are plain DataFrames (the app reads them from the store):

* ``runs``: one row per run with ``run_id``, ``variant``, ``weight_decay`` and
  ``config`` (dict or JSON string; may be empty), optionally ``lr``;
* ``points``: ``run_id, step, value`` of the validation loss (``val/loss``), or
  the same curves as an iterable of ``(run_id, values in step order)``
  (``loaders.curves.metric_curves`` streams them from the store, one run at a
  time, so 100M logged points never sit in one frame).

Grouping: runs are first split into comparable sets (``analysis.comparable.group_key``:
project, task, geometry, variant, head sharing; each set's statistics and regression are its
own, ``project`` names it in every row), then grouped by their ``config`` minus the
keys in ``IGNORED_KEYS`` (weight decay itself, seeds, output folders, run
names): everything but weight decay. A group's ``group`` label lists the
config entries that tell it apart from the other groups of its variant
(``"all"`` when the variant has one group): its task first when the variant has
runs of several tasks, then at most ``LABEL_KEYS`` entries ("+N more").

Per run: ``final_val_loss`` (last finite point), ``best_val_loss`` (min),
``spikes`` (rises more than ``spike_ratio`` above the best value seen so far,
counted once per excursion) and ``diverged`` (a non-finite value, or final
loss above ``diverge_ratio`` times the best). The loss the statistics below
use is the final one (``statistic="final"``, the default) or the best one.
Direction (``direction``, from the metric's name by ``analysis.directions``):
for a higher-is-better metric (accuracy) best is the max, a spike a fall
below ``(1 - spike_ratio)`` x the best so far, diverged a final value below
best / ``diverge_ratio``, and the best weight decay has the highest mean; the
column names keep ``loss``.

Method (``method``, ``method_reason``, ``regression``): in a random sweep no
two runs agree in everything but weight decay, so each group holds one run.
Per variant, ``analysis.wd_regression.choose_method`` picks ``"regression"``
when under half of the variant's runs (with a value) sit in groups with runs
at >= 2 distinct weight decays and >= 8 runs have wd > 0; ``regression`` is
then ``analysis.wd_regression.wd_regression`` of all the variant's runs (the
other swept config keys, and the run's ``lr``, as covariates), the same dict
in every row of the variant. Otherwise ``"grouped"`` and ``regression`` None.

Per group, with ``u = log10(weight_decay)`` over the runs with
``weight_decay > 0`` (wd 0 has no log10, so it takes part in the best wd
only), fitted to every run's loss (repeated runs at one wd all count):

* ``slope``: d loss / du of a robust line ``b0 + b1 u`` (Huber M-estimate,
  ``huber_fit``); ``curvature``: d^2 loss / du^2 = ``2 c2`` of a robust
  quadratic ``c0 + c1 u + c2 u^2``. Both need >= ``MIN_FIT_WDS`` (3) distinct
  weight decays > 0 (two points always lie on a line, so a slope from two
  weight decays says nothing about its own reliability); otherwise None and
  ``fit_reason`` says why.
* ``best_weight_decay``: the weight decay whose mean loss over its runs is
  lowest; needs >= 2 runs at >= 2 distinct weight decays (else None and
  ``best_reason``).
* ``per_wd``: one dict per distinct weight decay: ``weight_decay, n_runs``
  (runs with a finite loss), ``mean``, ``ci_low, ci_high``, ``n_diverged``,
  ``n_spiky``, ``run_ids``; ``n_wd`` distinct weight decays, ``n_wd_fit`` of them
  > 0, ``n_wd_repeated`` with more than one run.

Uncertainty (only where more than one run shares a weight decay, e.g. seeds;
else None and ``interval_reason``), ``confidence`` 0.95, seeded per group from
``seed`` and the group's name, so the numbers do not change when other groups
are filtered out:

* ``ci_low, ci_high`` of a weight decay's mean: the t interval of its runs
  (``analysis.intervals.mean_interval``, ``n - 1`` degrees of freedom). With 2-3
  seeds a percentile bootstrap cannot reach past the runs' min and max and
  covers 0.5-0.8 of simulated sweeps; the t interval is exact for normal seed noise.
* ``slope_ci_*``, ``curvature_ci_*``: the robust fit -+ ``t_{n-p}`` times the
  standard error of ``n_boot`` wild-bootstrap refits (``_wild_se``: Rademacher
  signs on the fit's residuals rescaled by ``1 / (1 - h)``, HC3; ``n`` runs at wd > 0,
  ``p`` the fit's coefficients).
* ``best_wd_share``, ``best_wd_ci_*``: ``n_boot`` draws of the true means from their
  posterior under a nonparametric empirical-Bayes prior (``best_draws``: normal seed
  noise with the pooled within-weight-decay variance ``s^2``, ``sigma^2 ~ s^2 df / chi2_df``,
  ``df = sum_j (n_j - 1)``; the prior the discrete distribution that best explains the
  means, fitted by EM on a grid): the share of draws whose best weight decay is
  ``best_weight_decay``, and the 2.5/97.5% quantiles of the draws' best weight decay.
  Calibrated on simulated sweeps (``bench/interval_coverage.py``): the mean claimed share
  is within 0.07 of the rate at which the reported weight decay is the true best, both
  where the best weight decays are tied (a bowl) and where the true means scatter; a
  normal prior (its spread set by the means' spread, Efron & Morris 1973) claimed 0.71
  in the bowl where the reported one was right 0.47-0.54 of the time (docs/statistics.md).

A weight decay with one run contributes no spread (and no degrees of freedom),
so these intervals hold the seed-to-seed spread only where it was measured.
"""
from __future__ import annotations

import json
import math
import re
import zlib

import numpy as np
import pandas as pd

from analysis.comparable import group_keys
from analysis.directions import direction
from analysis.errors import AnalysisError
from analysis.intervals import CONFIDENCE, N_BOOT, mean_interval, percentile_interval, t_quantile
from analysis.wd_regression import choose_method, wd_regression

#: Config keys that do not define a group (besides weight decay itself).
IGNORED_KEYS = frozenset({
    "weight_decay", "wd", "seed", "out_dir", "output_dir", "run_dir", "logging_dir", "run_name",
    "name", "wandb_run_name", "wandb_project", "wandb_log", "exp_name", "tag", "tags", "init_from",
    "log_dir", "checkpoint_dir", "save_dir", "resume", "device", "threads", "num_workers",
    # when checkpoints are written or logs printed does not change the training
    "save_steps", "save_interval", "checkpoint_interval", "log_interval", "keep_checkpoints",
})



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
                    diverge_ratio: float = 1.5, direction: str = "min") -> dict:
    """``final``, ``best``, ``spikes``, ``diverged`` of one curve (in step order).

    ``direction`` ``"min"`` (a loss): best is the lowest value, a spike a rise above
    ``(1 + spike_ratio)`` x the best so far, diverged a final value above ``diverge_ratio``
    x the best. ``"max"`` (an accuracy): best is the highest, a spike a fall below
    ``(1 - spike_ratio)`` x the best so far, diverged a final value below best / ``diverge_ratio``.
    A non-finite value always means diverged.

    Spikes are counted on the finite values ``f_0, f_1, ...`` (a non-finite value neither
    starts nor ends one): ``f_i`` is worse when ``f_i > (1 + spike_ratio) min(f_0..f_{i-1})``
    (a loss), and a spike is a run of consecutive worse values, counted once. Whole-array
    operations (a running min, a shifted compare): a 50,000-step curve takes ~1 ms, where a
    Python loop over its values took ~27 ms (the Weight decay page reads 2,000 such curves).
    """
    vals = np.asarray(values, dtype=float)
    ok = np.isfinite(vals)
    finite = vals[ok]
    if finite.size == 0:
        return {"final": None, "best": None, "spikes": 0, "diverged": bool(vals.size)}
    higher = direction == "max"
    # the best value before each finite value: none (+-inf) before the first
    prior = np.empty_like(finite)
    prior[0] = -math.inf if higher else math.inf
    (np.maximum if higher else np.minimum).accumulate(finite[:-1], out=prior[1:])
    with np.errstate(over="ignore", invalid="ignore"):     # a huge best times (1 + ratio) is inf, as in Python
        worse = (finite < prior * (1 - spike_ratio)) if higher else (finite > prior * (1 + spike_ratio))
    worse &= np.isfinite(prior)                            # [n]; never the first value
    spikes = int(np.count_nonzero(worse[1:] & ~worse[:-1]))
    final = float(finite[-1])
    best = float(finite.max() if higher else finite.min())
    far = final < best / diverge_ratio if higher else final > diverge_ratio * best
    diverged = bool(finite.size < vals.size or far)
    return {"final": final, "best": best, "spikes": spikes, "diverged": diverged}


def frame_curves(points: pd.DataFrame):
    """Each run's curve of a ``run_id, step, value`` frame: ``(run_id, values)`` in step order
    (a stable sort, so values logged at one step keep their order), runs in id order."""
    if points.empty:
        return
    p = points.sort_values(["run_id", "step"], kind="stable")
    ids, vals = p["run_id"].to_numpy(), p["value"].to_numpy(dtype=float)       # [n], [n]
    cuts = np.flatnonzero(ids[1:] != ids[:-1]) + 1                              # where a run starts
    for start, stop in zip(np.r_[0, cuts], np.r_[cuts, len(ids)]):
        yield ids[start], vals[start:stop]


#: fewest distinct weight decays > 0 from which a slope and a curvature are reported
MIN_FIT_WDS = 3
#: fewest runs (at >= 2 distinct weight decays) for a best weight decay
MIN_BEST_RUNS = 2
SEED = 0

OUTPUT_COLUMNS = ["project", "variant", "group", "weight_decays", "final_val_loss", "best_val_loss", "slope",
                  "curvature", "best_weight_decay", "n_runs", "run_ids", "spikes", "diverged",
                  # how sure: counts, intervals, and why a statistic is absent
                  "statistic", "n_wd", "n_wd_fit", "n_wd_repeated", "per_wd", "slope_ci_low", "slope_ci_high",
                  "curvature_ci_low", "curvature_ci_high", "best_wd_ci_low", "best_wd_ci_high",
                  "best_wd_share", "n_boot", "fit_reason", "best_reason", "interval_reason",
                  # which way is better, and the estimator for random sweeps (analysis.wd_regression)
                  "direction", "method", "method_reason", "regression"]


def huber_fit(X: np.ndarray, y: np.ndarray, *, epsilon: float = 1.35, max_iter: int = 500,
              tol: float = 1e-12) -> np.ndarray:
    """Huber M-estimate of ``beta`` in ``y ~ X beta`` (Huber 1964), by iteratively
    reweighted least squares (Holland & Welsch 1977).

    Residuals ``r = y - X beta`` are scaled by ``s = median|r| / 0.6745`` (the MAD,
    consistent for Gaussian noise); a point weighs ``w = min(1, epsilon s / |r|)``,
    so points within ``epsilon s`` count fully and an outlier's pull is bounded.
    Exact data are fitted exactly (every weight 1); with no more points than
    columns the least-squares solution is returned. ``X``: ``[n, p]``; ``y``: ``[n]``,
    or ``[B, n]`` for B fits on the same ``X`` at once (wild-bootstrap refits),
    returning ``[B, p]``.
    """
    X, Y = np.asarray(X, float), np.asarray(y, float)
    single = Y.ndim == 1
    Y = Y[None] if single else Y  # [B, n]
    beta = np.linalg.lstsq(X, Y.T, rcond=None)[0].T  # [B, p]
    if X.shape[0] > X.shape[1]:
        floor = 1e-12 * (np.abs(Y).max(axis=1, keepdims=True) + 1.0)  # a scale of 0: the majority fits exactly
        active = np.arange(len(Y))  # fits not converged yet
        for _ in range(max_iter):
            Ya, ba, fa = Y[active], beta[active], floor[active]
            r = np.abs(Ya - ba @ X.T)  # [b, n]
            scale = np.maximum(np.median(r, axis=1, keepdims=True) / 0.6745, fa)
            w = np.minimum(1.0, epsilon * scale / np.maximum(r, fa))  # [b, n]
            gram = np.einsum("bn,np,nq->bpq", w, X, X)  # X^T W X: [b, p, p]
            new = np.linalg.solve(gram, np.einsum("bn,np->bp", w * Ya, X)[..., None])[..., 0]  # [b, p]
            done = np.abs(new - ba).max(axis=1) <= tol * (1.0 + np.abs(ba).max(axis=1))
            beta[active] = new
            active = active[~done]
            if not len(active):
                break
    return beta[0] if single else beta


def _design(u: np.ndarray, degree: int) -> np.ndarray:
    """``[1, u, (u^2)]`` columns of centred u (centring changes neither the slope nor ``c2``): [n, degree+1]."""
    uc = u - u.mean()
    return np.stack([uc ** k for k in range(degree + 1)], axis=1)


def robust_slope(u: np.ndarray, y: np.ndarray) -> float | np.ndarray | None:
    """d y / d u of a robust line (``huber_fit``); None with fewer than ``MIN_FIT_WDS`` distinct u.
    ``y``: ``[n]``, or ``[B, n]`` for B refits (returns ``[B]``)."""
    u, y = np.asarray(u, float), np.asarray(y, float)
    if len(np.unique(u)) < MIN_FIT_WDS:
        return None
    b1 = huber_fit(_design(u, 1), y)[..., 1]
    return float(b1) if y.ndim == 1 else b1


def curvature(u: np.ndarray, y: np.ndarray) -> float | np.ndarray | None:
    """``2 c2`` of a robust quadratic ``c0 + c1 u + c2 u^2`` (``huber_fit``); None with fewer
    than ``MIN_FIT_WDS`` distinct u. ``y``: ``[n]`` or ``[B, n]``."""
    u, y = np.asarray(u, float), np.asarray(y, float)
    if len(np.unique(u)) < MIN_FIT_WDS:
        return None
    c2 = huber_fit(_design(u, 2), y)[..., 2]
    return float(2 * c2) if y.ndim == 1 else 2 * c2


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _fit_reason(positive: list[float], has_zero: bool) -> str | None:
    if len(positive) >= MIN_FIT_WDS:
        return None
    listed = f" ({', '.join(f'{w:g}' for w in positive)})" if positive else ""
    text = (f"{_plural(len(positive), 'distinct weight decay')} > 0{listed}; "
            f"slope and curvature need >= {MIN_FIT_WDS}")
    return text + ("; wd 0 is left out of the fit (log10 0 is undefined)" if has_zero else "")


def _best_reason(n_runs: int, wds: list[float]) -> str | None:
    if n_runs >= MIN_BEST_RUNS and len(wds) >= 2:
        return None
    if n_runs < MIN_BEST_RUNS:
        return (f"{_plural(n_runs, 'run')} with a loss; a best weight decay needs >= {MIN_BEST_RUNS} runs "
                "at >= 2 weight decays")
    return f"all {n_runs} runs at wd {wds[0]:g}; a best weight decay needs >= 2 weight decays"


def group_statistics(wds, losses, *, n_boot: int = N_BOOT, confidence: float = CONFIDENCE,
                     rng: np.random.Generator | None = None, direction: str = "min") -> dict:
    """Slope, curvature, best wd, per-wd means and their intervals of one group.

    ``wds``, ``losses``: one entry per run (a loss of None or NaN: the run is left
    out). Returns the keys of ``OUTPUT_COLUMNS`` from ``slope`` on that these
    compute (see the module docstring), ``per_wd`` without run ids. ``direction``: ``"min"``
    (the best weight decay has the lowest mean) or ``"max"`` (the highest, for an accuracy).
    """
    pick_best = np.argmax if direction == "max" else np.argmin
    rng = np.random.default_rng(SEED) if rng is None else rng
    wd = np.asarray(wds, float)
    y = np.array([np.nan if v is None else v for v in losses], float)
    keep = np.isfinite(y) & np.isfinite(wd)
    wd, y = wd[keep], y[keep]
    levels = sorted(set(wd.tolist()))
    strata = [np.flatnonzero(wd == w) for w in levels]  # run positions per weight decay
    per_wd = []
    for w, idx in zip(levels, strata):
        row = {"weight_decay": w, "n_runs": len(idx), "mean": float(y[idx].mean()), "ci_low": None,
               "ci_high": None}
        if len(idx) > 1:
            row["ci_low"], row["ci_high"] = mean_interval(y[idx], confidence)
        per_wd.append(row)

    positive = [w for w in levels if w > 0]
    fit = wd > 0
    u = np.log10(wd[fit])
    out = {"slope": robust_slope(u, y[fit]), "curvature": curvature(u, y[fit]),
           "best_weight_decay": None, "n_wd": len(levels), "n_wd_fit": len(positive),
           "n_wd_repeated": sum(len(idx) > 1 for idx in strata), "per_wd": per_wd,
           "slope_ci_low": None, "slope_ci_high": None, "curvature_ci_low": None, "curvature_ci_high": None,
           "best_wd_ci_low": None, "best_wd_ci_high": None, "best_wd_share": None,
           "fit_reason": _fit_reason(positive, 0.0 in levels), "best_reason": _best_reason(len(y), levels),
           "interval_reason": None}
    means = np.array([p["mean"] for p in per_wd])
    if out["best_reason"] is None:
        out["best_weight_decay"] = levels[int(pick_best(means))]  # ties: the smaller weight decay
    if not any(len(idx) > 1 for idx in strata):
        out["interval_reason"] = ("one run per weight decay: an interval needs repeated runs (seeds) "
                                  "at a weight decay")
        return out
    counts = np.array([len(idx) for idx in strata])
    if out["best_weight_decay"] is not None:
        df = int((counts - 1).sum())
        pooled = sum(float(((y[idx] - y[idx].mean()) ** 2).sum()) for idx in strata) / df
        picks = np.asarray(levels)[best_draws(means, counts, pooled, df, n_boot, rng, pick_best)]  # [n_boot]
        out["best_wd_ci_low"], out["best_wd_ci_high"] = percentile_interval(picks, confidence, method="inverted_cdf")
        out["best_wd_share"] = float(np.mean(picks == out["best_weight_decay"]))
    if out["slope"] is not None and any(len(idx) > 1 for w, idx in zip(levels, strata) if w > 0):
        uf, yf = np.log10(wd[fit]), y[fit]
        for key, degree, fn in (("slope", 1, robust_slope), ("curvature", 2, curvature)):
            se = _wild_se(uf, yf, degree, fn, n_boot, rng)
            if se is not None:
                half = t_quantile(len(yf) - degree - 1, confidence) * se
                out[f"{key}_ci_low"], out[f"{key}_ci_high"] = out[key] - half, out[key] + half
    return out


#: ``best_draws``: draws of the seed noise's variance (each with its own prior fit), points of the
#: prior's grid (besides the means themselves) and EM steps of its fit.
SIGMA_DRAWS, PRIOR_GRID, EM_STEPS = 20, 100, 100


def best_draws(means: np.ndarray, counts: np.ndarray, pooled: float, df: int, n_boot: int,
               rng: np.random.Generator, pick_best=np.argmin) -> np.ndarray:
    """``n_boot`` draws of the best weight decay's index (``pick_best`` of the true means) from the means'
    posterior under a nonparametric empirical-Bayes prior (Kiefer & Wolfowitz 1956; Koenker & Mizera 2014;
    Efron's g-modeling): the means ``means: [k]`` of ``counts: [k]`` runs with normal seed noise of pooled
    variance ``pooled`` on ``df`` degrees of freedom.

    For each of ``SIGMA_DRAWS`` values ``sigma^2 = pooled df / chi2_df`` (the unknown variance's posterior,
    the t; at its midpoint quantiles, ``(i + 1/2) / SIGMA_DRAWS``), the prior ``G`` of the true means is the discrete distribution on a grid (``PRIOR_GRID``
    points spanning the means -+ 4 standard errors, plus the means) that maximises the marginal likelihood
    ``prod_j sum_a G(a) N(mean_j; a, sigma^2 / n_j)`` (``EM_STEPS`` EM steps from the uniform); each true
    mean is then drawn from its posterior over the grid, independently, ties broken at random. Unlike a
    normal prior, whose spread two far-off weight decays make wide, the fitted prior puts the tied best
    weight decays on one atom where the data cannot tell them apart, so the share of the reported one
    falls to what its rank is worth (the winner's curse); where the true means scatter it shrinks as a
    normal prior would. ``pooled`` 0 (identical repeated runs): every draw is the means' own best."""
    k = len(means)
    if not pooled > 0:
        return np.full(n_boot, int(pick_best(means)))
    # sigma^2 at the SIGMA_DRAWS midpoint quantiles of its posterior (stratified: no draw of the heavy
    # tail of chi2 with few df weighs 1/SIGMA_DRAWS by chance)
    chi2 = np.quantile(rng.chisquare(df, 4096), (np.arange(SIGMA_DRAWS) + 0.5) / SIGMA_DRAWS)
    sig2 = pooled * df / chi2                                                # [S]
    se = np.sqrt(sig2[:, None] / counts)                                     # [S, k]
    reach = 4 * se.max()
    grid = np.union1d(np.linspace(means.min() - reach, means.max() + reach, PRIOR_GRID), means)   # [G]
    step = float(np.diff(grid).min()) if len(grid) > 1 else 1.0
    # each mean's likelihood over the grid, scaled to a maximum of 1 (its own atom; the scale cancels)
    lik = np.exp(-0.5 * ((means[None, :, None] - grid) / se[:, :, None]) ** 2)             # [S, k, G]
    g = np.full((SIGMA_DRAWS, 1, len(grid)), 1 / len(grid))
    for _ in range(EM_STEPS + 1):
        post = lik * g
        post /= np.maximum(post.sum(2, keepdims=True), 1e-300)              # [S, k, G]: P(true mean j at a)
        g = post.mean(1, keepdims=True)
    per = -(-n_boot // SIGMA_DRAWS)
    u = rng.random((SIGMA_DRAWS, per, k, 1))
    atom = (u > post.cumsum(2)[:, None]).sum(-1).clip(max=len(grid) - 1)   # [S, per, k]
    mus = grid[atom] + rng.random(atom.shape) * (step * 1e-6)                # ties broken at random
    return pick_best(mus.reshape(-1, k)[:n_boot], axis=1)


def _wild_se(u: np.ndarray, y: np.ndarray, degree: int, fn, n_boot: int, rng: np.random.Generator) -> float | None:
    """Standard error of ``fn`` (``robust_slope`` or ``curvature``) by a wild bootstrap (Wu 1986;
    Davidson & Flachaire 2008): ``y* = X beta + w r / (1 - h)`` with ``beta`` the robust fit,
    ``r`` its residuals, ``h`` the design's leverages and Rademacher signs ``w``. The HC3 rescaling
    (MacKinnon & White 1985) rather than ``1 / sqrt(1 - h)``: with 8-15 runs a fit's residuals are
    shrunk by more than their leverage says, and ``/ sqrt(1 - h)`` covered 0.86 of simulated 2-seed
    sweeps (docs/statistics.md). None with no residual degrees of freedom."""
    X = _design(u, degree)
    if len(y) <= X.shape[1]:
        return None
    beta = huber_fit(X, y)
    lev = np.einsum("np,pq,nq->n", X, np.linalg.pinv(X.T @ X), X)
    r = (y - X @ beta) / np.clip(1 - lev, 1e-12, None)
    w = rng.choice([-1.0, 1.0], size=(n_boot, len(y)))
    return float(np.std(fn(u, X @ beta + w * r), ddof=1))


#: Most config entries a group's label names (the rest counted: "+12 more").
LABEL_KEYS = 3


def _group_label(cfg: dict, varying: list[str], peers: list[dict], *, by_task: bool) -> str:
    """What tells a group apart from the other groups of its variant: its task first where the
    variant has runs of several tasks (vision and language configs differ in dozens of keys),
    then the entries that vary among the groups of that task, at most ``LABEL_KEYS``; ``"all"``
    for a variant's only group."""
    parts, keys = [], varying
    if by_task:
        task = cfg.get("task") or "language"
        parts.append(str(task))
        same = [d for d in peers if (d.get("task") or "language") == task]
        keys = [k for k in varying if k != "task"
                and len({json.dumps(d.get(k), default=str) for d in same}) > 1]
    parts += [f"{k}={cfg.get(k)}" for k in keys[:LABEL_KEYS]]
    if len(keys) > LABEL_KEYS:
        parts.append(f"+{len(keys) - LABEL_KEYS} more")
    return ", ".join(parts) or "all"


def _group_rng(seed: int, variant, label: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(f"{variant}\x00{label}".encode())])


def wd_sensitivity(runs: pd.DataFrame, points, *, spike_ratio: float = 0.1,
                   diverge_ratio: float = 1.5, statistic: str = "final", n_boot: int = N_BOOT,
                   confidence: float = CONFIDENCE, seed: int = SEED, metric: str = "val/loss",
                   overrides: dict[str, str] | None = None, method: str = "auto") -> pd.DataFrame:
    """One row per (variant, group); columns ``OUTPUT_COLUMNS`` (see module docstring).

    ``statistic``: ``"final"`` or ``"best"``, which value of each run the slope,
    curvature, best wd and per-wd means use. ``metric`` (with ``overrides``) sets
    the direction (``analysis.directions``): for an accuracy the best value of a
    run and the best weight decay are the highest. ``method``: ``"auto"`` (per
    variant, ``analysis.wd_regression.choose_method``), ``"grouped"`` or
    ``"regression"`` (forced for every variant); ``regression`` holds the
    ``wd_regression`` of the variant's runs (the same dict in each of its rows)
    when the method is ``"regression"``, else None.
    """
    frames = [("runs", runs, ("run_id", "variant", "weight_decay"))]
    if isinstance(points, pd.DataFrame):
        frames.append(("points", points, ("run_id", "step", "value")))
    for name, frame, cols in frames:
        missing = sorted(set(cols) - set(frame.columns))
        if missing:
            raise AnalysisError(f"wd_sensitivity: {name} frame lacks columns {missing}; "
                                f"found {sorted(frame.columns)}")
    if statistic not in ("final", "best"):
        raise AnalysisError(f"wd_sensitivity: statistic must be 'final' or 'best', got {statistic!r}")
    if method not in METHODS:
        raise AnalysisError(f"wd_sensitivity: method must be one of {', '.join(METHODS)}, got {method!r}")
    if n_boot < 1 or not 0 < confidence < 1:
        raise AnalysisError(f"wd_sensitivity: need n_boot >= 1 and 0 < confidence < 1, "
                            f"got n_boot={n_boot}, confidence={confidence}")
    runs = runs[runs["weight_decay"].notna()].copy()
    if runs.empty:
        return pd.DataFrame(columns=OUTPUT_COLUMNS)
    cfgs = runs["config"] if "config" in runs.columns else pd.Series([{}] * len(runs), index=runs.index)
    runs["_key"] = [_scalars(_config(c)) for c in cfgs]
    way = direction(metric, overrides)

    # each run's final, best, spikes and divergence, one curve at a time (a stream holds no more)
    options = dict(spike_ratio=spike_ratio, diverge_ratio=diverge_ratio, direction=way)
    curves = frame_curves(points) if isinstance(points, pd.DataFrame) else points
    per_run = {rid: run_curve_stats(values, **options) for rid, values in curves}
    no_curve = run_curve_stats(np.array([]), **options)
    rows = []
    runs["_set"] = group_keys(runs)
    for (variant, _), vruns in runs.groupby(["variant", "_set"], sort=True):
        first = len(rows)
        project = vruns["project"].iloc[0] if "project" in vruns.columns else None
        keys = [json.dumps(k, sort_keys=True, default=str) for k in vruns["_key"]]
        vruns = vruns.assign(_gkey=keys)
        all_keys = set().union(*vruns["_key"])
        varying = sorted(k for k in all_keys
                         if len({json.dumps(d.get(k), default=str) for d in vruns["_key"]}) > 1)
        tasks = {json.dumps(d.get("task") or "language") for d in vruns["_key"]}
        for gkey, grp in vruns.groupby("_gkey", sort=True):
            cfg = json.loads(gkey)
            label = _group_label(cfg, varying, [d for d in vruns["_key"]], by_task=len(tasks) > 1)
            grp = grp.sort_values(["weight_decay", "run_id"])
            wds, finals, bests, spikes, diverged, ids = [], [], [], [], [], []
            for r in grp.itertuples():
                st = per_run.get(r.run_id, no_curve)
                wds.append(float(r.weight_decay))
                finals.append(st["final"])
                bests.append(st["best"])
                spikes.append(st["spikes"])
                diverged.append(st["diverged"])
                ids.append(int(r.run_id))
            stats = group_statistics(wds, finals if statistic == "final" else bests, n_boot=n_boot,
                                     confidence=confidence, rng=_group_rng(seed, variant, label), direction=way)
            for p in stats["per_wd"]:
                at = [i for i, w in enumerate(wds) if w == p["weight_decay"]]
                p["run_ids"] = [ids[i] for i in at]
                p["n_diverged"] = sum(bool(diverged[i]) for i in at)
                p["n_spiky"] = sum(spikes[i] > 0 for i in at)
            rows.append({
                "project": project, "variant": variant, "group": label, "weight_decays": wds,
                "final_val_loss": finals, "best_val_loss": bests,
                "n_runs": len(ids), "run_ids": ids, "spikes": spikes, "diverged": diverged,
                "statistic": statistic, "n_boot": n_boot, **stats, "direction": way,
            })
        _add_method(rows[first:], vruns, method, n_boot=n_boot, confidence=confidence,
                    rng=_group_rng(seed, variant, "\x00regression"), seed=seed, direction=way)
    return pd.DataFrame(rows, columns=OUTPUT_COLUMNS)


METHODS = ("auto", "grouped", "regression")

_LR_NAME = re.compile(r"^(lr|learning_rate|.*_lr|lr_.*)$")


def _regression_config(key: dict, lr) -> dict:
    """A run's scalar config for the regression; the run's stored ``lr`` is added as ``lr``
    when no config key names a learning rate (logs whose lr came from a name or a log line)."""
    cfg = dict(key)
    if lr is not None and isinstance(lr, (int, float)) and math.isfinite(lr) and not any(
            _LR_NAME.match(k.rsplit(".", 1)[-1].lower()) for k in cfg):
        cfg["lr"] = float(lr)
    return cfg


def _add_method(rows: list[dict], vruns: pd.DataFrame, method: str, *, n_boot: int, confidence: float,
                rng: np.random.Generator, seed: int, direction: str) -> None:
    """Sets ``method``, ``method_reason`` and ``regression`` in each of one variant's group rows."""
    keys = dict(zip(vruns["run_id"].astype(int), vruns["_key"]))
    lrs = dict(zip(vruns["run_id"].astype(int), vruns["lr"] if "lr" in vruns.columns else [None] * len(vruns)))
    ids, wds, vals, cfgs = [], [], [], []
    for row in rows:
        values = row["final_val_loss"] if row["statistic"] == "final" else row["best_val_loss"]
        for rid, wd, v in zip(row["run_ids"], row["weight_decays"], values):
            ids.append(rid)
            wds.append(wd)
            vals.append(v)
            cfgs.append(_regression_config(keys[rid], lrs[rid]))
    n_fit = sum(1 for w, v in zip(wds, vals) if w > 0 and v is not None and v == v)
    if method == "auto":
        chosen, why = choose_method(rows, n_fit)
    else:
        chosen, why = method, f"{method} (asked for)"
    reg = None
    if chosen == "regression":
        order = np.argsort(ids, kind="stable")  # run order, not group order: groups do not matter here
        reg = wd_regression([ids[i] for i in order], [wds[i] for i in order], [vals[i] for i in order],
                            [cfgs[i] for i in order], direction=direction, n_boot=n_boot,
                            confidence=confidence, seed=seed, rng=rng)
    for row in rows:
        row.update(method=chosen, method_reason=why, regression=reg)


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


def _none(value):
    """None for a missing value (pandas turns None into NaN in float columns)."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _pick_group(table: pd.DataFrame, variant: str, group: str | None) -> pd.Series | None:
    rows = table[table["variant"] == variant]
    if rows.empty:
        return None
    if group is not None:
        hit = rows[rows["group"] == group]
        if hit.empty:
            raise AnalysisError(f"relative_stability: variant {variant!r} has no group {group!r}; "
                                f"its groups: {sorted(rows['group'])}")
        return hit.iloc[0]
    # the group that says most about weight decay: most distinct weight decays, then most runs
    return rows.sort_values(["n_wd", "n_runs", "group"], ascending=[False, False, True]).iloc[0]


def _side(table: pd.DataFrame, variant: str, group: str | None) -> dict:
    row = _pick_group(table, variant, group)
    empty = {"variant": variant, "group": None, "n_runs": 0, "n_wd": 0, "best_weight_decay": None,
             "best_wd_ci_low": None, "best_wd_ci_high": None, "best_wd_share": None, "n_runs_at_best": 0,
             "best_loss": None, "best_loss_ci_low": None, "best_loss_ci_high": None,
             "stable_weight_decays": [], "lowest_stable_weight_decay": None, "per_wd": [],
             "reason": f"no run of variant {variant!r} with a weight decay and a loss"}
    if row is None:
        return empty
    per_wd = [dict(p) for p in row["per_wd"]]
    stable = [p["weight_decay"] for p in per_wd if p.get("n_diverged", 0) == 0 and p.get("n_spiky", 0) == 0]
    best = _none(row["best_weight_decay"])
    best = None if best is None else float(best)
    at = next((p for p in per_wd if p["weight_decay"] == best), None)
    out = dict(empty, group=row["group"], n_runs=int(row["n_runs"]), n_wd=int(row["n_wd"]),
               best_weight_decay=best, best_wd_ci_low=_none(row["best_wd_ci_low"]),
               best_wd_ci_high=_none(row["best_wd_ci_high"]), best_wd_share=_none(row["best_wd_share"]),
               stable_weight_decays=stable,
               lowest_stable_weight_decay=min(stable) if stable else None, per_wd=per_wd,
               reason=_none(row["best_reason"]))
    if at is not None:
        out.update(n_runs_at_best=at["n_runs"], best_loss=at["mean"], best_loss_ci_low=at["ci_low"],
                   best_loss_ci_high=at["ci_high"])
    return out


def relative_stability(table: pd.DataFrame, variant_a: str, variant_b: str, *, group_a: str | None = None,
                       group_b: str | None = None) -> dict:
    """At which weight decay each of two variants does best and trains stably, from the user's runs.

    For claims like the query-free paper's (arXiv 2510.23912: ``wq_identity``
    trained at weight decay 0.03125 where the baseline ``qkv`` used 0.1, "3x
    lower"). ``table``: the output of ``wd_sensitivity``. Each variant's group is
    ``group_a`` / ``group_b``, or else its group with the most distinct weight
    decays (then the most runs).

    Returns ``{"variant_a", "variant_b", "a", "b", "best_wd_ratio", "best_wd_ratio_low",
    "best_wd_ratio_high", "ratio_reason"}``. ``a`` and ``b`` each hold ``variant, group,
    n_runs, n_wd, best_weight_decay, best_wd_ci_low, best_wd_ci_high, best_wd_share,
    n_runs_at_best, best_loss, best_loss_ci_low, best_loss_ci_high`` (the mean loss at
    the best weight decay and its interval), ``stable_weight_decays`` (weight decays
    none of whose runs diverged or spiked), ``lowest_stable_weight_decay``, ``per_wd``
    (as in ``wd_sensitivity``) and ``reason`` (why the best weight decay is absent,
    else None). ``best_wd_ratio`` = best wd of b / best wd of a (the paper's claim
    reads 0.1 / 0.03125 = 3.2 with a = wq_identity, b = qkv); its bounds combine
    the two best-wd intervals (b low / a high, b high / a low) where both exist.
    """
    missing = sorted({"variant", "group", "n_runs", "n_wd", "per_wd", "best_weight_decay"} - set(table.columns))
    if missing:
        raise AnalysisError(f"relative_stability: table lacks columns {missing}; pass the output of wd_sensitivity")
    a, b = _side(table, variant_a, group_a), _side(table, variant_b, group_b)
    out = {"variant_a": variant_a, "variant_b": variant_b, "a": a, "b": b, "best_wd_ratio": None,
           "best_wd_ratio_low": None, "best_wd_ratio_high": None, "ratio_reason": None}
    wa, wb = a["best_weight_decay"], b["best_weight_decay"]
    if wa is None or wb is None:
        out["ratio_reason"] = "; ".join(f"{s['variant']}: {s['reason']}" for s in (a, b) if s["best_weight_decay"] is None)
    elif wa == 0:
        out["ratio_reason"] = f"{variant_a}'s best weight decay is 0: no ratio"
    else:
        out["best_wd_ratio"] = wb / wa
        lo_a, hi_a, lo_b, hi_b = a["best_wd_ci_low"], a["best_wd_ci_high"], b["best_wd_ci_low"], b["best_wd_ci_high"]
        if None not in (lo_a, hi_a, lo_b, hi_b) and lo_a > 0:
            out["best_wd_ratio_low"], out["best_wd_ratio_high"] = lo_b / hi_a, hi_b / lo_a
    return out
