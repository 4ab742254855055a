"""analysis.wd_regression: the effect of log10(wd) over a random sweep, on sweeps built in code with a
known answer (final loss = a log10(wd) + b log10(lr) + c dropout + noise)."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from analysis.errors import AnalysisError
from analysis.wd_regression import (MIN_REG_RUNS, build_design, choose_method, fit_linear, ols_coefs,
                                    wd_regression)
from analysis.wd_sensitivity import run_curve_stats, wd_sensitivity

A, B, C = 0.08, -0.3, 0.5  # d loss / d log10(wd), d loss / d log10(lr), d loss / d dropout
NOISE = 0.02


def random_sweep(n: int = 40, *, seed: int = 0, noise: float = NOISE, a: float = A):
    """An Optuna-like sweep: lr and wd log-uniform, dropout uniform; returns (wd, lr, dropout, loss)."""
    rng = np.random.default_rng(seed)
    lr = 10 ** rng.uniform(-4, -2, n)
    wd = 10 ** rng.uniform(-3, 0, n)
    dropout = rng.uniform(0.0, 0.3, n)
    loss = 3.0 + a * np.log10(wd) + B * np.log10(lr) + C * dropout + rng.normal(0, noise, n)
    return wd, lr, dropout, loss


def _configs(wd, lr, dropout, **extra):
    return [{"lr": float(a), "dropout": float(d), **{k: v[i] for k, v in extra.items()}}
            for i, (a, d) in enumerate(zip(lr, dropout))]


def test_coefficient_recovered_and_its_interval_covers_the_truth():
    wd, lr, dropout, loss = random_sweep()
    out = wd_regression(list(range(40)), wd, loss, _configs(wd, lr, dropout), n_boot=1000, seed=0)
    assert out["reason"] is None and out["n_runs"] == 40 and out["n_boot_used"] == 1000
    assert [(c["name"], c["transform"]) for c in out["covariates"]] == [("dropout", "linear"), ("lr", "log10")]
    lo, hi = out["wd_coef_ci_low"], out["wd_coef_ci_high"]
    assert lo < A < hi and lo < out["wd_coef"] < hi
    # the noise is 0.02 over 3 decades of wd: the coefficient's standard error is ~0.004
    assert out["wd_coef"] == pytest.approx(A, abs=0.012) and hi - lo < 0.04
    cov = {c["name"]: c["coef"] for c in out["covariates"]}
    assert cov["lr"] == pytest.approx(B, abs=0.02) and cov["dropout"] == pytest.approx(C, abs=0.1)
    assert out["r2"] > 0.95
    # per standard deviation of log10(wd), and the linear model's own partial dependence
    assert out["wd_coef_std"] == pytest.approx(out["wd_coef"] * np.log10(wd).std())
    u = np.log10(out["pd_weight_decays"])
    np.testing.assert_allclose(np.diff(out["linear_pd_values"]) / np.diff(u), out["wd_coef"])


def test_exact_data_are_fitted_exactly():
    wd, lr, dropout, loss = random_sweep(noise=0.0)
    out = wd_regression(list(range(40)), wd, loss, _configs(wd, lr, dropout), n_boot=50)
    assert out["wd_coef"] == pytest.approx(A, abs=1e-12)
    assert out["wd_coef_ci_low"] == pytest.approx(A, abs=1e-10) == out["wd_coef_ci_high"]
    assert out["intercept"] == pytest.approx(3.0, abs=1e-10) and out["r2"] == pytest.approx(1.0)


@pytest.mark.slow
def test_interval_covers_the_truth_in_about_95_percent_of_sweeps():
    hits = 0
    for seed in range(200):
        wd, lr, dropout, loss = random_sweep(seed=seed)
        X, _, _ = build_design(np.log10(wd), _configs(wd, lr, dropout))
        fit = fit_linear(X, loss, n_boot=400, confidence=0.95, rng=np.random.default_rng(seed))
        hits += fit["wd_coef_ci_low"] <= A <= fit["wd_coef_ci_high"]
    # binomial(200, 0.95) lies in [181, 197] with probability > 0.99; the percentile bootstrap of a
    # 40-run regression runs a little narrow, so allow down to 0.88
    assert 176 <= hits <= 199


def test_batched_least_squares_matches_scikit_learn_and_flags_rank_deficient_resamples():
    from sklearn.linear_model import LinearRegression

    rng = np.random.default_rng(3)
    X = rng.normal(size=(30, 3))
    y = X @ [1.0, -2.0, 0.5] + rng.normal(size=30)
    ref = LinearRegression().fit(X, y).coef_
    bad = X.copy()
    bad[:, 2] = 2 * bad[:, 0]  # a combination of the others
    flat = X.copy()
    flat[:, 1] = 7.0  # a constant column
    got = ols_coefs(np.stack([X, bad, flat]), np.stack([y, y, y]))  # [3, 3]
    np.testing.assert_allclose(got[0], ref, rtol=1e-10)
    assert np.isnan(got[1]).all() and np.isnan(got[2]).all()


def test_design_transforms_and_leaves_out_unusable_keys():
    wd, lr, dropout, _ = random_sweep(n=40, seed=1)
    rng = np.random.default_rng(1)
    batch = (2 ** rng.integers(4, 12, 40)).tolist()  # 16 .. 2048, log-uniform
    cfgs = _configs(wd, lr, dropout, batch_size=batch, learning_rate=lr.tolist(),
                    optimizer=["adamw" if i % 2 else "lion" for i in range(40)],
                    warmup=[100] * 40, label_smoothing=[0.1] * 39 + [None],
                    muon_weight_decay=(2 * wd).tolist(), trial=list(range(40)),
                    best_val_loss=rng.uniform(2, 3, 40).tolist())
    X, covariates, unused = build_design(np.log10(wd), cfgs)
    assert [(c["name"], c["transform"]) for c in covariates] == [
        ("batch_size", "log10"), ("dropout", "linear"), ("learning_rate", "log10")]
    np.testing.assert_allclose(X[:, 0], np.log10(wd))
    np.testing.assert_allclose(X[:, 3], np.log10(lr))
    reasons = {u["name"]: u["reason"] for u in unused}
    assert reasons == {
        "best_val_loss": "names an outcome (a metric), not a hyperparameter",
        "trial": "an identifier or counter, not a hyperparameter",
        "label_smoothing": "missing or not a number in 1 of 40 runs",
        "lr": "collinear with learning_rate (|r| = 1.000)",
        "muon_weight_decay": "collinear with log10(weight_decay) (|r| = 1.000)",
        "optimizer": "missing or not a number in 40 of 40 runs"}


def test_weight_decay_zero_and_missing_values_are_left_out_with_a_note():
    wd, lr, dropout, loss = random_sweep()
    wd[:3] = 0.0
    loss[5] = np.nan
    out = wd_regression(list(range(40)), wd, loss.tolist(), _configs(wd, lr, dropout), n_boot=100)
    assert (out["n_runs"], out["n_excluded_wd0"], out["n_excluded_no_value"]) == (36, 3, 1)
    assert out["excluded_run_ids"] == [0, 1, 2, 5] and 0 not in out["run_ids"]
    assert out["note"] == ("3 runs at wd 0 left out (log10 0 is undefined); "
                           "1 run without a finite value left out")
    assert out["wd_coef_ci_low"] < A < out["wd_coef_ci_high"]


def test_too_few_runs_or_too_many_covariates_give_the_reason():
    wd, lr, dropout, loss = random_sweep(n=7)
    out = wd_regression(list(range(7)), wd, loss, _configs(wd, lr, dropout))
    assert out["wd_coef"] is None and out["pd_values"] is None
    assert out["reason"] == ("7 runs at 7 distinct weight decays > 0 with a value; a regression needs >= 8 runs "
                             "at >= 3 weight decays > 0")
    wd, lr, dropout, loss = random_sweep(n=9)
    rng = np.random.default_rng(9)
    extra = {f"k{i}": rng.uniform(0, 1, 9).tolist() for i in range(4)}
    out = wd_regression(list(range(9)), wd, loss, _configs(wd, lr, dropout, **extra))
    assert out["wd_coef"] is None and len(out["covariates"]) == 6
    assert out["reason"] == ("9 runs for 7 columns (log10 wd and 6 covariates) and an intercept; needs >= 3 "
                             "more runs than that")


def test_partial_dependence_follows_the_effect_and_the_direction():
    wd, lr, dropout, loss = random_sweep(noise=0.01)
    out = wd_regression(list(range(40)), wd, loss, _configs(wd, lr, dropout), n_boot=10)
    u = np.log10(out["pd_weight_decays"])
    assert u[0] == pytest.approx(np.log10(wd).min()) and u[-1] == pytest.approx(np.log10(wd).max())
    # trees flatten an effect toward the edges of the data (0.5-0.95 x the truth over 8 seeds of this
    # sweep): the partial dependence shows the shape; the linear coefficient is the number
    assert 0.4 * A < out["pd_slope"] < 1.2 * A
    assert out["pd_best_weight_decay"] < 0.01  # loss rises with wd: best at the low end
    # the same data read as an accuracy (higher is better): best at the high end
    acc = wd_regression(list(range(40)), wd, loss, _configs(wd, lr, dropout), n_boot=10, direction="max")
    assert acc["pd_best_weight_decay"] > 0.1 and acc["direction"] == "max"
    # a bowl in log10(wd) with its bottom at wd = 0.03: the tree model finds it
    bowl = 3.0 + 0.2 * (np.log10(wd) - math.log10(0.03)) ** 2 + B * np.log10(lr)
    out = wd_regression(list(range(40)), wd, bowl, _configs(wd, lr, dropout), n_boot=10)
    assert abs(math.log10(out["pd_best_weight_decay"]) - math.log10(0.03)) < 0.5


def test_bad_arguments_are_refused():
    with pytest.raises(AnalysisError, match=r"^wd_regression: direction must be 'min' or 'max', got 'up'$"):
        wd_regression([1], [0.1], [3.0], [{}], direction="up")
    with pytest.raises(AnalysisError, match=r"^wd_regression: run_ids, wds, values, configs differ in length "
                                            r"\(2, 1, 1, 1\)$"):
        wd_regression([1, 2], [0.1], [3.0], [{}])


# ---- chosen automatically by wd_sensitivity ------------------------------------------------------

def _frames(wd, lr, dropout, loss, *, variant="qkv", start=1, sign=1.0):
    """Runs and points of a sweep; each curve ends at its ``loss``, from above (``sign`` 1: a loss) or
    from below (-1: an accuracy)."""
    n = len(wd)
    ids = list(range(start, start + n))
    runs = pd.DataFrame({"run_id": ids, "variant": variant, "weight_decay": wd,
                         "config": [json.dumps({"lr": float(a), "dropout": float(d), "weight_decay": float(w),
                                                "seed": i}) for i, (a, d, w) in enumerate(zip(lr, dropout, wd))]})
    points = pd.DataFrame([(rid, s, v + sign * 0.1 * (1.0 - s / 200)) for rid, v in zip(ids, loss)
                           for s in (0, 100, 200)],
                          columns=["run_id", "step", "value"])
    return runs, points


def test_a_random_sweep_switches_to_the_regression_and_a_grid_keeps_the_groups():
    wd, lr, dropout, loss = random_sweep()
    sweep_runs, sweep_points = _frames(wd, lr, dropout, loss)
    # a grid: 3 lrs x 4 weight decays, everything else equal within an lr
    g_wd = np.tile([1e-3, 1e-2, 1e-1, 1.0], 3)
    g_lr = np.repeat([1e-4, 1e-3, 1e-2], 4)
    g_loss = 3.0 + A * np.log10(g_wd) + B * np.log10(g_lr)
    grid_runs, grid_points = _frames(g_wd, g_lr, np.zeros(12), g_loss, variant="k_eq_v", start=100)
    table = wd_sensitivity(pd.concat([sweep_runs, grid_runs]), pd.concat([sweep_points, grid_points]), n_boot=200)
    qkv, kv = table[table["variant"] == "qkv"], table[table["variant"] == "k_eq_v"]
    assert len(qkv) == 40 and set(qkv["n_runs"]) == {1} and qkv["slope"].isna().all()
    assert set(qkv["method"]) == {"regression"}
    assert qkv["method_reason"].iloc[0] == ("0 of 40 runs are in groups with runs at >= 2 weight decays "
                                            "(under half): regression over the variant's runs")
    reg = qkv["regression"].iloc[0]
    assert all(r is reg for r in qkv["regression"])  # one regression per variant
    assert reg["n_runs"] == 40 and reg["run_ids"] == list(range(1, 41))
    assert reg["wd_coef_ci_low"] < A < reg["wd_coef_ci_high"]
    assert len(kv) == 3 and set(kv["method"]) == {"grouped"} and kv["regression"].isna().all()
    assert kv["method_reason"].iloc[0] == "12 of 12 runs are in groups with runs at >= 2 weight decays " \
                                          "(at least half): grouped"
    np.testing.assert_allclose(kv["slope"].astype(float), A)
    # asked for: the regression on the grid too, and no regression at all
    forced = wd_sensitivity(grid_runs, grid_points, n_boot=200, method="regression")
    assert forced["method_reason"].iloc[0] == "regression (asked for)"
    assert forced["regression"].iloc[0]["wd_coef"] == pytest.approx(A, abs=1e-10)
    assert [c["name"] for c in forced["regression"].iloc[0]["covariates"]] == ["lr"]
    off = wd_sensitivity(sweep_runs, sweep_points, n_boot=200, method="grouped")
    assert set(off["method"]) == {"grouped"} and off["regression"].isna().all()
    with pytest.raises(AnalysisError, match=r"^wd_sensitivity: method must be one of auto, grouped, regression, "
                                            r"got 'tree'$"):
        wd_sensitivity(grid_runs, grid_points, method="tree")


def test_the_rule_at_half_and_with_too_few_runs():
    rows = [{"statistic": "final", "weight_decays": [0.1, 0.01], "final_val_loss": [3.0, 3.1]},
            {"statistic": "final", "weight_decays": [0.1], "final_val_loss": [3.0]},
            {"statistic": "final", "weight_decays": [0.3], "final_val_loss": [3.0]}]
    assert choose_method(rows, 20) == ("grouped", "2 of 4 runs are in groups with runs at >= 2 weight "
                                                  "decays (at least half): grouped")
    rows.append({"statistic": "final", "weight_decays": [0.5], "final_val_loss": [3.2]})
    assert choose_method(rows, 20)[0] == "regression"  # 2 of 5: under half
    lone = [{"statistic": "final", "weight_decays": [0.1], "final_val_loss": [3.0]}]
    assert choose_method(lone, 1) == ("grouped", "0 of 1 runs are in groups with runs at >= 2 weight decays "
                                                 f"(under half), but 1 run with wd > 0: a regression needs >= "
                                                 f"{MIN_REG_RUNS}; grouped")


def test_the_stored_lr_is_a_covariate_when_the_config_names_none():
    wd, lr, dropout, loss = random_sweep()
    runs, points = _frames(wd, lr, dropout, loss)
    runs["config"] = [json.dumps({"dropout": float(d)}) for d in dropout]  # lr only in the runs table
    runs["lr"] = lr
    reg = wd_sensitivity(runs, points, n_boot=200)["regression"].iloc[0]
    assert [(c["name"], c["transform"]) for c in reg["covariates"]] == [("dropout", "linear"), ("lr", "log10")]
    assert reg["wd_coef_ci_low"] < A < reg["wd_coef_ci_high"]


def test_an_accuracy_is_higher_is_better_in_both_estimators():
    wd, lr, dropout, loss = random_sweep()
    acc = 0.5 + 0.1 * np.log10(wd) + 0.01 * np.log10(lr)  # accuracy rises with wd
    runs, points = _frames(wd, lr, dropout, acc, sign=-1.0)
    table = wd_sensitivity(runs, points, metric="val/acc", n_boot=100)
    assert set(table["direction"]) == {"max"}
    reg = table["regression"].iloc[0]
    assert reg["direction"] == "max" and reg["pd_best_weight_decay"] > 0.1
    assert reg["wd_coef"] == pytest.approx(0.1, abs=1e-10)
    # each curve rises to its last value: best = final, no spike, not diverged
    for r in table.itertuples():
        assert r.final_val_loss == r.best_val_loss and r.spikes == [0] and r.diverged == [False]
    # a grid read as an accuracy: the best weight decay is the highest mean
    grid, gpoints = _frames(np.array([1e-3, 1e-2, 1e-1]), np.full(3, 1e-3), np.zeros(3), np.array([0.5, 0.6, 0.7]),
                            sign=-1.0)
    row = wd_sensitivity(grid, gpoints, metric="val/acc", n_boot=100).iloc[0]
    assert row["best_weight_decay"] == 0.1 and row["method"] == "grouped"
    assert wd_sensitivity(grid, gpoints, metric="val/loss", n_boot=100).iloc[0]["best_weight_decay"] == 1e-3


def test_run_curve_stats_of_a_higher_is_better_curve():
    st = run_curve_stats(np.array([0.5, 0.7, 0.5, 0.8, 0.4]), direction="max", spike_ratio=0.1, diverge_ratio=1.5)
    # 0.5 after 0.7 is a fall of 29% (a spike); 0.4 after 0.8 another; 0.4 < 0.8 / 1.5: diverged
    assert st == {"final": 0.4, "best": 0.8, "spikes": 2, "diverged": True}
    assert run_curve_stats(np.array([0.5, 0.7, 0.8]), direction="max") == {
        "final": 0.8, "best": 0.8, "spikes": 0, "diverged": False}
