"""Batch analysis on a local Ray instance (one per module): the same rows as in-process, crashed
workers retried, layer groups. Each run on Ray is compared with one in-process run of every
checkpoint (``reference``)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
import pytest

from analysis import registry
from app import batch, jobs
from app.cli import main
from loaders.store import Store
from tests.app.test_batch import PAIRS, SPLIT_NOTE, make_checkpoints

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


@pytest.fixture(scope="module")
def deep(tmp_path_factory) -> Path:
    from tests.app.test_batch import make_deep

    return make_deep(tmp_path_factory.mktemp("ray-deep"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, ckpts, deep):
    """Every checkpoint of this module analysed in this process, one task each: the store and its
    report, which every run on Ray must equal (in-process layer groups equal one task:
    tests/app/test_batch.py)."""
    d = tmp_path_factory.mktemp("reference")
    store = Store(d / "ref.duckdb")
    rep = batch.run_batch(store, _ids(store, [*ckpts, deep]), results=d / "res", device="cpu")
    assert [c.status for c in rep.checkpoints] == ["computed"] * 4
    return store, rep


def _ids(store: Store, paths) -> list[int]:
    return [jobs.resolve(store, str(p)) for p in paths]


def _parquet(files: list[str]):
    with duckdb.connect() as con:
        return con.execute("SELECT checkpoint_sha256, layer, head, metric, value FROM "
                           "read_parquet(?, hive_partitioning = false) "
                           "ORDER BY checkpoint_sha256, metric, layer, head NULLS FIRST", [files]).fetchall()


def _finite(rows):
    """NaN never equals itself: compare undefined values as None."""
    import math

    return [tuple(None if isinstance(x, float) and not math.isfinite(x) else x for x in r) for r in rows]


def _stored(store: Store, shas=None):
    """The stored result rows and job rows (of the checkpoints ``shas``; default all)."""
    q = ("SELECT c.sha256, r.layer, r.head, r.metric, r.value, r.layer2, r.head2 FROM analysis_results r "
         "JOIN checkpoints c ON c.id = r.checkpoint_id ORDER BY 1, 4, 2, 3 NULLS FIRST, 6 NULLS FIRST, 7 NULLS FIRST")
    with store.connect() as con:
        rows = con.execute(q).fetchall()
        job_rows = con.execute("SELECT c.sha256, j.kind, j.metric_version, j.device, j.notes, j.sample, j.tied "
                               "FROM analysis_jobs j JOIN checkpoints c ON c.id = j.checkpoint_id "
                               "ORDER BY 1, 2").fetchall()
    keep = (lambda r: r[0] in shas) if shas is not None else (lambda r: True)
    return _finite([r for r in rows if keep(r)]), [r for r in job_rows if keep(r)]


def _but_layer_pairs(stored):
    """``_stored``'s rows and jobs less the pairs of layers and their notes (``PAIRS``): a checkpoint
    analysed in layer groups has none, and a note says why."""
    rows, job_rows = stored
    return [r for r in rows if r[3] not in PAIRS], [
        (*j[:4], json.dumps({m: why for m, why in json.loads(j[4]).items() if m not in PAIRS}) if j[4] else j[4],
         *j[5:]) for j in job_rows]


def _shas(store: Store, ids) -> set[str]:
    with store.connect() as con:
        return {con.execute("SELECT sha256 FROM checkpoints WHERE id = ?", [i]).fetchone()[0] for i in ids}


def test_cli_on_ray_stores_what_in_process_stores_then_a_rerun_skips(local_ray, ckpts, reference, tmp_path,
                                                                     capsys):
    ref_store, ref_rep = reference
    db = tmp_path / "cli.duckdb"
    pattern = str(ckpts[0].parent.parent / "**" / "*.safetensors")
    results = tmp_path / "res"
    args = ["analyze", pattern, "--db", str(db), "--ray", "auto", "--results", str(results),
            "--device", "cpu", "--gpus-per-task", "0", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["computed"], out["failed"], out["executor"]) == (3, 0, "ray auto"), out["checkpoints"]
    assert out["results"] == str(results)
    assert all(a["pid"] != os.getpid() for c in out["checkpoints"] for a in c["attempts"])   # ran on workers
    on_ray = {c["sha256"]: c for c in out["checkpoints"]}
    local = [c for c in ref_rep.checkpoints if c.sha256 in on_ray]
    a = _parquet([f for c in local for f in c.files])
    b = _parquet([f for c in on_ray.values() for f in c["files"]])
    assert len(a) == sum(c.rows for c in local) > 0
    assert a == b                                                       # bit for bit
    assert _stored(Store(db)) == _stored(ref_store, set(on_ray))        # the same result and job rows
    assert main(args) == 0
    again = json.loads(capsys.readouterr().out)
    assert (again["computed"], again["skipped"]) == (0, 3)


def test_a_worker_killed_once_is_retried_one_that_always_dies_is_reported(local_ray, ckpts, tmp_path):
    store = Store(tmp_path / "k.duckdb")
    ids = _ids(store, ckpts)
    with store.connect() as con:
        dies, killed = (con.execute("SELECT sha256 FROM checkpoints WHERE id = ?", [i]).fetchone()[0]
                        for i in ids[:2])
    marker = tmp_path / "killed-once"

    def kill_tasks(spec, log):
        """``killed``: dies (SIGKILL) right after its first attempt has started; ``dies``: every
        attempt exits at once."""
        import ray as _ray

        if spec.sha256 == dies:
            _ray.get(log.start.remote(spec.sha256, "h", os.getpid()))
            os._exit(1)

        class KillingLog:
            def start(self, *args):
                attempt = _ray.get(log.start.remote(*args))
                if spec.sha256 == killed and not marker.exists():
                    marker.touch()
                    os.kill(os.getpid(), 9)
                return attempt

            def end(self, *args):
                return _ray.get(log.end.remote(*args))

        return batch.run_task(spec, KillingLog())

    rep = batch.run_batch(store, ids, results=tmp_path / "r", device="cpu", ray_address="auto",
                          task_fn=kill_tasks, retries=1)
    assert marker.exists()
    assert [c.status for c in rep.checkpoints] == ["failed", "computed", "computed"]
    bad, c = rep.checkpoints[:2]
    assert bad.error.startswith("WorkerCrashedError: ") and bad.files == [] and bad.rows == 0
    assert [a["outcome"] for a in bad.attempts] == ["no result: the worker process died"] * 2
    assert [a["outcome"] for a in c.attempts] == ["no result: the worker process died", "computed"]
    assert c.attempts[0]["pid"] != c.attempts[1]["pid"]
    with store.connect() as con:
        assert con.execute("SELECT count(*) FROM analysis_results WHERE checkpoint_id = ?",
                           [ids[0]]).fetchone()[0] == 0
        n = con.execute("SELECT count(*) FROM analysis_results WHERE checkpoint_id = ?", [ids[1]]).fetchone()[0]
    assert n == c.rows > 0


# -- layer groups on Ray -------------------------------------------------------------------
def test_ray_layer_groups_one_retried_store_what_one_task_stores(local_ray, deep, ckpts, reference, tmp_path):
    """One layer a task on Ray; the first attempt of layer 2 raises on the worker, outside the
    reading child (a worker whose device went away), and is retried as asked. (An error inside
    the child is the file's and is not retried: tests/app/test_batch.py.)"""
    marker = tmp_path / "failed-once"

    def bad_device_once(spec, log):
        if spec.layers == (2, 3) and not marker.exists():
            import socket

            from app.batch.task import log_call

            marker.touch()
            # the attempt is logged as run_task logs one that raises outside the child
            attempt = log_call(log, "start", spec.key, socket.gethostname(), os.getpid())
            log_call(log, "end", spec.key, attempt, "RuntimeError: the worker lost its device "
                                                    "(retried if attempts remain)")
            raise RuntimeError("the worker lost its device")
        return batch.run_task(spec, log)

    on_ray = Store(tmp_path / "ray.duckdb")
    ids = _ids(on_ray, [deep, ckpts[0]])
    rep = batch.run_batch(on_ray, ids, results=tmp_path / "ray", device="cpu", task_fn=bad_device_once,
                          max_task_bytes=1, ray_address="auto", retries=2)
    assert marker.exists()
    assert [c.status for c in rep.checkpoints] == ["computed"] * 2
    assert [len(c.groups) for c in rep.checkpoints] == [5, 2]          # one layer a task
    assert all(a["pid"] != os.getpid() for c in rep.checkpoints for a in c.attempts)
    outcomes = {tuple(g["layers"]): [a["outcome"] for a in g["attempts"]] for g in rep.checkpoints[0].groups}
    first, second = outcomes.pop((2, 2))
    assert first.startswith("RuntimeError: ") and first.endswith("(retried if attempts remain)")
    assert second == "computed" and set(map(tuple, outcomes.values())) == {("computed",)}
    assert _but_layer_pairs(_stored(on_ray)) == _but_layer_pairs(_stored(reference[0], _shas(on_ray, ids)))
    with on_ray.connect() as con:
        assert con.execute("SELECT count(*) FROM analysis_results WHERE metric IN (SELECT unnest(?))",
                           [sorted(PAIRS)]).fetchone() == (0,)
        for (notes,) in con.execute("SELECT notes FROM analysis_jobs WHERE kind = 'weights'").fetchall():
            assert {m: why for m, why in json.loads(notes).items() if m in PAIRS} == {
                m: SPLIT_NOTE for m in PAIRS if registry.BY_NAME[m].level == "weights"}


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
