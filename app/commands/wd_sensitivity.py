"""How sensitive is each variant to weight decay, and how sure is that?

Runs are grouped by variant and by everything in their config except weight
decay (and seeds, output folders, names). Per group: the final and best
validation loss of each run against its weight decay; per weight decay the
number of runs, their mean loss and (where several runs share it, e.g. seeds)
a 95% t interval (n - 1 degrees of freedom); a robust slope and curvature of the loss against
log10(weight decay) (Huber M-estimates) from >= 3 distinct weight decays > 0;
the best weight decay (from >= 2 runs at >= 2 weight decays), with intervals
where runs repeat (slope, curvature: t times a wild-bootstrap standard error;
best weight decay: draws of the means from their empirical-Bayes posterior); loss spikes and divergence per run; and (where
analysed checkpoints of the runs exist) the projection norms of each run's
latest analysed checkpoint. A statistic that cannot be had is null, with the
reason. See ``analysis.wd_sensitivity`` for the definitions.

--figures DIR writes the Weight decay page's main chart (each run's loss against
its weight decay, means and intervals) as wd_curve.svg, .pdf and .png, one
wd_curve_<task> per task where runs of several tasks are shown (app/figures.py).

JSON (--json): a list with one object per (variant, group): project (groups never span
projects, tasks or geometries: analysis.comparable), variant, group,
weight_decays, final_val_loss, best_val_loss, slope, curvature,
best_weight_decay, n_runs, run_ids, spikes, diverged, projection_norms,
and statistic ("final" or "best": the loss the statistics use),
n_wd, n_wd_fit (distinct weight decays > 0), n_wd_repeated (with > 1 run),
per_wd (per weight decay: weight_decay, n_runs, mean, ci_low, ci_high,
n_diverged, n_spiky, run_ids), slope_ci_low, slope_ci_high, curvature_ci_low,
curvature_ci_high, best_wd_ci_low, best_wd_ci_high, best_wd_share (fraction
of posterior draws whose best weight decay is best_weight_decay), n_boot, confidence, seed,
fit_reason, best_reason, interval_reason (why slope and curvature, the best
weight decay, or the intervals are null; null when they are not).

Random sweeps (``analysis.wd_regression``): new fields direction ("min" or
"max": which way the metric is better, from its name), method ("grouped" or
"regression": the estimator chosen for the row's variant, --method), and
method_reason (why), regression (null unless method is "regression"; else the
same object in every row of the variant): reason (why the numbers are null,
else null), n_runs, run_ids, weight_decays, values (the runs used: wd > 0 and
a finite value), n_excluded_wd0, n_excluded_no_value, excluded_run_ids, note,
covariates (name, transform "log10" or "linear", coef per unit of the
transformed value), unused (name, reason), wd_coef (d metric / d log10(wd),
the other covariates held fixed), wd_coef_ci_low, wd_coef_ci_high (case
bootstrap percentile interval), wd_coef_std (per standard deviation of
log10(wd)), intercept, r2, n_boot, n_boot_used, confidence, direction,
pd_model, pd_weight_decays, pd_values (tree partial dependence),
linear_pd_values, pd_best_weight_decay, pd_range, pd_slope.
"""
from __future__ import annotations

import argparse
import math

import pandas as pd

from analysis.wd_sensitivity import CONFIDENCE, METHODS, N_BOOT, SEED, projection_norms_vs_wd, wd_sensitivity
from app.commands._common import add_db_argument, add_figures_argument, print_json, store_from
from app.figures import report_written, write_figures
from loaders.wd import NORM_METRICS, read_inputs  # noqa: F401  (read_inputs: the command's reads)

NAME = "wd-sensitivity"
HELP = "validation loss against weight decay per variant: slope, curvature, best wd with intervals and n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_db_argument(parser)
    parser.add_argument("--metric", default="val/loss", help="loss metric to use (default: val/loss)")
    parser.add_argument("--loss", choices=("final", "best"), default="final",
                        help="which loss of each run the statistics use: its last or its lowest value "
                             "(default final)")
    parser.add_argument("--spike-ratio", type=float, default=0.1,
                        help="a rise above (1 + ratio) x the best loss so far is a spike (default 0.1)")
    parser.add_argument("--diverge-ratio", type=float, default=1.5,
                        help="final loss above ratio x the best loss means diverged (default 1.5)")
    parser.add_argument("--boot", type=int, default=N_BOOT,
                        help=f"draws for the wild bootstrap, the best wd's posterior and the regression's case bootstrap (default {N_BOOT})")
    parser.add_argument("--confidence", type=float, default=CONFIDENCE,
                        help=f"interval coverage, between 0 and 1 (default {CONFIDENCE})")
    parser.add_argument("--seed", type=int, default=SEED, help=f"seed of those draws (default {SEED})")
    parser.add_argument("--method", choices=METHODS, default="auto",
                        help="estimator per variant: grouped (runs that agree in everything but wd), "
                             "regression (log10 wd with the other swept hyperparameters as covariates, for "
                             "random sweeps), or auto: regression when under half of a variant's runs are in "
                             "groups with >= 2 weight decays (default auto)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_figures_argument(parser)


def _none(value):
    """None for NaN (pandas turns None into NaN in float columns)."""
    return None if value is not None and isinstance(value, float) and math.isnan(value) else value


def _num(value, fmt: str = ".4f") -> str:
    return "n/a" if value is None else format(value, fmt)


def _ci(lo, hi, fmt: str = ".4f") -> str:
    return "" if lo is None else f" [{format(lo, fmt)}, {format(hi, fmt)}]"


def _print_group(row: dict, metric: str, pct: str) -> None:
    wds = f"{row['n_wd']} weight decay" + ("" if row["n_wd"] == 1 else "s")
    print(f"{row['variant']} [{row['group']}]  runs={row['n_runs']} at {wds} "
          f"({row['n_wd_fit']} > 0, {row['n_wd_repeated']} with repeated runs)")
    if row["fit_reason"]:
        print(f"   slope, curvature: n/a ({row['fit_reason']})")
    else:
        print(f"   slope d{metric}/dlog10(wd)={row['slope']:+.4f}"
              f"{_ci(row['slope_ci_low'], row['slope_ci_high'], '+.4f')}")
        print(f"   curvature={row['curvature']:+.4f}{_ci(row['curvature_ci_low'], row['curvature_ci_high'], '+.4f')}")
    best = row["best_weight_decay"]
    if best is None:
        print(f"   best wd=n/a ({row['best_reason']})")
    else:
        share = ("" if row["best_wd_share"] is None
                 else f", best in {row['best_wd_share']:.0%} of {row['n_boot']} posterior draws")
        print(f"   best wd={best:g}{_ci(row['best_wd_ci_low'], row['best_wd_ci_high'], 'g')}{share}")
    if row["interval_reason"]:
        print(f"   intervals: n/a ({row['interval_reason']})")
    elif row["n_wd_repeated"] < row["n_wd"]:
        print(f"   intervals: spread measured at {row['n_wd_repeated']} of {row['n_wd']} weight decays "
              "(a weight decay with one run adds none)")
    print(f"   per wd ({row['statistic']} {metric}, mean over runs, {pct} interval):")
    for p in row["per_wd"]:
        print(f"   wd={p['weight_decay']:<10g} n={p['n_runs']:<3} mean={p['mean']:.4f}"
              f"{_ci(p['ci_low'], p['ci_high']) or '  (one run: no interval)'}")
    print("   per run:")
    for wd, fin, best_l, sp, dv in zip(row["weight_decays"], row["final_val_loss"], row["best_val_loss"],
                                       row["spikes"], row["diverged"]):
        print(f"   wd={wd:<10g} final={_num(fin):<8} best={_num(best_l):<8} spikes={sp}"
              f"{'  DIVERGED' if dv else ''}")


def write_page_figures(table: pd.DataFrame, args: argparse.Namespace) -> None:
    """The Weight decay page's main charts of ``table`` (``app.page_figures.wd_curve_figures``) as
    SVG, PDF and PNG in ``--figures``: ``wd_curve``, or ``wd_curve_<task>`` per task where there
    are several; nothing when every variant was fitted by the regression (a group per run: the
    page draws those apart)."""
    from app.page_figures import wd_curve_figures  # here: plotly only when asked

    shown = wd_curve_figures(table, statistic=args.loss, metric=args.metric)
    names = {task: "wd_curve" if len(shown) == 1 else f"wd_curve_{task}" for task in shown}
    report_written(write_figures({names[task]: fig for task, fig in shown.items()}, args.figures))


def run(args: argparse.Namespace) -> int:
    from loaders.curves import metric_directions    # the directions set on the Experiments page

    store = store_from(args)
    runs, points, norms = read_inputs(store, args.metric)
    table = wd_sensitivity(runs, points, spike_ratio=args.spike_ratio, diverge_ratio=args.diverge_ratio,
                           statistic=args.loss, n_boot=args.boot, confidence=args.confidence, seed=args.seed,
                           metric=args.metric, method=args.method, overrides=metric_directions(store))
    if args.figures is not None:
        write_page_figures(table, args)
    pn = projection_norms_vs_wd(runs, norms)
    out = []
    for row in table.to_dict("records"):
        row = {k: _none(v) for k, v in row.items()}
        mine = pn[pn["run_id"].isin(row["run_ids"])]
        row["projection_norms"] = mine[["run_id", "weight_decay", "step", "metric", "value"]].to_dict("records")
        row["confidence"], row["seed"] = args.confidence, args.seed
        out.append(row)
    if args.json:
        print_json(out)
        return 0
    if not out:
        print(f"no runs with a weight decay and '{args.metric}' points in {store.path}")
        return 0
    pct = f"{args.confidence:.0%}"
    shown = set()
    for row in out:
        if row["variant"] not in shown:
            shown.add(row["variant"])
            print(f"{row['variant']}: method {row['method']} ({row['method_reason']})")
            if row["regression"] is not None:
                _print_regression(row["regression"], args.metric, row["statistic"], pct)
        _print_group(row, args.metric, pct)
    return 0


def _print_regression(reg: dict, metric: str, statistic: str, pct: str) -> None:
    if reg["note"]:
        print(f"   regression: {reg['note']}")
    if reg["reason"]:
        print(f"   regression: n/a ({reg['reason']})")
        return
    covs = ", ".join(f"{c['transform']}({c['name']})" if c["transform"] == "log10" else c["name"]
                     for c in reg["covariates"]) or "none"
    print(f"   regression of {statistic} {metric} on log10(wd) + {covs}: n={reg['n_runs']}, R^2={reg['r2']:.3f}")
    print(f"   wd coefficient d{metric}/dlog10(wd)={reg['wd_coef']:+.4f}"
          f"{_ci(reg['wd_coef_ci_low'], reg['wd_coef_ci_high'], '+.4f')} ({pct}, {reg['n_boot_used']} of "
          f"{reg['n_boot']} resamples)")
    for u in reg["unused"]:
        print(f"   not a covariate: {u['name']} ({u['reason']})")
    print(f"   partial dependence ({reg['pd_model']}): slope {reg['pd_slope']:+.4f}, range {reg['pd_range']:.4f}, "
          f"best wd {reg['pd_best_weight_decay']:.4g}")
