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
    assert rep_ray.executor == "ray auto" and [c.status for c in rep_ray.checkpoints] == ["computed"] * 3, [c.error for c in rep_ray.checkpoints]
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


# -- layer groups on Ray -------------------------------------------------------------------
@pytest.fixture(scope="module")
def deep(tmp_path_factory) -> Path:
    from tests.app.test_batch import make_deep

    return make_deep(tmp_path_factory.mktemp("ray-deep"))


def _finite(rows):
    """NaN never equals itself: compare undefined values as None."""
    import math

    return [tuple(None if isinstance(x, float) and not math.isfinite(x) else x for x in r) for r in rows]


def _stored(store: Store):
    q = ("SELECT c.sha256, r.layer, r.head, r.metric, r.value FROM analysis_results r "
         "JOIN checkpoints c ON c.id = r.checkpoint_id ORDER BY 1, 4, 2, 3 NULLS FIRST")
    with store.connect() as con:
        return (con.execute(q).fetchall(),
                con.execute("SELECT c.sha256, j.kind, j.device, j.notes FROM analysis_jobs j "
                            "JOIN checkpoints c ON c.id = j.checkpoint_id ORDER BY 1, 2").fetchall())


def test_ray_layer_groups_identical_to_in_process_and_to_one_task(local_ray, deep, ckpts, tmp_path):
    paths = [deep, ckpts[0]]
    whole = Store(tmp_path / "whole.duckdb")
    batch.run_batch(whole, _ids(whole, paths), results=tmp_path / "whole", device="cpu")
    local = Store(tmp_path / "local.duckdb")
    rep_local = batch.run_batch(local, _ids(local, paths), results=tmp_path / "local", device="cpu",
                                max_task_bytes=1)
    on_ray = Store(tmp_path / "ray.duckdb")
    rep_ray = batch.run_batch(on_ray, _ids(on_ray, paths), results=tmp_path / "ray", device="cpu",
                              max_task_bytes=1, ray_address="auto")
    assert [c.status for c in rep_ray.checkpoints] == ["computed"] * 2
    assert [len(c.groups) for c in rep_ray.checkpoints] == [5, 2]          # one layer a task
    assert all(a["pid"] != os.getpid() for c in rep_ray.checkpoints for a in c.attempts)
    files = lambda rep: [g["file"] for c in rep.checkpoints for g in c.groups]
    assert _finite(_parquet(files(rep_local))) == _finite(_parquet(files(rep_ray)))   # bit for bit
    assert _stored(local) == _stored(on_ray) == _stored(whole)


def test_ray_group_that_raises_once_is_retried(local_ray, deep, tmp_path):
    store = Store(tmp_path / "g.duckdb")
    (cid,) = _ids(store, [deep])
    marker = tmp_path / "failed-once"

    def bad_device_once(spec, log):
        """The first attempt of layers 2-3 raises on the worker, outside the reading child (a
        worker whose device went away); the retry runs as asked. (An error inside the child is
        the file's and is not retried: tests/app/test_batch.py.)"""
        if spec.layers == (2, 4) and not marker.exists():
            import os
            import socket

            from app.batch.task import log_call

            marker.touch()
            # the attempt is logged as run_task logs one that raises outside the child
            attempt = log_call(log, "start", spec.key, socket.gethostname(), os.getpid())
            log_call(log, "end", spec.key, attempt, "RuntimeError: the worker lost its device "
                                                    "(retried if attempts remain)")
            raise RuntimeError("the worker lost its device")
        return batch.run_task(spec, log)

    rep = batch.run_batch(store, [cid], results=tmp_path / "r", device="cpu", ray_address="auto",
                          task_fn=bad_device_once, max_task_bytes=2 * _layer_bytes(store, cid), retries=2)
    c = rep.checkpoints[0]
    assert marker.exists() and c.status == "computed"
    outcomes = {tuple(g["layers"]): [a["outcome"] for a in g["attempts"]] for g in c.groups}
    assert outcomes[(0, 1)] == outcomes[(4, 4)] == ["computed"]
    first, second = outcomes[(2, 3)]
    assert first.startswith("RuntimeError: ") and first.endswith("(retried if attempts remain)")
    assert second == "computed"
    whole = Store(tmp_path / "whole.duckdb")
    batch.run_batch(whole, _ids(whole, [deep]), results=tmp_path / "w", device="cpu")
    assert _stored(store) == _stored(whole)


def test_ray_group_whose_worker_always_dies_registers_nothing(local_ray, deep, tmp_path):
    store = Store(tmp_path / "d.duckdb")
    (cid,) = _ids(store, [deep])

    def layer_4_dies(spec, log):
        if spec.layers == (4, 5):
            import ray as _ray

            _ray.get(log.start.remote(spec.key, "h", os.getpid()))
            os._exit(1)
        return batch.run_task(spec, log)

    rep = batch.run_batch(store, [cid], results=tmp_path / "r", device="cpu", ray_address="auto",
                          task_fn=layer_4_dies, max_task_bytes=2 * _layer_bytes(store, cid), retries=1)
    c = rep.checkpoints[0]
    assert c.status == "failed" and c.error.startswith("layers 4-4: WorkerCrashedError: ")
    assert [g["status"] for g in c.groups] == ["computed", "computed", "failed"]
    assert [a["outcome"] for a in c.groups[2]["attempts"]] == ["no result: the worker process died"] * 2
    with store.connect() as con:
        for table in ("analysis_results", "analysis_jobs", "analysis_result_files"):
            assert con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0
    assert not list((tmp_path / "r").glob("**/job.parquet"))


def _layer_bytes(store: Store, cid: int) -> int:
    from tests.app.test_batch import _layer_bytes as layer_bytes

    return layer_bytes(store, cid)
