"""Compare page in AppTest: two checkpoints' per-head difference, a run's checkpoints over training."""
from __future__ import annotations

import numpy as np
import pytest

from loaders.ingest import ingest_paths
from loaders.store import Store
from tests.app.apptest import page_test
from tests.app.test_page_experiments import arr, figures, qp
from tests.app.test_page_inspector import tiny_gpt2


@pytest.fixture(scope="module")
def run_db(tmp_path_factory):
    """One run folder with a CSV log and three checkpoints (steps 100, 200, 300)."""
    root = tmp_path_factory.mktemp("cmp")
    run = root / "runs" / "gpt2-wd0.1"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text("step,train_loss\n" + "".join(f"{s},{4 - s / 1000}\n" for s in range(0, 301, 50)))
    for i, step in enumerate((100, 200, 300)):
        tiny_gpt2(run / f"step_{step}", seed=i)
    db = root / "cmp.duckdb"
    report = ingest_paths(Store(db), [root / "runs"]).to_json()
    assert report["errors"] == 0 and report["added"] == 4, report
    return db


def test_empty_database_says_how_to_get_checkpoints(tmp_path, monkeypatch):
    db = tmp_path / "e.duckdb"
    Store(db).migrate()
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    at = page_test("compare").run()
    assert not at.exception
    assert at.info[0].value.startswith("No checkpoints stored yet.")


def test_pair_difference_is_b_minus_a(run_db, monkeypatch):
    monkeypatch.setenv("QKVSCOPE_DB", str(run_db))
    at = page_test("compare", {"a": "1", "b": "3", "metric": "kv_cka"}).run()
    assert not at.exception, at.exception
    figs = figures(at)
    za = arr(figs["cmp_heat_a"]["data"][0]["z"])
    zb = arr(figs["cmp_heat_b"]["data"][0]["z"])
    zd = arr(figs["cmp_diff"]["data"][0]["z"])
    np.testing.assert_allclose(np.array(zd), np.array(zb) - np.array(za), rtol=1e-6, atol=1e-9)
    assert np.abs(np.array(zd)).max() > 0  # different seeds: different weights
    at.selectbox(key="cmp_metric").select("qk_symmetry").run()
    assert figures(at)["cmp_diff"]["data"][0]["colorbar"]["title"]["text"] == "B - A"
    assert qp(at, "metric") == "qk_symmetry"
    # the same checkpoint on both sides: no difference at all
    same = page_test("compare", {"a": "2", "b": "2"}).run()
    assert all(v == 0 for row in arr(figures(same)["cmp_diff"]["data"][0]["z"]) for v in row)


def test_run_trajectory_has_one_line_per_layer_over_steps(run_db, monkeypatch):
    monkeypatch.setenv("QKVSCOPE_DB", str(run_db))
    at = page_test("compare", {"tmetric": "kv_share_r2"}).run()
    assert not at.exception, at.exception
    traj = figures(at)["cmp_traj"]["data"]
    assert [t["name"] for t in traj] == ["L0", "L1"]
    assert arr(traj[0]["x"]) == [100, 200, 300]
    assert qp(at, "tmetric") == "kv_share_r2" and qp(at, "run") == "1"
