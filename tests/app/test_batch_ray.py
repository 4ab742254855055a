"""Batch analysis on a local Ray instance: same results as in-process, crashed workers retried."""
from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
import pytest

from app import batch, jobs
from app.cli import main
from loaders.store import Store
from tests.app.test_batch import make_checkpoints

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -r requirements-scale.txt)")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    assert batch.connect_ray("local", num_cpus=2, quiet_workers=True)   # ray.init(num_cpus=2, ...)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> list[Path]:
    return make_checkpoints(tmp_path_factory.mktemp("ray") / "ckpts")


def _ids(store: Store, paths) -> list[int]:
    return [jobs.resolve(store, str(p)) for p in paths]


def _parquet(files: list[str]):
    with duckdb.connect() as con:
        return con.execute("SELECT checkpoint_sha256, layer, head, metric, value FROM "
                           "read_parquet(?, hive_partitioning = false) "
                           "ORDER BY checkpoint_sha256, metric, layer, head NULLS FIRST", [files]).fetchall()


def test_ray_results_identical_to_in_process(local_ray, ckpts, tmp_path):
    local = Store(tmp_path / "local.duckdb")
    rep_local = batch.run_batch(local, _ids(local, ckpts), results=tmp_path / "local", device="cpu")
    on_ray = Store(tmp_path / "ray.duckdb")
    rep_ray = batch.run_batch(on_ray, _ids(on_ray, ckpts), results=tmp_path / "ray", device="cpu",
                              ray_address="auto")
    assert rep_ray.executor == "ray auto" and [c.status for c in rep_ray.checkpoints] == ["computed"] * 3
    assert all(a["pid"] != os.getpid() for c in rep_ray.checkpoints for a in c.attempts)   # ran on workers
    a = _parquet([f for c in rep_local.checkpoints for f in c.files])
    b = _parquet([f for c in rep_ray.checkpoints for f in c.files])
    assert len(a) == sum(c.rows for c in rep_local.checkpoints) > 0
    assert a == b                                                       # bit for bit
    q = ("SELECT c.sha256, r.layer, r.head, r.metric, r.value FROM analysis_results r "
         "JOIN checkpoints c ON c.id = r.checkpoint_id ORDER BY 1, 4, 2, 3 NULLS FIRST")
    with local.connect() as c1, on_ray.connect() as c2:
        assert c1.execute(q).fetchall() == c2.execute(q).fetchall()
        assert (c1.execute("SELECT kind, notes FROM analysis_jobs ORDER BY checkpoint_id").fetchall()
                == c2.execute("SELECT kind, notes FROM analysis_jobs ORDER BY checkpoint_id").fetchall())


def test_worker_killed_mid_task_is_retried(local_ray, ckpts, tmp_path):
    store = Store(tmp_path / "k.duckdb")
    ids = _ids(store, ckpts)
    with store.connect() as con:
        victim = con.execute("SELECT sha256 FROM checkpoints WHERE id = ?", [ids[1]]).fetchone()[0]
    marker = tmp_path / "killed-once"

    def kill_once(spec, log):
        """Dies (SIGKILL) right after its first attempt on ``victim`` has started."""
        import ray as _ray

        class KillingLog:
            def start(self, *args):
                attempt = _ray.get(log.start.remote(*args))
                if spec.sha256 == victim and not marker.exists():
                    marker.touch()
                    os.kill(os.getpid(), 9)
                return attempt

            def end(self, *args):
                return _ray.get(log.end.remote(*args))

        return batch.run_task(spec, KillingLog())

    rep = batch.run_batch(store, ids, results=tmp_path / "r", device="cpu", ray_address="auto",
                          task_fn=kill_once, retries=2)
    assert marker.exists()
    assert [c.status for c in rep.checkpoints] == ["computed"] * 3
    c = rep.checkpoints[1]
    assert [a["outcome"] for a in c.attempts] == ["no result: the worker process died", "computed"]
    assert c.attempts[0]["pid"] != c.attempts[1]["pid"]
    with store.connect() as con:
        n = con.execute("SELECT count(*) FROM analysis_results WHERE checkpoint_id = ?", [ids[1]]).fetchone()[0]
    assert n == c.rows > 0


def test_worker_that_always_dies_is_reported_not_dropped(local_ray, ckpts, tmp_path):
    store = Store(tmp_path / "d.duckdb")
    ids = _ids(store, ckpts)
    with store.connect() as con:
        victim = con.execute("SELECT sha256 FROM checkpoints WHERE id = ?", [ids[0]]).fetchone()[0]

    def always_dies(spec, log):
        if spec.sha256 == victim:
            import ray as _ray

            _ray.get(log.start.remote(spec.sha256, "h", os.getpid()))
            os._exit(1)
        return batch.run_task(spec, log)

    rep = batch.run_batch(store, ids, results=tmp_path / "r", device="cpu", ray_address="auto",
                          task_fn=always_dies, retries=1)
    assert [c.status for c in rep.checkpoints] == ["failed", "computed", "computed"]
    bad = rep.checkpoints[0]
    assert bad.error.startswith("WorkerCrashedError: ") and bad.files == [] and bad.rows == 0
    assert [a["outcome"] for a in bad.attempts] == ["no result: the worker process died"] * 2
    with store.connect() as con:
        assert con.execute("SELECT count(*) FROM analysis_results WHERE checkpoint_id = ?",
                           [ids[0]]).fetchone()[0] == 0


def test_cli_ray_then_rerun_skips(local_ray, ckpts, tmp_path, capsys):
    db = tmp_path / "cli.duckdb"
    pattern = str(ckpts[0].parent.parent / "**" / "*.safetensors")
    results = tmp_path / "res"
    args = ["analyze", pattern, "--db", str(db), "--ray", "auto", "--results", str(results),
            "--device", "cpu", "--gpus-per-task", "0", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["computed"], out["failed"], out["executor"]) == (3, 0, "ray auto")
    assert out["results"] == str(results)
    assert main(args) == 0
    again = json.loads(capsys.readouterr().out)
    assert (again["computed"], again["skipped"]) == (0, 3)
