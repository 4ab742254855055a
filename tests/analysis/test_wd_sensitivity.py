"""Weight-decay sensitivity and trajectories on synthetic frames and real-world logs."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.errors import AnalysisError
from analysis.trajectories import summarise, trajectories
from analysis.wd_sensitivity import (best_draws, curvature, group_statistics, huber_fit, projection_norms_vs_wd,
                                     relative_stability, robust_slope, run_curve_stats, wd_sensitivity)


def grid(slope=0.25, quad=0.0, outlier=False):
    runs, points = [], []
    wds = [1e-4, 1e-3, 1e-2, 1e-1, 1.0]
    rid = 0
    for lr in (1e-3, 3e-3):
        for wd in wds:
            rid += 1
            u = math.log10(wd)
            final = 2.0 + slope * u + quad * u * u + (lr == 3e-3) * 0.5
            if outlier and wd == 1e-1 and lr == 1e-3:
                final += 5.0
            runs.append({"run_id": rid, "variant": "qkv", "weight_decay": wd,
                         "config": {"lr": lr, "seed": rid, "out_dir": f"o{rid}"}})
            for step, val in enumerate([final + 1.0, final + 0.5, final]):
                points.append({"run_id": rid, "step": step * 10, "value": val})
    return pd.DataFrame(runs), pd.DataFrame(points)


def test_known_slope_best_wd_and_groups():
    out = wd_sensitivity(*grid(slope=0.25))
    assert out["group"].tolist() == ["lr=0.001", "lr=0.003"]
    for row in out.itertuples():
        assert row.slope == pytest.approx(0.25, abs=1e-6)
        assert row.curvature == pytest.approx(0.0, abs=1e-9)
        assert row.best_weight_decay == 1e-4 and row.n_runs == 5


def test_curvature_and_robustness_to_one_outlier():
    out = wd_sensitivity(*grid(slope=0.1, quad=0.05))
    assert out["curvature"].iloc[0] == pytest.approx(0.1, abs=1e-9)
    runs, points = grid(slope=0.3, outlier=True)
    row = wd_sensitivity(runs, points).iloc[0]
    ols = np.polyfit([-4, -3, -2, -1, 0], row.final_val_loss, 1)[0]
    assert abs(row.slope - 0.3) < 0.05 < abs(ols - 0.3)


def test_spikes_and_divergence():
    st = run_curve_stats(np.array([5.0, 4.0, 3.0, 3.6, 3.7, 2.9, 2.8, 3.5, 2.7]))
    assert st == {"final": 2.7, "best": 2.7, "spikes": 2, "diverged": False}
    assert run_curve_stats(np.array([5.0, 3.0, float("nan")]))["diverged"] is True
    assert run_curve_stats(np.array([5.0, 2.0, 3.5]))["diverged"] is True


def _spikes_loop(values, ratio, higher):
    """The definition, value by value: skip non-finite values; a finite value worse than the best
    so far by ``ratio`` starts a spike unless the previous finite value was worse too."""
    best, spikes, inside = (-math.inf if higher else math.inf), 0, False
    for x in values:
        if not math.isfinite(x):
            continue
        worse = math.isfinite(best) and (x < best * (1 - ratio) if higher else x > best * (1 + ratio))
        spikes += worse and not inside
        inside = worse
        best = max(best, x) if higher else min(best, x)
    return spikes


def test_spike_counts_equal_the_value_by_value_definition_on_random_curves():
    """Random curves with ties, NaN, +-inf and near-overflow values, both directions and three
    thresholds: the whole-array count equals the loop, and final/best/diverged their definitions."""
    rng = np.random.default_rng(0)
    for _ in range(3000):
        n = int(rng.integers(0, 30))
        v = np.round(rng.normal(size=n) * rng.choice([0.1, 1.0, 10.0]) + rng.choice([0.0, 3.0, -3.0]),
                     int(rng.integers(0, 3)))
        for _ in range(int(rng.integers(0, 4)) if n else 0):
            v[rng.integers(0, n)] = rng.choice([np.nan, np.inf, -np.inf, 1e308, -1e308, 0.0])
        finite = v[np.isfinite(v)]
        for way in ("min", "max"):
            for ratio in (0.0, 0.1, 0.5):
                st = run_curve_stats(v, spike_ratio=ratio, direction=way)
                assert st["spikes"] == _spikes_loop(v, ratio, way == "max")
                if not finite.size:
                    assert st == {"final": None, "best": None, "spikes": 0, "diverged": bool(n)}
                    continue
                best = finite.max() if way == "max" else finite.min()
                assert (st["final"], st["best"]) == (finite[-1], best)
                far = finite[-1] < best / 1.5 if way == "max" else finite[-1] > 1.5 * best
                assert st["diverged"] == bool(finite.size < n or far)


def test_a_stream_of_curves_gives_the_table_of_the_points_frame():
    runs, points = grid(slope=0.2)
    extra = pd.DataFrame({"run_id": [2, 3], "step": [15, 25], "value": [9.0, float("nan")]})  # a spike, a NaN
    points = pd.concat([points, extra]).sample(frac=1.0, random_state=0)   # any row order: runs sorted by step
    stream = [(rid, g.sort_values("step")["value"].to_numpy()) for rid, g in points.groupby("run_id")]
    a, b = wd_sensitivity(runs, points), wd_sensitivity(runs, iter(stream))
    pd.testing.assert_frame_equal(a, b)
    assert a["n_runs"].sum() == len(runs) and a["final_val_loss"].map(len).sum() == len(runs)
    per_run = {i: (s, d) for row in a.itertuples() for i, s, d in zip(row.run_ids, row.spikes, row.diverged)}
    assert per_run[2] == (1, False) and per_run[3] == (0, True) and per_run[4] == (0, False)


def test_too_few_points():
    assert robust_slope(np.array([0.0]), np.array([1.0])) is None
    # two distinct u: a line always fits, so no slope is reported (however many runs)
    assert robust_slope(np.array([0.0, 1.0, 1.0, 0.0]), np.array([1.0, 3.0, 3.1, 0.9])) is None
    assert curvature(np.array([0.0, 1.0]), np.array([1.0, 3.0])) is None
    assert robust_slope(np.array([0.0, 1.0, 2.0]), np.array([1.0, 3.0, 5.0])) == pytest.approx(2.0, abs=1e-12)


def test_missing_columns_message():
    with pytest.raises(AnalysisError) as exc:
        wd_sensitivity(pd.DataFrame({"run_id": [1]}), pd.DataFrame(columns=["run_id", "step", "value"]))
    assert str(exc.value) == "wd_sensitivity: runs frame lacks columns ['variant', 'weight_decay']; found ['run_id']"


def test_projection_norms_use_latest_step_and_layers():
    runs = pd.DataFrame({"run_id": [1], "variant": ["qkv"], "weight_decay": [0.1]})
    norms = pd.DataFrame({"run_id": [1, 1, 1], "step": [10, 20, 20], "metric": ["norm_q"] * 3,
                          "value": [9.0, 3.0, 4.0]})
    out = projection_norms_vs_wd(runs, norms)
    assert out.to_dict("records") == [{"variant": "qkv", "weight_decay": 0.1, "run_id": 1, "step": 20,
                                       "metric": "norm_q", "value": 5.0}]


def test_trajectories_join_and_summary():
    results = pd.DataFrame({"checkpoint_id": [1, 1, 2, 2, 3], "layer": [0, 0, 0, 0, 0], "head": [0, 1, 0, 1, 0],
                            "metric": ["kv_cka"] * 5, "value": [0.1, 0.3, 0.5, 0.7, 0.9]})
    cks = pd.DataFrame({"id": [1, 2, 3], "run_id": [7, 7, None], "step": [200, 100, 5]})
    tr = trajectories(results, cks)
    assert tr["step"].tolist() == [100, 200, 100, 200] and set(tr["checkpoint_id"]) == {1, 2}
    s = summarise(tr, over="layer")
    assert s["value"].tolist() == pytest.approx([0.6, 0.2])


def test_real_world_logs(realworld, tmp_path):
    """The real logs through the store: runs that get a weight decay are analysed, the others skipped."""
    from loaders.ingest import ingest_paths
    from loaders.logs.runs import set_run_metadata
    from loaders.store import Store
    from loaders.wd import read_inputs

    store = Store(tmp_path / "real.duckdb")
    ingest_paths(store, [realworld / "logs"])
    runs, points, _ = read_inputs(store, "val/loss")
    with_val = sorted(rid for rid, _ in points)
    assert with_val, "expected val/loss points in the real-world logs"
    assert wd_sensitivity(runs[runs["run_id"].isin(with_val)].assign(weight_decay=None), points).empty
    for i, rid in enumerate(with_val):
        set_run_metadata(store, int(rid), weight_decay=[0.01, 0.1, 1.0][i % 3], variant="qkv")
    runs, points, _ = read_inputs(store, "val/loss")
    out = wd_sensitivity(runs[runs["run_id"].isin(with_val)], points)
    assert out["n_runs"].sum() == len(with_val)
    for row in out.itertuples():
        finals = [f for f in row.final_val_loss if f is not None]
        assert finals and all(math.isfinite(f) and 0 < f < 20 for f in finals)
        if len({w for w, f in zip(row.weight_decays, row.final_val_loss) if f is not None}) >= 2:
            assert row.best_weight_decay in row.weight_decays and row.best_reason is None
        else:
            assert pd.isna(row.best_weight_decay) and row.best_reason


def test_config_files_beside_a_log_group_by_their_keys_not_their_file_names():
    from analysis.wd_sensitivity import _scalars

    cfg = {"files": {"config.json": {"n_kv_heads": 4, "save_steps": [125, 250], "weight_decay": 0.1},
                     "hparams.yaml": {"lr": 0.002}}, "d_model": 64}
    assert _scalars(cfg) == {"n_kv_heads": 4, "lr": 0.002, "d_model": 64}


# -- how sure: counts, intervals, reasons --------------------------------------------------------

def sweep(spec, *, variant="qkv", config=None):
    """Runs and points from ``spec``: ``[(weight_decay, [final loss of each seed]), ...]``."""
    runs, points, rid = [], [], 0
    for wd, finals in spec:
        for seed, final in enumerate(finals):
            rid += 1
            runs.append({"run_id": rid, "variant": variant, "weight_decay": wd,
                         "config": {"lr": 1e-3, "seed": seed, **(config or {})}})
            points += [{"run_id": rid, "step": 0, "value": final + 1.0}, {"run_id": rid, "step": 10, "value": final}]
    return pd.DataFrame(runs), pd.DataFrame(points)


def test_huber_fit_is_exact_on_exact_data_and_bounds_an_outlier():
    u = np.linspace(-3, 1, 9)
    X = np.stack([np.ones_like(u), u, u * u], axis=1)
    np.testing.assert_allclose(huber_fit(X, 1.0 - 0.5 * u + 0.25 * u * u), [1.0, -0.5, 0.25], atol=1e-12)
    y = 1.0 - 0.5 * u
    y[4] += 10.0
    ols = np.linalg.lstsq(X[:, :2], y, rcond=None)[0]
    assert abs(ols[0] - 1.0) > 1.0 and huber_fit(X[:, :2], y) == pytest.approx([1.0, -0.5], abs=1e-6)


def test_parabola_in_log_wd_gives_its_curvature_and_best_wd():
    # loss = 2 + 0.3 (log10 wd + 2)^2: curvature 0.6, lowest at wd 0.01, symmetric so slope 0
    wds = [1e-4, 1e-3, 1e-2, 1e-1, 1.0]
    row = wd_sensitivity(*sweep([(w, [2 + 0.3 * (math.log10(w) + 2) ** 2]) for w in wds])).iloc[0]
    assert row.curvature == pytest.approx(0.6, abs=1e-9)
    assert row.slope == pytest.approx(0.0, abs=1e-9)
    assert row.best_weight_decay == 0.01
    assert (row.n_runs, row.n_wd, row.n_wd_fit, row.n_wd_repeated) == (5, 5, 5, 0)
    assert row.fit_reason is None and row.best_reason is None
    assert row.interval_reason == "one run per weight decay: an interval needs repeated runs (seeds) at a weight decay"
    assert all(pd.isna(row[c]) for c in ("slope_ci_low", "curvature_ci_high", "best_wd_ci_low", "best_wd_share"))
    assert [p["n_runs"] for p in row.per_wd] == [1] * 5 and row.per_wd[2]["mean"] == pytest.approx(2.0)


def test_two_weight_decays_give_no_slope_and_say_why():
    row = wd_sensitivity(*sweep([(0.0, [3.0]), (0.03, [2.9, 2.95]), (0.1, [2.8, 2.85])])).iloc[0]
    assert row.slope is None and row.curvature is None
    assert row.fit_reason == ("2 distinct weight decays > 0 (0.03, 0.1); slope and curvature need >= 3; "
                              "wd 0 is left out of the fit (log10 0 is undefined)")
    assert all(pd.isna(row[c]) for c in ("slope_ci_low", "slope_ci_high", "curvature_ci_low"))
    # wd 0 still takes part in the best weight decay
    assert row.best_weight_decay == 0.1 and (row.n_wd, row.n_wd_fit, row.n_wd_repeated) == (3, 2, 2)


def test_one_run_or_one_weight_decay_gives_no_best_wd():
    lone = wd_sensitivity(*sweep([(0.1, [3.0])])).iloc[0]
    assert pd.isna(lone.best_weight_decay) and lone.n_runs == 1
    assert lone.best_reason == "1 run with a loss; a best weight decay needs >= 2 runs at >= 2 weight decays"
    assert lone.fit_reason == "1 distinct weight decay > 0 (0.1); slope and curvature need >= 3"
    seeds = wd_sensitivity(*sweep([(0.1, [3.0, 3.1])])).iloc[0]
    assert pd.isna(seeds.best_weight_decay)
    assert seeds.best_reason == "all 2 runs at wd 0.1; a best weight decay needs >= 2 weight decays"
    # the per-wd interval is there: two runs share the weight decay
    # t interval of (3.0, 3.1): 3.05 -+ t_{1, 0.975} 0.05
    assert (seeds.per_wd[0]["ci_low"], seeds.per_wd[0]["ci_high"]) == pytest.approx(
        (3.05 - 12.7062047362 * 0.05, 3.05 + 12.7062047362 * 0.05), rel=1e-9)


def test_t_interval_of_two_runs_and_the_share_of_the_means_posterior():
    """Known answers: the t interval; the share where the data cannot tell two weight decays apart
    (equal means: one half) and where they can (40 standard errors apart: all)."""
    # t interval of (2.0, 2.4): 2.2 -+ t_{1, 0.975} 0.2
    out = group_statistics([0.1, 0.1, 0.3], [2.0, 2.4, 3.0])
    assert [(p["weight_decay"], p["n_runs"], p["mean"], p["ci_low"], p["ci_high"]) for p in out["per_wd"]] == [
        (0.1, 2, pytest.approx(2.2), pytest.approx(2.2 - 12.7062047362 * 0.2, rel=1e-9),
         pytest.approx(2.2 + 12.7062047362 * 0.2, rel=1e-9)), (0.3, 1, 3.0, None, None)]
    assert out["best_weight_decay"] == 0.1 and 0.5 < out["best_wd_share"] < 1
    assert (out["best_wd_ci_low"], out["best_wd_ci_high"]) == (0.1, 0.3)
    tied = group_statistics([0.1, 0.1, 0.3, 0.3], [2.0, 2.02, 2.02, 2.0])
    assert tied["best_weight_decay"] == 0.1 and tied["best_wd_share"] == pytest.approx(0.5, abs=0.05)  # sd 0.016
    clear = group_statistics([0.1, 0.1, 0.3, 0.3], [2.0, 2.02, 2.4, 2.42])
    assert (clear["best_weight_decay"], clear["best_wd_share"], clear["best_wd_ci_low"],
            clear["best_wd_ci_high"]) == (0.1, 1.0, 0.1, 0.1)
    # identical repeated runs: no noise measured, the means' own best every time
    same = group_statistics([0.1, 0.1, 0.3, 0.3], [2.0, 2.0, 2.1, 2.1])
    assert same["best_wd_share"] == 1.0


@pytest.mark.parametrize("seeds", [2, 3])
def test_best_wd_share_is_calibrated_on_simulated_sweeps(seeds):
    """The mean claimed share against the rate at which the reported weight decay is the true best,
    over 150 simulated sweeps (weight decays 0, 1e-3, 1e-2, 3e-2, 1e-1, ``seeds`` runs each, seed noise
    0.02) of two families: a bowl whose three best weight decays lie within a seed's noise of each other
    (a normal prior claimed 0.71 there, right 0.47-0.54) and true means scattered N(2, tau^2), tau 0.1-10
    standard errors of a mean. Tolerance 0.08: twice the binomial sd of the rate over 150 sweeps."""
    rng = np.random.default_rng(11)
    wds = (0.0, 1e-3, 1e-2, 3e-2, 1e-1)
    u = np.array([-4.0, -3.0, -2.0, math.log10(3e-2), -1.0])
    counts = np.full(5, seeds)
    for family in ("bowl", "scattered"):
        claimed, right = [], []
        for r in range(150):
            if family == "bowl":
                truth = 2.0 + 0.05 * (u + 1.3) ** 2
            else:
                truth = 2.0 + 0.02 / math.sqrt(seeds) * 10 ** rng.uniform(-1, 1) * rng.standard_normal(5)
            y = truth[:, None] + 0.02 * rng.standard_normal((5, seeds))
            means, df = y.mean(1), 5 * (seeds - 1)
            pooled = float(((y - means[:, None]) ** 2).sum()) / df
            picks = best_draws(means, counts, pooled, df, 400, np.random.default_rng([seeds, r]))
            claimed.append(np.mean(picks == np.argmin(means)))
            right.append(np.argmin(means) == np.argmin(truth))
        assert abs(np.mean(claimed) - np.mean(right)) <= 0.08, (family, np.mean(claimed), np.mean(right))
        if family == "bowl":
            assert 0.35 < np.mean(right) < 0.65          # the bowl is a near-tie: no share near 0.7-0.8


def _seeded(noise=0.02, seeds=4, wds=(1e-3, 1e-2, 1e-1, 1.0)):
    rng = np.random.default_rng(7)
    return [(w, list(2 + 0.1 * math.log10(w) + 0.05 * math.log10(w) ** 2 + noise * rng.standard_normal(seeds)))
            for w in wds]


def test_intervals_over_seeds_contain_their_estimates():
    spec = _seeded()
    row = wd_sensitivity(*sweep(spec)).iloc[0]
    assert row.interval_reason is None and row.n_wd_repeated == 4 and row.n_boot == 1000
    for p, (w, finals) in zip(row.per_wd, spec):
        assert p["weight_decay"] == w and p["n_runs"] == 4
        assert p["mean"] == pytest.approx(np.mean(finals))
        assert p["ci_low"] < p["mean"] < p["ci_high"]
        assert p["ci_high"] - p["ci_low"] < 4 * 0.02  # about 2 x 1.96 x 0.02 / sqrt(4)
    assert row.slope_ci_low < row.slope < row.slope_ci_high
    assert row.curvature_ci_low < row.curvature < row.curvature_ci_high
    assert row.curvature == pytest.approx(0.1, abs=0.05)  # 2 x 0.05 under the noise
    assert row.best_wd_ci_low <= row.best_weight_decay <= row.best_wd_ci_high
    assert row.best_wd_ci_low in row.weight_decays and row.best_wd_ci_high in row.weight_decays
    assert 0 < row.best_wd_share <= 1


def test_intervals_are_seeded_and_per_group():
    runs, points = sweep(_seeded())
    a = wd_sensitivity(runs, points).iloc[0]
    b = wd_sensitivity(runs, points).iloc[0]
    c = wd_sensitivity(runs, points, seed=1).iloc[0]
    assert (a.slope_ci_low, a.per_wd[0]["ci_low"]) == (b.slope_ci_low, b.per_wd[0]["ci_low"])
    assert a.slope_ci_low != c.slope_ci_low and a.slope == c.slope
    # another variant beside it does not change this group's resamples
    runs2, points2 = sweep(_seeded(), variant="k_eq_v")
    both = wd_sensitivity(pd.concat([runs, runs2.assign(run_id=runs2["run_id"] + 100)]),
                          pd.concat([points, points2.assign(run_id=points2["run_id"] + 100)]))
    assert both.set_index("variant").loc["qkv", "slope_ci_low"] == a.slope_ci_low
    narrow = wd_sensitivity(runs, points, confidence=0.5, n_boot=500).iloc[0]
    assert a.slope_ci_low < narrow.slope_ci_low < narrow.slope_ci_high < a.slope_ci_high and narrow.n_boot == 500


def test_best_loss_statistic_and_bad_options():
    runs, points = sweep([(0.01, [2.0]), (0.1, [2.5]), (1.0, [3.0])])
    # run 1's curve dips to 1.0 before ending at 2.0; its best loss is 1.0
    points = pd.concat([points, pd.DataFrame([{"run_id": 1, "step": 5, "value": 1.0}])])
    final = wd_sensitivity(runs, points).iloc[0]
    best = wd_sensitivity(runs, points, statistic="best").iloc[0]
    assert final.per_wd[0]["mean"] == 2.0 and best.per_wd[0]["mean"] == 1.0 and best.statistic == "best"
    assert final.slope == pytest.approx(0.5) and best.slope > final.slope
    with pytest.raises(AnalysisError) as exc:
        wd_sensitivity(runs, points, statistic="last")
    assert str(exc.value) == "wd_sensitivity: statistic must be 'final' or 'best', got 'last'"
    with pytest.raises(AnalysisError) as exc:
        wd_sensitivity(runs, points, confidence=1.0)
    assert str(exc.value) == ("wd_sensitivity: need n_boot >= 1 and 0 < confidence < 1, "
                              "got n_boot=1000, confidence=1.0")


def _two_variants():
    """wq_identity lowest at wd 0.03125, qkv at 0.1 (the query-free paper's settings); 2 seeds each."""
    wds = [0.01, 0.03125, 0.1, 0.3]
    frames = []
    for k, (variant, at) in enumerate((("wq_identity", 0.03125), ("qkv", 0.1))):
        spec = [(w, [2 + (math.log10(w) - math.log10(at)) ** 2 + d for d in (-0.01, 0.01)]) for w in wds]
        r, p = sweep(spec, variant=variant)
        frames.append((r.assign(run_id=r["run_id"] + 100 * k), p.assign(run_id=p["run_id"] + 100 * k)))
    return pd.concat([f[0] for f in frames]), pd.concat([f[1] for f in frames])


def test_relative_stability_finds_each_variants_best_wd():
    runs, points = _two_variants()
    # qkv's run at wd 0.3, seed 1 diverges: 0.3 is no longer a stable weight decay for qkv
    points = pd.concat([points, pd.DataFrame([{"run_id": 108, "step": 20, "value": float("nan")}])])
    out = relative_stability(wd_sensitivity(runs, points), "wq_identity", "qkv")
    a, b = out["a"], out["b"]
    assert (a["best_weight_decay"], b["best_weight_decay"]) == (0.03125, 0.1)
    assert out["best_wd_ratio"] == pytest.approx(3.2) and out["ratio_reason"] is None
    assert out["best_wd_ratio_low"] <= 3.2 <= out["best_wd_ratio_high"]
    assert (a["n_runs"], a["n_wd"], a["n_runs_at_best"], a["group"]) == (8, 4, 2, "all")
    # two runs at the best wd, 1.99 and 2.01: 2.0 -+ t_{1, 0.975} 0.01
    assert a["best_loss"] == pytest.approx(2.0) and a["best_loss_ci_low"] == pytest.approx(2.0 - 0.127062047362)
    assert a["best_loss_ci_high"] == pytest.approx(2.0 + 0.127062047362) and a["best_wd_share"] > 0.9
    assert a["stable_weight_decays"] == [0.01, 0.03125, 0.1, 0.3] and a["lowest_stable_weight_decay"] == 0.01
    assert b["stable_weight_decays"] == [0.01, 0.03125, 0.1]
    assert [p["n_runs"] for p in b["per_wd"]] == [2, 2, 2, 2] and b["per_wd"][3]["n_diverged"] == 1


def test_relative_stability_without_runs_or_with_an_unknown_group():
    runs, points = _two_variants()
    table = wd_sensitivity(runs, points)
    out = relative_stability(table, "wq_identity", "k_eq_v")
    assert out["b"]["reason"] == "no run of variant 'k_eq_v' with a weight decay and a loss"
    assert out["best_wd_ratio"] is None
    assert out["ratio_reason"] == "k_eq_v: no run of variant 'k_eq_v' with a weight decay and a loss"
    with pytest.raises(AnalysisError) as exc:
        relative_stability(table, "wq_identity", "qkv", group_b="n_kv_heads=1")
    assert str(exc.value) == "relative_stability: variant 'qkv' has no group 'n_kv_heads=1'; its groups: ['all']"
    lone = wd_sensitivity(*sweep([(0.1, [3.0])], variant="qkv"))
    out = relative_stability(pd.concat([table[table["variant"] == "wq_identity"], lone]), "wq_identity", "qkv")
    assert out["ratio_reason"] == ("qkv: 1 run with a loss; a best weight decay needs >= 2 runs at "
                                   ">= 2 weight decays")


def test_group_labels_name_the_task_first_and_stay_short():
    import pandas as pd

    from analysis.wd_sensitivity import wd_sensitivity

    lang = {"block_size": 128, "corpus": "stdlib"}
    image = {"task": "image", "block_size": 17, "dataset": "digits", "patch_size": 2, "channels": 1, "causal": False}
    runs = pd.DataFrame([{"run_id": i, "variant": "qkv", "weight_decay": wd, "config": cfg}
                         for i, (wd, cfg) in enumerate([(0.0, lang), (0.1, lang), (0.0, image), (0.1, image)])])
    points = pd.DataFrame([{"run_id": i, "step": s, "value": 1.0 + i - s / 10} for i in range(4) for s in (0, 1)])
    table = wd_sensitivity(runs, points)
    assert sorted(table["group"]) == ["image", "language"]


def test_group_label_caps_the_entries_it_names():
    from analysis.wd_sensitivity import _group_label

    peers = [{"a": 1, "b": 1, "c": 1, "d": 1, "e": 1}, {"a": 2, "b": 2, "c": 2, "d": 2, "e": 2}]
    assert _group_label(peers[0], ["a", "b", "c", "d", "e"], peers, by_task=False) == "a=1, b=1, c=1, +2 more"
    assert _group_label({}, [], [{}], by_task=False) == "all"
