"""`python -m app wd-sensitivity`: the JSON contract, counts, intervals and reasons; loaders.wd reads."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from app.cli import main
from loaders.store import Store, refresh_run_stats
from loaders.curves import metric_curves
from loaders.wd import projection_norm_rows, read_inputs

SLOPES = {"qkv": 0.2, "k_eq_v": -0.1}
WDS = (1e-3, 1e-2, 1e-1, 1.0)


def _store(path, *, seeds_at=None) -> Store:
    """Two variants x 4 weight decays, final val loss = 3 + slope * log10(wd); one lone run.

    ``seeds_at``: a weight decay where qkv gets two more runs (seeds), 0.01 above and below.
    """
    store = Store(path)
    rid = 0
    with store.transaction() as con:
        for variant, slope in SLOPES.items():
            for wd in WDS:
                offsets = (0.0, 0.01, -0.01) if (variant == "qkv" and wd == seeds_at) else (0.0,)
                for seed, off in enumerate(offsets):
                    rid += 1
                    final = 3 + slope * math.log10(wd) + off
                    con.execute("INSERT INTO runs (id, name, source, format, variant, weight_decay, config) "
                                "VALUES (?, ?, 'mem', 'test', ?, ?, ?)",
                                [rid, f"r{rid}", variant, wd,
                                 json.dumps({"lr": 1e-3, "seed": seed, "weight_decay": wd})])
                    for step, val in ((0, final + 2), (100, final + 1), (200, final)):
                        con.execute("INSERT INTO points (run_id, step, metric, value) VALUES (?, ?, 'val/loss', ?)",
                                    [rid, step, val])
        # one lone run: no slope, no best weight decay
        con.execute("INSERT INTO runs (id, name, source, format, variant, weight_decay, config) "
                    "VALUES (99, 'lone', 'mem', 'test', 'wq_identity', 0.1, '{\"save_steps\": [5]}')")
        con.execute("INSERT INTO points (run_id, step, metric, value) VALUES (99, 10, 'val/loss', 4.0)")
        refresh_run_stats(con, [r[0] for r in con.execute("SELECT id FROM runs").fetchall()])
    return store


def _json(capsys, *args) -> dict:
    capsys.readouterr()
    assert main(["wd-sensitivity", *args, "--json"]) == 0
    return {o["variant"]: o for o in json.loads(capsys.readouterr().out)}


def test_json_known_slopes_counts_and_reasons(tmp_path, capsys):
    store = _store(tmp_path / "wd.duckdb")
    by_variant = _json(capsys, "--db", str(store.path))
    assert set(by_variant) == {"qkv", "k_eq_v", "wq_identity"}
    lone = by_variant["wq_identity"]
    assert (lone["slope"], lone["curvature"], lone["best_weight_decay"], lone["n_runs"]) == (None, None, None, 1)
    assert lone["fit_reason"] == "1 distinct weight decay > 0 (0.1); slope and curvature need >= 3"
    assert lone["best_reason"] == "1 run with a loss; a best weight decay needs >= 2 runs at >= 2 weight decays"
    assert lone["interval_reason"].startswith("one run per weight decay")
    for variant, slope, best in (("qkv", 0.2, 1e-3), ("k_eq_v", -0.1, 1.0)):
        o = by_variant[variant]
        # the fields as before
        assert o["slope"] == pytest.approx(slope, abs=1e-9)
        assert o["curvature"] == pytest.approx(0.0, abs=1e-9)
        assert o["best_weight_decay"] == best and o["n_runs"] == 4 and o["weight_decays"] == list(WDS)
        assert o["group"] == "all" and o["spikes"] == [0] * 4 and o["diverged"] == [False] * 4
        assert o["projection_norms"] == []
        # how many runs stand behind each point, and no interval without repeats
        assert (o["n_wd"], o["n_wd_fit"], o["n_wd_repeated"], o["statistic"]) == (4, 4, 0, "final")
        assert [(p["weight_decay"], p["n_runs"], p["ci_low"]) for p in o["per_wd"]] == [(w, 1, None) for w in WDS]
        assert [p["mean"] for p in o["per_wd"]] == pytest.approx([3 + slope * math.log10(w) for w in WDS])
        assert o["fit_reason"] is None and o["best_reason"] is None and o["slope_ci_low"] is None
        assert (o["n_boot"], o["confidence"], o["seed"]) == (1000, 0.95, 0)


def test_json_intervals_where_seeds_share_a_weight_decay(tmp_path, capsys):
    store = _store(tmp_path / "wd.duckdb", seeds_at=0.1)
    qkv = _json(capsys, "--db", str(store.path), "--boot", "400")["qkv"]
    assert qkv["n_runs"] == 6 and qkv["n_wd_repeated"] == 1 and qkv["interval_reason"] is None
    at = {p["weight_decay"]: p for p in qkv["per_wd"]}
    mean = 3 + 0.2 * math.log10(0.1)
    assert at[0.1]["n_runs"] == 3 and at[0.1]["mean"] == pytest.approx(mean)
    # the t interval of three runs at mean, mean + 0.01, mean - 0.01: sd 0.01, t(2, 0.975) = 4.302653
    half = 4.302653 * 0.01 / math.sqrt(3)
    assert (at[0.1]["ci_low"], at[0.1]["ci_high"]) == pytest.approx((mean - half, mean + half), abs=1e-6)
    assert qkv["slope_ci_low"] <= qkv["slope"] <= qkv["slope_ci_high"]
    assert qkv["curvature_ci_low"] <= qkv["curvature"] <= qkv["curvature_ci_high"]
    # neighbouring means 0.2 apart against a seed sd of 0.01 (2 df): only the far tail of the noise's
    # posterior lets another weight decay win
    assert (qkv["best_weight_decay"], qkv["best_wd_ci_low"], qkv["best_wd_ci_high"]) == (1e-3, 1e-3, 1e-3)
    assert 0.99 <= qkv["best_wd_share"] <= 1.0
    assert qkv["n_boot"] == 400


def test_table_prints_n_intervals_and_reasons(tmp_path, capsys):
    store = _store(tmp_path / "wd.duckdb", seeds_at=0.1)
    capsys.readouterr()
    assert main(["wd-sensitivity", "--db", str(store.path)]) == 0
    out = capsys.readouterr().out
    assert "qkv [all]  runs=6 at 4 weight decays (4 > 0, 1 with repeated runs)" in out
    assert "   slope dval/loss/dlog10(wd)=+0.2000 [" in out
    assert "   wd=0.1        n=3   mean=2.8000 [" in out
    assert "   wd=0.001      n=1   mean=2.4000  (one run: no interval)" in out
    assert "intervals: spread measured at 1 of 4 weight decays (a weight decay with one run adds none)" in out
    assert ("wq_identity [all]  runs=1 at 1 weight decay (1 > 0, 0 with repeated runs)\n"
            "   slope, curvature: n/a (1 distinct weight decay > 0 (0.1); slope and curvature need >= 3)\n"
            "   best wd=n/a (1 run with a loss; a best weight decay needs >= 2 runs at >= 2 weight decays)\n") in out


def test_best_loss_option(tmp_path, capsys):
    store = _store(tmp_path / "wd.duckdb")
    with store.transaction() as con:  # qkv's run at wd 1 dips to 1.0 before it ends at 3.2
        con.execute("INSERT INTO points (run_id, step, metric, value) VALUES (4, 150, 'val/loss', 1.0)")
    final = _json(capsys, "--db", str(store.path))["qkv"]
    best = _json(capsys, "--db", str(store.path), "--loss", "best")["qkv"]
    assert final["best_weight_decay"] == 1e-3 and best["best_weight_decay"] == 1.0
    assert best["statistic"] == "best" and best["per_wd"][3]["mean"] == 1.0
    assert best["final_val_loss"] == final["final_val_loss"]


def test_loaders_read_the_latest_value_per_step_and_the_norms(tmp_path):
    store = _store(tmp_path / "wd.duckdb")
    with store.transaction() as con:
        # the same step logged again (a resumed run): the value stored last counts
        con.execute("INSERT INTO points (run_id, step, metric, value) VALUES (1, 200, 'val/loss', 9.0)")
        con.execute("INSERT INTO checkpoints (id, path, sha256, architecture, variant, n_layers, n_heads, "
                    "n_kv_heads, d_model, d_head, run_id, step) "
                    "VALUES (1, 'gone', 's1', 'gpt2', 'qkv', 2, 2, 2, 8, 4, 1, 200)")
        con.execute("INSERT INTO checkpoints (id, path, sha256, architecture, variant, n_layers, n_heads, "
                    "n_kv_heads, d_model, d_head, run_id, step) "
                    "VALUES (2, 'loose', 's2', 'gpt2', 'qkv', 2, 2, 2, 8, 4, NULL, NULL)")
        for cid, metric, value in ((1, "norm_k", 2.0), (1, "kv_cka", 0.5), (2, "norm_k", 7.0)):
            con.execute("INSERT INTO analysis_results (checkpoint_id, layer, head, metric, value, metric_version) "
                        "VALUES (?, 0, NULL, ?, ?, 1)", [cid, metric, value])
    pts = dict(metric_curves(store, "val/loss"))
    # run 1: qkv at wd 1e-3, final 3 + 0.2 x (-3) = 2.4 after 4.4 and 3.4 (steps 0, 100, 200);
    # its step 200 now reads 9.0, once
    assert pts[1].tolist() == pytest.approx([4.4, 3.4, 9.0])
    assert projection_norm_rows(store).to_dict("records") == [
        {"run_id": 1, "step": 200, "metric": "norm_k", "value": 2.0}]
    runs, points, norms = read_inputs(store, "val/loss")
    assert runs["run_id"].tolist() == list(range(1, 9)) + [99]
    assert list(runs.columns) == ["run_id", "project", "task", "d_model", "n_layers", "n_heads", "n_kv_heads",
                                  "variant", "weight_decay", "lr", "last_step", "config"]
    assert [(r, v.tolist()) for r, v in points] == [(r, v.tolist()) for r, v in pts.items()] and len(norms) == 1


def _random_sweep_store(path, n: int = 40, *, a: float = 0.08, b: float = -0.3, seed: int = 0) -> Store:
    """An Optuna-like sweep of one variant: lr, wd log-uniform, dropout uniform, final val loss
    3 + a log10(wd) + b log10(lr) + 0.5 dropout + noise (sd 0.02); run 1 at wd 0."""
    rng = np.random.default_rng(seed)
    lr, wd, dropout = 10 ** rng.uniform(-4, -2, n), 10 ** rng.uniform(-3, 0, n), rng.uniform(0, 0.3, n)
    wd[0] = 0.0
    final = 3 + a * np.log10(np.where(wd > 0, wd, 1.0)) + b * np.log10(lr) + 0.5 * dropout + rng.normal(0, 0.02, n)
    store = Store(path)
    with store.transaction() as con:
        for i in range(n):
            con.execute("INSERT INTO runs (id, name, source, format, variant, weight_decay, lr, config) "
                        "VALUES (?, ?, 'mem', 'test', 'qkv', ?, ?, ?)",
                        [i + 1, f"trial_{i}", float(wd[i]), float(lr[i]),
                         json.dumps({"lr": float(lr[i]), "weight_decay": float(wd[i]), "dropout": float(dropout[i])})])
            for step, val in ((0, final[i] + 2), (100, final[i] + 1), (200, final[i])):
                con.execute("INSERT INTO points (run_id, step, metric, value) VALUES (?, ?, 'val/loss', ?)",
                            [i + 1, step, float(val)])
        refresh_run_stats(con, list(range(1, n + 1)))
    return store


def test_json_random_sweep_names_the_regression_and_recovers_the_coefficient(tmp_path, capsys):
    store = _random_sweep_store(tmp_path / "sweep.duckdb")
    capsys.readouterr()
    assert main(["wd-sensitivity", "--db", str(store.path), "--json", "--boot", "500"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 40 and {r["n_runs"] for r in rows} == {1} and {r["slope"] for r in rows} == {None}
    assert {r["method"] for r in rows} == {"regression"} and {r["direction"] for r in rows} == {"min"}
    assert rows[0]["method_reason"] == ("0 of 40 runs are in groups with runs at >= 2 weight decays (under half): "
                                        "regression over the variant's runs")
    reg = rows[0]["regression"]
    assert all(r["regression"] == reg for r in rows)
    assert set(reg) == {"reason", "n_runs", "run_ids", "weight_decays", "values", "n_excluded_wd0",
                        "n_excluded_no_value", "excluded_run_ids", "note", "covariates", "unused", "wd_coef",
                        "wd_coef_ci_low", "wd_coef_ci_high", "wd_coef_std", "intercept", "r2", "n_boot",
                        "n_boot_used", "confidence", "direction", "pd_model", "pd_weight_decays", "pd_values",
                        "linear_pd_values", "pd_best_weight_decay", "pd_range", "pd_slope"}
    assert (reg["n_runs"], reg["n_excluded_wd0"], reg["excluded_run_ids"], reg["n_boot"]) == (39, 1, [1], 500)
    assert reg["note"] == "1 run at wd 0 left out (log10 0 is undefined)"
    assert reg["wd_coef_ci_low"] < 0.08 < reg["wd_coef_ci_high"]
    assert reg["wd_coef"] == pytest.approx(0.08, abs=0.015)
    assert [(c["name"], c["transform"]) for c in reg["covariates"]] == [("dropout", "linear"), ("lr", "log10")]
    assert len(reg["pd_weight_decays"]) == len(reg["pd_values"]) == len(reg["linear_pd_values"]) == 25
    assert reg["pd_model"].startswith("GradientBoostingRegressor(") and reg["pd_model"].endswith("random_state=0)")
    # the grouped estimator can be asked for, and then no regression is made
    capsys.readouterr()
    assert main(["wd-sensitivity", "--db", str(store.path), "--json", "--method", "grouped"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["method"] for r in rows} == {"grouped"} and {json.dumps(r["regression"]) for r in rows} == {"null"}


def test_json_a_grid_keeps_the_grouped_method(tmp_path, capsys):
    store = _store(tmp_path / "wd.duckdb")
    by_variant = _json(capsys, "--db", str(store.path))
    assert {v: o["method"] for v, o in by_variant.items()} == {"qkv": "grouped", "k_eq_v": "grouped",
                                                               "wq_identity": "grouped"}
    assert by_variant["qkv"]["regression"] is None
    assert by_variant["wq_identity"]["method_reason"] == (
        "0 of 1 runs are in groups with runs at >= 2 weight decays (under half), but 1 run with wd > 0: a "
        "regression needs >= 8; grouped")


def test_table_prints_the_regression_once_per_variant(tmp_path, capsys):
    store = _random_sweep_store(tmp_path / "sweep.duckdb")
    capsys.readouterr()
    assert main(["wd-sensitivity", "--db", str(store.path), "--boot", "200"]) == 0
    out = capsys.readouterr().out
    assert out.count("qkv: method regression (0 of 40 runs") == 1
    assert "   regression: 1 run at wd 0 left out (log10 0 is undefined)\n" in out
    assert "   regression of final val/loss on log10(wd) + dropout, log10(lr): n=39, R^2=" in out
    assert "   wd coefficient dval/loss/dlog10(wd)=+0.0" in out and "(95%, 200 of 200 resamples)" in out


@pytest.mark.slow
def test_a_lightning_sweep_ingested_from_disk_gets_the_regression(tmp_path, capsys):
    """16 Lightning ``version_N`` folders (hparams.yaml with lr, weight_decay, dropout; metrics.csv with
    val_loss), as an Optuna study driving Lightning writes them, through ``ingest`` and ``wd-sensitivity``."""
    rng = np.random.default_rng(1)
    n = 16
    lr, wd, dropout = 10 ** rng.uniform(-4, -2, n), 10 ** rng.uniform(-3, 0, n), rng.uniform(0, 0.3, n)
    final = 3 + 0.08 * np.log10(wd) - 0.3 * np.log10(lr) + 0.5 * dropout + rng.normal(0, 0.02, n)
    for i in range(n):
        run = tmp_path / "sweep" / "lightning_logs" / f"version_{i}"
        run.mkdir(parents=True)
        (run / "hparams.yaml").write_text(f"lr: {float(lr[i])}\nweight_decay: {float(wd[i])}\n"
                                          f"dropout: {float(dropout[i])}\nn_layer: 4\n")
        rows = [f"{e},{s},,{final[i] + 0.4 - 0.2 * e:.6f}" for e, s in enumerate((99, 199, 299))]
        (run / "metrics.csv").write_text("epoch,step,train_loss,val_loss\n" + "\n".join(rows) + "\n")
    db = str(tmp_path / "sweep.duckdb")
    assert main(["ingest", str(tmp_path / "sweep"), "--db", db]) == 0
    capsys.readouterr()
    assert main(["wd-sensitivity", "--db", db, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 16 and {r["method"] for r in rows} == {"regression"}
    reg = rows[0]["regression"]
    assert reg["n_runs"] == 16 and [c["name"] for c in reg["covariates"]] == ["dropout", "lr"]
    assert reg["wd_coef_ci_low"] < 0.08 < reg["wd_coef_ci_high"]
