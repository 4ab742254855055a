"""`python -m app wd-sensitivity`: the JSON contract, counts, intervals and reasons; loaders.wd reads."""
from __future__ import annotations

import json
import math

import pytest

from app.cli import main
from loaders.store import Store, refresh_run_stats
from loaders.wd import loss_points, projection_norm_rows, read_inputs

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
    assert mean - 0.01 <= at[0.1]["ci_low"] < at[0.1]["mean"] < at[0.1]["ci_high"] <= mean + 0.01
    assert qkv["slope_ci_low"] <= qkv["slope"] <= qkv["slope_ci_high"]
    assert qkv["curvature_ci_low"] <= qkv["curvature"] <= qkv["curvature_ci_high"]
    assert (qkv["best_weight_decay"], qkv["best_wd_ci_low"], qkv["best_wd_ci_high"], qkv["best_wd_share"]) == (
        1e-3, 1e-3, 1e-3, 1.0)
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
    pts = loss_points(store, "val/loss")
    # run 1: qkv at wd 1e-3, final 3 + 0.2 x (-3) = 2.4 after 4.4 and 3.4; its step 200 now reads 9.0
    assert pts[pts["run_id"] == 1]["value"].tolist() == pytest.approx([4.4, 3.4, 9.0])
    assert pts[pts["run_id"] == 1]["step"].tolist() == [0, 100, 200]
    assert projection_norm_rows(store).to_dict("records") == [
        {"run_id": 1, "step": 200, "metric": "norm_k", "value": 2.0}]
    runs, points, norms = read_inputs(store, "val/loss")
    assert runs["run_id"].tolist() == list(range(1, 9)) + [99]
    assert list(runs.columns) == ["run_id", "variant", "weight_decay", "lr", "config"]
    assert points.equals(pts) and len(norms) == 1
