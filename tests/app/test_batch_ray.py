"""Batch analysis on one local Ray instance (1 CPU, so one worker and its reading child serve the
tasks one after the other): the same rows as in-process, crashed workers retried, layer groups.
Each run on Ray is compared with one in-process run of its checkpoints (``reference``, itself run
inside the Ray worker so that one reading child computes the chance levels for both).

Two runs on Ray: the CLI (``analyze PATTERN --ray auto --json``, then a re-run that skips), and
one batch in which every failure a worker can have happens at once (``test_failures_on_ray``)."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import duckdb
import pytest

from analysis import registry
from app import batch, jobs
from app.batch.report import log_call
from app.cli import main
from loaders.store import Store
from tests.app.test_batch import PAIRS, SPLIT_NOTE, _layer_bytes, make_checkpoints, make_deep

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -r requirements-scale.txt)")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    assert batch.connect_ray("local", num_cpus=1, quiet_workers=True)   # ray.init(num_cpus=1, ...)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> list[Path]:
    """Two tiny models: no ties and K = V (its job rows carry ties)."""
    return make_checkpoints(tmp_path_factory.mktemp("ray") / "ckpts", ("qkv", "k_eq_v"))


@pytest.fixture(scope="module")
def deep(tmp_path_factory) -> Path:
    return make_deep(tmp_path_factory.mktemp("ray-deep"))


@pytest.fixture(scope="module")
def reference(local_ray, tmp_path_factory, ckpts, deep):
    """Every checkpoint of this module that computes on Ray, analysed by the in-process executor
    (``run_batch`` without ``ray_address``), one task each: the store, which every run on Ray must
    equal (in-process layer groups equal one task: tests/app/test_batch.py). It runs inside the
    Ray worker, so that worker's reading child computes the chance levels once for the reference
    and the runs on Ray that follow."""
    d = tmp_path_factory.mktemp("reference")
    store = Store(d / "ref.duckdb")
    ids = _ids(store, [*ckpts, deep])

    def in_process():
        return batch.run_batch(store, ids, results=d / "res", device="cpu")

    rep = ray.get(ray.remote(num_cpus=1)(in_process).remote())
    assert [c.status for c in rep.checkpoints] == ["computed"] * 3 and rep.executor == "in-process"
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


def _sha(store: Store, cid: int) -> str:
    with store.connect() as con:
        return con.execute("SELECT sha256 FROM checkpoints WHERE id = ?", [cid]).fetchone()[0]


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
    assert (out["computed"], out["failed"], out["executor"]) == (2, 0, "ray auto"), out["checkpoints"]
    assert out["results"] == str(results)
    assert all(a["pid"] != os.getpid() for c in out["checkpoints"] for a in c["attempts"])   # ran on workers
    on_ray = {c["sha256"]: c for c in out["checkpoints"]}
    local = [c for c in ref_rep.checkpoints if c.sha256 in on_ray]
    a = _parquet([f for c in local for f in c.files])
    b = _parquet([f for c in on_ray.values() for f in c["files"]])
    assert len(a) == sum(c.rows for c in local) > 0
    assert a == b                                                       # bit for bit
    stored = _stored(Store(db))
    assert stored == _stored(ref_store, set(on_ray))                    # the same result and job rows
    assert {json.loads(j[6])["variant"] for j in stored[1]} == {"qkv", "k_eq_v"}   # the ties of both
    assert main(args) == 0
    again = json.loads(capsys.readouterr().out)
    assert (again["computed"], again["skipped"]) == (0, 2)


def test_failures_on_ray(local_ray, ckpts, deep, reference, tmp_path):
    """One batch, four checkpoints, every failure a worker can have (the failures come last, so
    the worker the CLI test left, whose reading child has the chance levels, computes the rest):

    * K = V's worker is killed (SIGKILL) right after its first attempt started: retried, computed;
    * qkv's worker dies at once on every attempt: reported, nothing stored;
    * ``deep`` in layer groups (2 layers a task): the first attempt of layers 2-3 raises on the
      worker, outside the reading child (a worker whose device went away), and is retried as
      asked (an error inside the child is the file's and is not retried: tests/app/test_batch.py);
      the groups store what one task stores, less the pairs of layers, whose note says why;
    * ``deep2`` in layer groups: the worker of layers 4-4 dies on every attempt: the checkpoint
      fails with that range named, and none of its groups is registered.
    """
    deep2 = make_deep(tmp_path / "deep2", seed=8)
    store = Store(tmp_path / "k.duckdb")
    ids = _ids(store, [deep, deep2, ckpts[1], ckpts[0]])
    split, split_dies, killed, dies = (_sha(store, i) for i in ids)
    killed_once, raised_once = tmp_path / "killed-once", tmp_path / "raised-once"

    def failing(spec, log):
        import ray as _ray

        if spec.sha256 == dies or (spec.sha256 == split_dies and spec.layers == (4, 5)):
            _ray.get(log.start.remote(spec.key, "h", os.getpid()))
            os._exit(1)
        if spec.sha256 == split and spec.layers == (2, 4) and not raised_once.exists():
            raised_once.touch()
            # the attempt is logged as run_task logs one that raises outside the child
            attempt = log_call(log, "start", spec.key, socket.gethostname(), os.getpid())
            log_call(log, "end", spec.key, attempt, "RuntimeError: the worker lost its device "
                                                    "(retried if attempts remain)")
            raise RuntimeError("the worker lost its device")

        class KillingLog:
            def start(self, *args):
                attempt = _ray.get(log.start.remote(*args))
                if spec.sha256 == killed and not killed_once.exists():
                    killed_once.touch()
                    os.kill(os.getpid(), 9)
                return attempt

            def end(self, *args):
                return _ray.get(log.end.remote(*args))

        return batch.run_task(spec, KillingLog())

    rep = batch.run_batch(store, ids, results=tmp_path / "r", device="cpu", ray_address="auto",
                          task_fn=failing, retries=1, max_task_bytes=2 * _layer_bytes(store, ids[0]))
    assert killed_once.exists() and raised_once.exists()
    assert [c.status for c in rep.checkpoints] == ["computed", "failed", "computed", "failed"]
    grouped, bad_group, c, bad = rep.checkpoints
    assert all(a["pid"] != os.getpid() for x in rep.checkpoints for a in x.attempts)      # ran on workers

    # a worker that always dies: reported, never dropped, nothing stored
    assert bad.error.startswith("WorkerCrashedError: ") and bad.files == [] and bad.rows == 0
    assert [a["outcome"] for a in bad.attempts] == ["no result: the worker process died"] * 2
    # a worker killed once: retried on a new worker
    assert c.groups == [] and [a["outcome"] for a in c.attempts] == ["no result: the worker process died", "computed"]
    assert c.attempts[0]["pid"] != c.attempts[1]["pid"]
    with store.connect() as con:
        per_checkpoint = dict(con.execute("SELECT checkpoint_id, count(*) FROM analysis_results "
                                          "GROUP BY ALL").fetchall())
    assert per_checkpoint == {ids[0]: grouped.rows, ids[2]: c.rows} and c.rows > 0

    # layer groups, one retried: the rows and job rows of one task, less the pairs of layers
    assert [g["layers"] for g in grouped.groups] == [[0, 1], [2, 3], [4, 4]]
    outcomes = {tuple(g["layers"]): [a["outcome"] for a in g["attempts"]] for g in grouped.groups}
    first, second = outcomes.pop((2, 3))
    assert first.startswith("RuntimeError: ") and first.endswith("(retried if attempts remain)")
    assert second == "computed" and set(map(tuple, outcomes.values())) == {("computed",)}
    assert _stored(store, {killed}) == _stored(reference[0], {killed})
    assert _but_layer_pairs(_stored(store, {split})) == _but_layer_pairs(_stored(reference[0], {split}))
    assert _stored(store, {split})[0] == _but_layer_pairs(_stored(store, {split}))[0]   # no pairs of layers ...
    with store.connect() as con:
        (notes,) = con.execute("SELECT notes FROM analysis_jobs WHERE checkpoint_id = ? AND kind = 'weights'",
                               [ids[0]]).fetchone()
    assert {m: why for m, why in json.loads(notes).items() if m in PAIRS} == {  # ... a note says why
        m: SPLIT_NOTE for m in PAIRS if registry.BY_NAME[m].level == "weights"}

    # a layer group whose worker always dies: the checkpoint fails, none of its groups registered
    assert bad_group.error.startswith("layers 4-4: WorkerCrashedError: ")
    assert [g["status"] for g in bad_group.groups] == ["computed", "computed", "failed"]
    assert [a["outcome"] for a in bad_group.groups[2]["attempts"]] == ["no result: the worker process died"] * 2
    with store.connect() as con:
        for table in ("analysis_results", "analysis_jobs", "analysis_result_files"):
            assert con.execute(f"SELECT count(*) FROM {table} WHERE checkpoint_id IN (?, ?)",
                               [ids[1], ids[3]]).fetchone()[0] == 0
    assert not list((tmp_path / "r").glob(f"checkpoint={split_dies}/**/job.parquet"))
