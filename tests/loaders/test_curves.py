"""Curve queries: SQL min-max downsampling, bands, final and best values, run summaries, results."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from loaders import curves
from loaders.errors import QkvscopeError
from loaders.store import Store, refresh_run_stats


def _store_with_points(tmp_path, rows) -> Store:
    """rows: (run_id, step, metric, value, wall_time, tokens)."""
    store = Store(tmp_path / "c.duckdb")
    store.migrate()
    frame = pd.DataFrame(rows, columns=["run_id", "step", "metric", "value", "wall_time", "tokens"])
    with store.transaction() as con:
        for rid in sorted(frame["run_id"].unique()):
            con.execute("INSERT INTO runs (id, name, source, format) VALUES (?, ?, 'mem', 'csv')",
                        [int(rid), f"run{rid}"])
        con.register("f", frame)
        con.execute("INSERT INTO points SELECT run_id, step, metric, value, wall_time, tokens FROM f")
        refresh_run_stats(con, frame["run_id"].unique())
    return store


@pytest.fixture
def long_run(tmp_path):
    """Run 1: 10,000 steps of a smooth loss with one spike at step 5,003; run 2: 50 steps."""
    steps = np.arange(10_000)
    loss = 4.0 - steps / 5_000
    loss[5_003] = 99.0
    rows = [(1, int(s), "train/loss", float(v), 100.0 + s * 0.5, int(s) * 1024) for s, v in zip(steps, loss)]
    rows += [(2, s, "train/loss", 3.0 - s / 100, None, None) for s in range(50)]
    rows += [(1, s, "val/loss", 5.0 - s / 1000, None, None) for s in range(0, 10_000, 1000)]
    return _store_with_points(tmp_path, rows)


def test_downsampling_caps_points_and_keeps_the_spike(long_run):
    df = curves.curves(long_run, [1, 2], "train/loss", max_points=400)
    one = df[df.run_id == 1]
    assert len(one) <= 400
    assert len(one) >= 390  # two points per bucket, minus the odd bucket whose min and max coincide
    assert one["value"].max() == 99.0
    assert one.loc[one["value"].idxmax(), "step"] == 5_003
    assert one["x"].is_monotonic_increasing
    # every kept point is a real point: x equals its step, value is the logged value
    assert (one["x"] == one["step"]).all()
    two = df[df.run_id == 2]
    assert len(two) == 50 and two["value"].tolist() == [3.0 - s / 100 for s in range(50)]


def test_downsampling_keeps_bucket_extremes_exactly(tmp_path):
    # 8 points, 2 buckets of x: [0, 3.5) and [3.5, 7]; min and max of each kept
    values = [5, 1, 7, 3, 2, 9, 0, 4]
    store = _store_with_points(tmp_path, [(1, s, "m", float(v), None, None) for s, v in enumerate(values)])
    df = curves.curves(store, [1], "m", max_points=4)
    assert list(zip(df["step"], df["value"])) == [(1, 1.0), (2, 7.0), (5, 9.0), (6, 0.0)]


def test_x_axes_tokens_and_relative_wall_time(long_run):
    tok = curves.curves(long_run, [1, 2], "train/loss", x="tokens", max_points=10_000)
    assert set(tok["run_id"]) == {1}  # run 2 logged no tokens: left out, not zero
    assert tok["x"].iloc[10] == 10 * 1024
    wall = curves.curves(long_run, [1], "train/loss", x="wall_time", max_points=10_000)
    assert wall["x"].iloc[0] == 0.0 and wall["x"].iloc[4] == 2.0


def test_unknown_x_axis_is_a_typed_error(long_run):
    with pytest.raises(QkvscopeError) as err:
        curves.curves(long_run, [1], "train/loss", x="epoch")
    assert str(err.value) == "x axis must be one of step, tokens, wall_time; got 'epoch'"


def test_no_runs_gives_an_empty_frame(long_run):
    df = curves.curves(long_run, [], "train/loss")
    assert df.empty and list(df.columns) == ["run_id", "x", "value", "step"]


def test_group_band_mean_and_extremes(tmp_path):
    rows = [(r, s, "m", float(r * 10 + s), None, None) for r in (1, 2, 3) for s in range(4)]
    store = _store_with_points(tmp_path, rows)
    binned = curves.band_points(store, [1, 2, 3], "m", n_bins=4)
    band = curves.group_band(binned, {1: "qkv", 2: "qkv", 3: "k_eq_v"})
    qkv = band[band.group == "qkv"].reset_index(drop=True)
    assert qkv["mean"].tolist() == [15.0, 16.0, 17.0, 18.0]
    assert qkv["lo"].tolist() == [10.0, 11.0, 12.0, 13.0]
    assert qkv["hi"].tolist() == [20.0, 21.0, 22.0, 23.0]
    assert qkv["n_runs"].tolist() == [2, 2, 2, 2]
    assert band[band.group == "k_eq_v"]["mean"].tolist() == [30.0, 31.0, 32.0, 33.0]


def test_final_values_last_best_and_divergence(tmp_path):
    rows = [(1, 0, "val/loss", 5.0, None, None), (1, 10, "val/loss", 3.0, None, None),
            (1, 20, "val/loss", 3.5, None, None),
            (2, 0, "val/loss", 5.0, None, None), (2, 10, "val/loss", float("inf"), None, None)]
    store = _store_with_points(tmp_path, rows)
    f = curves.final_values(store, "val/loss").set_index("run_id")
    assert f.loc[1, "final"] == 3.5 and f.loc[1, "final_step"] == 20
    assert f.loc[1, "best"] == 3.0 and f.loc[1, "best_step"] == 10
    assert f.loc[1, "nonfinite"] == 0 and f.loc[2, "nonfinite"] == 1
    assert f.loc[2, "final"] == 5.0
    assert curves.metric_names(store) == ["val/loss"]
    assert curves.metric_names(store, []) == []


def test_best_of_an_accuracy_is_its_highest_value(tmp_path):
    rows = [(1, 0, "val/accuracy", 0.2, None, None), (1, 10, "val/accuracy", 0.7, None, None),
            (1, 20, "val/accuracy", 0.6, None, None), (2, 0, "val_top1", 10.0, None, None),
            (2, 5, "val_top1", 40.0, None, None)]
    store = _store_with_points(tmp_path, rows)
    f = curves.final_values(store, "val/accuracy").set_index("run_id")
    assert (f.loc[1, "final"], f.loc[1, "best"], f.loc[1, "best_step"]) == (0.6, 0.7, 10)
    top1 = curves.final_values(store, "val_top1")
    assert top1["best"].tolist() == [40.0] and top1["best_step"].tolist() == [5]
    # a direction override reads the accuracy as lower-is-better
    low = curves.final_values(store, "val/accuracy", overrides={"val/accuracy": "min"})
    assert low["best"].tolist() == [0.2]


def test_run_metric_summary_final_min_max(tmp_path):
    rows = [(1, 0, "val/loss", 5.0, None, None), (1, 10, "val/loss", 3.0, None, None),
            (1, 20, "val/loss", 3.5, None, None), (1, 30, "val/loss", float("inf"), None, None),
            (2, 0, "val/loss", 4.0, None, None), (2, 0, "other", 1.0, None, None),
            (3, 0, "val/loss", float("inf"), None, None), (3, 1, "val/loss", None, None, None)]  # nothing finite
    store = _store_with_points(tmp_path, rows)
    s = curves.run_metric_summary(store, ["val/loss"])
    assert s.columns.tolist() == ["run_id", "metric", "n", "final_step", "final", "min", "max"]
    assert s.iloc[0][["run_id", "n", "final_step", "final", "min", "max"]].tolist() == [1, 3, 20, 3.5, 3.0, 5.0]
    assert s["run_id"].tolist() == [1, 2]
    assert curves.run_metric_summary(store, ["val/loss"], [2])["run_id"].tolist() == [2]
    assert curves.run_metric_summary(store, []).empty


def test_run_geometry_takes_the_latest_checkpoint(tmp_path):
    store = Store(tmp_path / "g.duckdb")
    store.migrate()
    with store.transaction() as con:
        con.execute("INSERT INTO runs (id, name, source, format) VALUES (1, 'r', '/r', 'csv')")
        for cid, step, kv in ((1, 500, 4), (2, 1000, 1), (3, None, 2)):
            con.execute("INSERT INTO checkpoints (id, path, sha256, architecture, variant, n_layers, n_heads, "
                        "n_kv_heads, d_model, d_head, run_id, step, params_attention, kv_bytes_per_token) "
                        "VALUES (?, 'p', ?, 'gpt2', 'qkv', 2, 4, ?, 8, 2, 1, ?, 100, 64)", [cid, f"s{cid}", kv, step])
    g = curves.run_geometry(store)
    assert g[["run_id", "checkpoint_id", "step", "n_kv_heads"]].values.tolist() == [[1, 2, 1000, 1]]


def test_analysis_results_latest_version_and_head_difference(tmp_path):
    store = Store(tmp_path / "r.duckdb")
    store.migrate()
    with store.transaction() as con:
        for cid, step in ((1, 100), (2, 200)):
            con.execute(
                "INSERT INTO checkpoints (id, path, sha256, architecture, variant, n_layers, n_heads, "
                "n_kv_heads, d_model, d_head, step) VALUES (?, 'x', ?, 'gpt2', 'qkv', 1, 2, 2, 8, 4, ?)",
                [cid, f"h{cid}", step])
        rows = [(1, 0, 0, "kv_cka", 0.2, 1), (1, 0, 1, "kv_cka", 0.4, 1), (1, 0, 0, "kv_cka", 0.9, 0),
                (2, 0, 0, "kv_cka", 0.5, 1), (2, 0, 1, "kv_cka", 0.1, 1), (2, 0, None, "qk_symmetry", 0.6, 1)]
        con.executemany("INSERT INTO analysis_results (checkpoint_id, layer, head, metric, value, "
                        "metric_version) VALUES (?, ?, ?, ?, ?, ?)", rows)
    a = curves.analysis_results(store, 1, 1)
    assert a["value"].tolist() == [0.2, 0.4]  # version 0 row ignored
    assert curves.analysis_results(store, 1, 0)["value"].tolist() == [0.9]
    b = curves.analysis_results(store, 2, 1)
    d = curves.head_difference(a, b)
    assert d["diff"].round(6).tolist() == [0.3, -0.3]
    over = curves.results_over_checkpoints(store, [2, 1], 1, ["kv_cka"])
    assert over["step"].tolist() == [100, 100, 200, 200]
    # rows stored before chance levels existed: the columns are there, empty
    assert list(over.columns)[7:] == ["chance", "n_tokens", "ci_low", "ci_high", "chance_low", "chance_high",
                                      "above_chance", "degenerate"]
    assert over["chance"].isna().all() and d["chance_a"].isna().all()


def _results_db(tmp_path) -> Store:
    """Two checkpoints of one run whose results carry chance levels, written as jobs write them."""
    from loaders.results import replace_results

    store = Store(tmp_path / "chance.duckdb")
    store.migrate()
    with store.transaction() as con:
        con.execute("INSERT INTO runs (id, name, source, format) VALUES (1, 'run1', 'mem', 'csv')")
        for cid, step in ((1, 100), (2, 200)):
            con.execute(
                "INSERT INTO checkpoints (id, path, sha256, architecture, variant, n_layers, n_heads, "
                "n_kv_heads, d_model, d_head, run_id, step) VALUES (?, 'x', ?, 'gpt2', 'qkv', 1, 2, 2, 8, 4, 1, ?)",
                [cid, f"h{cid}", step])
            weights = pd.DataFrame({"layer": [0, 0], "head": [0, 1], "metric": ["kv_share_r2"] * 2,
                                    "value": [0.3 * cid, 0.1], "chance": [0.25, 0.25]})
            acts = pd.DataFrame({"layer": [0], "head": [0], "metric": ["kv_cka_act"], "value": [0.6],
                                 "chance": [0.2], "n_tokens": [4096], "ci_low": [0.55], "ci_high": [0.65]})
            replace_results(con, checkpoint_id=cid, kind="weights", metrics=["kv_share_r2"], metric_version=3,
                            notes={}, seconds=0.1, device="cpu", frame=weights)
            replace_results(con, checkpoint_id=cid, kind="activations", metrics=["kv_cka_act"],
                            metric_version=3, notes={}, seconds=0.1, device="cpu", frame=acts)
    return store


def test_results_readers_carry_chance_tokens_and_interval(tmp_path):
    store = _results_db(tmp_path)
    one = curves.analysis_results(store, 1, 3)
    assert list(one.columns) == ["layer", "head", "metric", "value", "metric_version",
                                 "chance", "n_tokens", "ci_low", "ci_high", "chance_low", "chance_high",
                                 "above_chance", "degenerate", "layer2", "head2"]
    act = one[one["metric"] == "kv_cka_act"].iloc[0]
    assert (act["chance"], act["n_tokens"], act["ci_low"], act["ci_high"]) == (0.2, 4096, 0.55, 0.65)
    w = one[one["metric"] == "kv_share_r2"]
    assert w["chance"].tolist() == [0.25, 0.25]
    assert w["n_tokens"].isna().all() and w["ci_low"].isna().all()  # weight metrics are not sampled
    over = curves.results_over_checkpoints(store, [1, 2], 3)
    assert list(over.columns) == ["checkpoint_id", "run_id", "step", "layer", "head", "metric", "value",
                                  "chance", "n_tokens", "ci_low", "ci_high", "chance_low", "chance_high",
                                 "above_chance", "degenerate"]
    assert over[over["metric"] == "kv_cka_act"]["n_tokens"].tolist() == [4096, 4096]
    empty = curves.results_over_checkpoints(store, [], 3)
    assert list(empty.columns) == list(over.columns)
    d = curves.head_difference(one, curves.analysis_results(store, 2, 3))
    r2 = d[d["metric"] == "kv_share_r2"]
    assert r2["diff"].round(6).tolist() == [0.3, 0.0] and r2["chance_b"].tolist() == [0.25, 0.25]
    act = d[d["metric"] == "kv_cka_act"].iloc[0]
    assert (act["n_tokens_a"], act["ci_low_a"], act["ci_high_b"]) == (4096, 0.55, 0.65)


def test_metric_curves_keep_every_point_and_infinities(tmp_path):
    rows = [(1, s, "val/loss", float(v), None, None) for s, v in enumerate([3.0, 2.0, float("inf")])]
    rows += [(2, 0, "val/loss", 9.0, None, None), (2, 0, "train/loss", 1.0, None, None),
             (2, 1, "val/loss", None, None, None), (3, 0, "train/loss", 1.0, None, None)]
    store = _store_with_points(tmp_path, rows)
    got = list(curves.metric_curves(store, "val/loss"))
    assert [rid for rid, _ in got] == [1, 2]                 # run 3 logs no val/loss
    assert got[0][1][:2].tolist() == [3.0, 2.0] and np.isinf(got[0][1][2])
    # a stored NULL (a logged NaN) reads NaN: the run diverged
    assert got[1][1][0] == 9.0 and np.isnan(got[1][1][1]) and len(got[1][1]) == 2
    assert [(r, v.tolist()[:1]) for r, v in curves.metric_curves(store, "val/loss", [2])] == [(2, [9.0])]
    assert list(curves.metric_curves(store, "val/loss", [3])) == []
    assert curves.metric_names(store) == ["train/loss", "val/loss"] and curves.metric_names(store, [3]) == ["train/loss"]
    # read again each time they are iterated
    stored = curves.StoredCurves(store, "val/loss", (1,))
    assert [v.tolist()[:2] for _, v in stored] == [[3.0, 2.0]] == [v.tolist()[:2] for _, v in stored]


def test_metric_curves_join_a_run_that_spans_batches_in_step_order(tmp_path):
    """Runs logged out of order (steps inserted backwards, runs interleaved) arrive whole and
    in step order, whatever the batch and chunk sizes: each run once, its values by step."""
    rng = np.random.default_rng(0)
    want = {rid: rng.normal(size=n) for rid, n in ((5, 7), (1, 1), (3, 12), (9, 4))}
    rows = [(rid, step, "val/loss", float(v), None, None)
            for rid, vals in want.items() for step, v in reversed(list(enumerate(vals)))]
    rng.shuffle(rows)
    store = _store_with_points(tmp_path, rows)
    for batch_rows, chunk_points in ((1, 1), (2, 5), (3, 12), (5, 13), (1000, 1000)):
        got = list(curves.metric_curves(store, "val/loss", batch_rows=batch_rows, chunk_points=chunk_points))
        assert [rid for rid, _ in got] == [1, 3, 5, 9]
        for rid, values in got:
            assert values.dtype == np.float64 and values.tolist() == want[rid].tolist()
    sub = curves.metric_curves(store, "val/loss", [9, 3], chunk_points=20)      # 3 and 9 in one query
    assert [(rid, v.tolist()) for rid, v in sub] == [(3, want[3].tolist()), (9, want[9].tolist())]


def test_metric_curves_read_the_value_stored_last_at_a_step_stored_twice(tmp_path):
    """A hand-written database: run 1's step 1 stored twice (the later row counts), run 2's
    step 0 again in a later transaction (that one counts), whatever the batch size (a step's
    rows split across batches)."""
    store = _store_with_points(tmp_path, [(1, 0, "m", 5.0, None, None), (1, 1, "m", 4.0, None, None),
                                          (1, 1, "m", 7.0, None, None), (1, 2, "m", 3.0, None, None),
                                          (2, 0, "m", 1.0, None, None), (2, 1, "m", 0.5, None, None)])
    with store.transaction() as con:
        con.execute("INSERT INTO points (run_id, step, metric, value) VALUES (2, 0, 'm', 2.0)")
    for batch_rows in (1, 2, 1000):
        got = {r: v.tolist() for r, v in curves.metric_curves(store, "m", batch_rows=batch_rows)}
        assert got == {1: [5.0, 7.0, 3.0], 2: [2.0, 0.5]}


def test_curve_chunks_hold_whole_runs_up_to_the_limit():
    counts = [(1, 3), (2, 3), (4, 10), (7, 1), (8, 1)]
    assert list(curves._chunks(counts, 6)) == [[1, 2], [4], [7, 8]]
    assert list(curves._chunks(counts, 100)) == [[1, 2, 4, 7, 8]]
    assert list(curves._chunks([], 5)) == []


def test_run_checkpoints_and_latest_with_analysed_flag(tmp_path):
    store = _store_with_points(tmp_path, [(1, 0, "m", 1.0, None, None), (2, 0, "m", 1.0, None, None)])
    with store.transaction() as con:
        for cid, run, step in ((1, 1, 100), (2, 1, 300), (3, 1, 200), (4, 2, None), (5, None, 50)):
            con.execute(
                "INSERT INTO checkpoints (id, path, sha256, architecture, variant, n_layers, n_heads, "
                "n_kv_heads, d_model, d_head, run_id, step) VALUES (?, 'p', ?, 'gpt2', 'qkv', 1, 1, 1, 4, 4, ?, ?)",
                [cid, f"h{cid}", run, step])
        con.execute("INSERT INTO analysis_jobs (checkpoint_id, kind, metric_version) VALUES (2, 'weights', 1)")
    rc = curves.run_checkpoints(store)
    assert rc["checkpoint_id"].tolist() == [1, 3, 2] and rc["run"].tolist() == ["run1"] * 3
    latest = curves.latest_run_checkpoints(store)
    assert latest.to_dict("records") == [{"run_id": 1, "checkpoint_id": 2, "step": 300}]


def test_metric_directions_are_stored_and_change_best(tmp_path):
    import pandas as pd

    from loaders import curves as C
    from loaders.store import Store, refresh_run_stats

    store = Store(tmp_path / "d.duckdb")
    store.migrate()
    with store.transaction() as con:
        con.execute("INSERT INTO runs (id, name, source, format) VALUES (1, 'r', '/r', 'csv')")
        con.register("p", pd.DataFrame({"run_id": 1, "step": [0, 1, 2], "metric": "score", "value": [0.5, 0.9, 0.7]}))
        con.execute("INSERT INTO points (run_id, step, metric, value) SELECT * FROM p")
        refresh_run_stats(con, [1])
    assert C.metric_directions(store) == {}
    assert float(C.final_values(store, "score")["best"].iloc[0]) == 0.9          # 'score' reads as higher
    C.set_metric_direction(store, "score", "min")
    assert C.metric_directions(store) == {"score": "min"}
    assert float(C.final_values(store, "score", overrides=C.metric_directions(store))["best"].iloc[0]) == 0.5
    C.set_metric_direction(store, "score", None)
    assert C.metric_directions(store) == {}
    import pytest
    with pytest.raises(ValueError, match="direction must be 'min', 'max' or None, got 'up'"):
        C.set_metric_direction(store, "score", "up")


def test_metric_curves_read_ingested_logs_and_runs_stored_backwards_in_step_order(tmp_path):
    """Logs as people write them (a folder of CSVs, one with wall times, the last without a
    trailing newline) come back in step order, in chunks of whole runs; so does a run logged
    backwards in a hand-written database."""
    from loaders.ingest import ingest_paths

    rng = np.random.default_rng(1)
    runs = tmp_path / "runs"
    runs.mkdir()
    want = {}
    for i, n in enumerate((40, 3, 25, 60)):
        vals = rng.normal(size=n)
        timed = i == 2
        lines = ["step,val/loss" + (",wall_time" if timed else "")]
        lines += [f"{10 * s},{float(v)!r}" + (f",{1000.0 + s}" if timed else "") for s, v in enumerate(vals)]
        log = runs / f"run{i}.csv"
        log.write_text("\n".join(lines) + ("" if i == 3 else "\n"))
        os.utime(log, (log.stat().st_mtime - 60,) * 2)      # finished: its last line is read without a newline
        want[f"run{i}"] = vals.tolist()
    store = Store(tmp_path / "logs.duckdb")
    store.migrate()
    assert all(r.status == "added" for r in ingest_paths(store, [runs]).files)
    with store.connect() as con:
        names = dict(con.execute("SELECT id, name FROM runs").fetchall())
        assert con.execute("SELECT count(wall_time) FROM points").fetchone()[0] == 25
    for chunk_points in (1, 30, 1000):
        got = {names[r]: v.tolist() for r, v in curves.metric_curves(store, "val/loss", chunk_points=chunk_points)}
        assert got == want
    some = [r for r, name in names.items() if name in ("run0", "run3")]
    assert [names[r] for r, _ in curves.metric_curves(store, "val/loss", some)] == ["run0", "run3"]
    backwards = _store_with_points(tmp_path / "b", [(7, s, "m", float(s), None, None) for s in (3, 2, 1, 0)])
    assert [(r, v.tolist()) for r, v in curves.metric_curves(backwards, "m")] == [(7, [0.0, 1.0, 2.0, 3.0])]


def test_pair_rows_are_cells_of_their_own_and_stay_out_of_step_curves(tmp_path):
    from loaders.results import replace_results

    store = _results_db(tmp_path)
    pairs = pd.DataFrame({"layer": [0, 0, 1], "head": [0, 0, None], "metric": ["xhead_toy", "xhead_toy", "xlayer_toy"],
                          "value": [1.0, 0.25, 0.5], "head2": [0, 1, None], "layer2": [None, None, 0]})
    with store.transaction() as con:
        for cid, shift in ((1, 0.0), (2, 0.5)):
            replace_results(con, checkpoint_id=cid, kind="pairs", metrics=["xhead_toy", "xlayer_toy"],
                            metric_version=3, notes={}, seconds=0.1, device="cpu",
                            frame=pairs.assign(value=pairs["value"] + shift))
    one = curves.analysis_results(store, 1, 3)
    got = one[one["metric"].isin(["xhead_toy", "xlayer_toy"])]
    assert got[["layer", "head", "layer2", "head2"]].astype(object).where(got[["layer", "head", "layer2", "head2"]]
                                                                        .notna(), None).values.tolist() == [
        [0, 0, None, 0], [0, 0, None, 1], [1, None, 0, None]]
    d = curves.head_difference(one, curves.analysis_results(store, 2, 3))
    toy = d[d["metric"] == "xhead_toy"]
    assert toy["head2"].tolist() == [0, 1] and toy["diff"].tolist() == [0.5, 0.5]   # two cells, not one
    over = curves.results_over_checkpoints(store, [1, 2], 3)
    assert not over["metric"].isin(["xhead_toy", "xlayer_toy"]).any()
