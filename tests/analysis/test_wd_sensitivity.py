"""Weight-decay sensitivity and trajectories on synthetic frames and real-world logs."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.errors import AnalysisError
from analysis.trajectories import summarise, trajectories
from analysis.wd_sensitivity import (curvature, projection_norms_vs_wd, robust_slope, run_curve_stats,
                                     wd_sensitivity)


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


def test_too_few_points():
    assert robust_slope(np.array([0.0]), np.array([1.0])) is None
    assert robust_slope(np.array([0.0, 1.0]), np.array([1.0, 3.0])) == 2.0
    assert curvature(np.array([0.0, 1.0]), np.array([1.0, 3.0])) is None


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
    from app.commands.wd_sensitivity import read_inputs
    from loaders.ingest import ingest_paths
    from loaders.logs.runs import set_run_metadata
    from loaders.store import Store

    store = Store(tmp_path / "real.duckdb")
    ingest_paths(store, [realworld / "logs"])
    runs, points, _ = read_inputs(store, "val/loss")
    with_val = sorted(set(points["run_id"]))
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
        assert row.best_weight_decay in row.weight_decays


def test_config_files_beside_a_log_group_by_their_keys_not_their_file_names():
    from analysis.wd_sensitivity import _scalars

    cfg = {"files": {"config.json": {"n_kv_heads": 4, "save_steps": [125, 250], "weight_decay": 0.1},
                     "hparams.yaml": {"lr": 0.002}}, "d_model": 64}
    assert _scalars(cfg) == {"n_kv_heads": 4, "lr": 0.002, "d_model": 64}
