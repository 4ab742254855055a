"""Batch analysis in-process: Parquet layout, registration, skips, retries, reports, the CLI."""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
import torch

from analysis import registry
from analysis.registry import METRIC_VERSION, names
from app import batch, jobs
from app.cli import main
from loaders.batch_results import STORED_COLUMNS
from loaders.store import Store

VARIANTS = ("qkv", "k_eq_v", "q_eq_k")         # one shape, none query-free: one chance level for all


def make_checkpoints(root: Path, variants: tuple[str, ...] = VARIANTS) -> list[Path]:
    """qkvscope's own tiny models (2 layers, 4 heads, GQA-2), one per variant (default: three)."""
    from experiments.model import GPT, GPTConfig
    from experiments.train import TrainConfig, save_checkpoint

    paths = []
    for variant in variants:
        torch.manual_seed(VARIANTS.index(variant))
        model = GPT(GPTConfig(n_layer=2, n_head=4, n_kv_heads=2, d_model=32, variant=variant)).eval()
        path = root / f"run_{variant}" / "final_step_000010.safetensors"
        path.parent.mkdir(parents=True)
        save_checkpoint(model, path, step=10, tokens=100, final=True, tc=TrainConfig())
        paths.append(path)
    return paths


@pytest.fixture
def ckpts(tmp_path) -> list[Path]:
    return make_checkpoints(tmp_path / "ckpts")


class Counting:
    """``run_task`` that counts its calls and can raise on chosen attempts."""

    def __init__(self, fail: dict[str, int] | None = None):
        self.calls: list[str] = []
        self.fail = fail or {}          # sha256 -> how many first attempts raise

    def __call__(self, spec, log):
        self.calls.append(spec.sha256)
        if self.calls.count(spec.sha256) <= self.fail.get(spec.sha256, 0):
            raise RuntimeError(f"flaky disk under {Path(spec.path).parent.name}")
        return batch.run_task(spec, log)


def _ids(store: Store, paths) -> list[int]:
    return [jobs.resolve(store, str(p)) for p in paths]


def _sha(store: Store, cid: int) -> str:
    with store.connect() as con:
        return con.execute("SELECT sha256 FROM checkpoints WHERE id = ?", [cid]).fetchone()[0]


def test_parquet_layout_and_registration(tmp_path, ckpts):
    store = Store(tmp_path / "b.duckdb")
    ids = _ids(store, ckpts)
    results = tmp_path / "results"
    rep = batch.run_batch(store, ids, results=results, device="cpu")
    assert rep.executor == "in-process" and [c.status for c in rep.checkpoints] == ["computed"] * 3
    for c in rep.checkpoints:
        folder = results / f"checkpoint={c.sha256}" / f"metric_version={METRIC_VERSION}" / "kind=weights"
        assert c.files == [str(folder / "part.parquet")]
        assert sorted(p.name for p in folder.iterdir()) == ["job.parquet", "part.parquet"]
        assert [a["outcome"] for a in c.attempts] == ["computed"]
    part = rep.checkpoints[0].files[0]
    with duckdb.connect() as con:
        cols = [d[0] for d in con.execute("SELECT * FROM read_parquet(?, hive_partitioning = false)", [part]).description]
        job = con.execute("SELECT kind, metric_version, notes, device FROM read_parquet(?, hive_partitioning = false)",
                          [str(Path(part).with_name("job.parquet"))]).fetchall()
        everything = con.execute("SELECT checkpoint, count(*) FROM read_parquet(?, hive_partitioning = true) "
                                 "GROUP BY checkpoint", [str(results / "**" / "part.parquet")]).fetchall()
    assert cols == ["checkpoint_sha256", "path", "layer", "head", "metric", "value", "chance", "n_tokens",
                    "ci_low", "ci_high", "chance_low", "chance_high", "above_chance", "degenerate", "layer2", "head2"]
    assert job[0][:2] == ("weights", METRIC_VERSION) and job[0][3] == "cpu"
    assert sorted(everything) == sorted((c.sha256, c.rows) for c in rep.checkpoints)

    # The store holds exactly what the Parquet holds, and `analyze ID` reads it back as cached.
    direct = jobs.analyze(store, ids[1], device="cpu")[0]
    assert direct.cached
    with duckdb.connect() as con:
        pq = con.execute("SELECT layer, head, metric, value FROM read_parquet(?, hive_partitioning = false)",
                         [rep.checkpoints[1].files[0]]).df()
    assert len(pq) == len(direct.frame) == rep.checkpoints[1].rows
    a = pq.sort_values(["metric", "layer", "head"]).reset_index(drop=True)
    b = direct.frame.sort_values(["metric", "layer", "head"]).reset_index(drop=True)
    assert (a["metric"] == b["metric"]).all() and (a["value"] - b["value"]).abs().max() == 0.0
    with duckdb.connect() as con:                   # the same checkpoint's job: its ties' notes are its own
        job1 = con.execute("SELECT notes FROM read_parquet(?, hive_partitioning = false)",
                           [str(Path(rep.checkpoints[1].files[0]).with_name("job.parquet"))]).fetchall()
    assert json.loads(job1[0][0]) == direct.notes
    with store.connect() as con:
        files = con.execute("SELECT checkpoint_id, kind, metric_version, location, n_rows "
                            "FROM analysis_result_files ORDER BY checkpoint_id").fetchall()
    assert files == [(c.id, "weights", METRIC_VERSION, c.files[0], c.rows) for c in rep.checkpoints]


def test_same_values_as_the_single_checkpoint_job(tmp_path, ckpts):
    """A batch computes exactly what `analyze PATH` (app.jobs.analyze) computes."""
    single = Store(tmp_path / "single.duckdb")
    cid = jobs.resolve(single, str(ckpts[0]))
    (res,) = jobs.analyze(single, cid, device="cpu")
    store = Store(tmp_path / "batch.duckdb")
    rep = batch.run_batch(store, _ids(store, ckpts[:1]), results=tmp_path / "r", device="cpu")
    q = "SELECT layer, head, metric, value FROM analysis_results ORDER BY metric, layer, head NULLS FIRST"
    with single.connect() as c1, store.connect() as c2:
        assert c1.execute(q).fetchall() == c2.execute(q).fetchall()
        # the same job rows too: notes, device and the ties read from the tensors (a later
        # `analyze ID` finds the batch's job current and computes nothing)
        jq = "SELECT kind, metric_version, device, notes, sample, tied FROM analysis_jobs ORDER BY kind"
        single_jobs, batch_jobs = c1.execute(jq).fetchall(), c2.execute(jq).fetchall()
        assert single_jobs == batch_jobs
        assert json.loads(batch_jobs[0][5])["variant"] == "qkv"
    assert rep.checkpoints[0].rows == len(res.frame)
    (again,) = jobs.analyze(store, rep.checkpoints[0].id, device="cpu")
    assert again.cached and again.tied == res.tied


def test_rerun_skips_existing_results_and_force_recomputes(tmp_path, ckpts):
    store = Store(tmp_path / "b.duckdb")
    ids = _ids(store, ckpts)
    batch.run_batch(store, ids, results=tmp_path / "r", device="cpu")
    counting = Counting()
    again = batch.run_batch(store, ids, results=tmp_path / "r", device="cpu", task_fn=counting)
    assert counting.calls == [] and [c.status for c in again.checkpoints] == ["skipped"] * 3
    assert all(c.rows > 0 and c.attempts == [] for c in again.checkpoints)
    # a fresh database over the same results: skipped, but registered from the Parquet
    other = Store(tmp_path / "other.duckdb")
    other_ids = _ids(other, ckpts)
    rep = batch.run_batch(other, other_ids, results=tmp_path / "r", device="cpu", task_fn=counting)
    assert counting.calls == [] and [c.rows for c in rep.checkpoints] == [c.rows for c in again.checkpoints]
    q = "SELECT count(*), count(DISTINCT checkpoint_id) FROM analysis_results"
    with store.connect() as c1, other.connect() as c2:
        assert c1.execute(q).fetchone() == c2.execute(q).fetchone() == (sum(c.rows for c in rep.checkpoints), 3)
    forced = batch.run_batch(store, ids[:1], results=tmp_path / "r", device="cpu", task_fn=counting, force=True)
    assert forced.checkpoints[0].status == "computed" and len(counting.calls) == 1


def test_new_metric_version_recomputes(tmp_path, ckpts, monkeypatch):
    store = Store(tmp_path / "b.duckdb")
    ids = _ids(store, ckpts[:1])
    batch.run_batch(store, ids, results=tmp_path / "r", device="cpu")
    monkeypatch.setattr(batch, "METRIC_VERSION", METRIC_VERSION + 1)
    counting = Counting()
    rep = batch.run_batch(store, ids, results=tmp_path / "r", device="cpu", task_fn=counting)
    assert len(counting.calls) == 1 and rep.metric_version == METRIC_VERSION + 1
    assert f"metric_version={METRIC_VERSION + 1}" in rep.checkpoints[0].files[0]


def test_activations_added_to_existing_weights(tmp_path, ckpts):
    store = Store(tmp_path / "b.duckdb")
    ids = _ids(store, ckpts[:1])
    batch.run_batch(store, ids, results=tmp_path / "r", device="cpu")
    counting = Counting()
    calls = []
    counting_specs = lambda spec, log: (calls.append(spec.kinds), counting(spec, log))[1]
    rep = batch.run_batch(store, ids, results=tmp_path / "r", device="cpu", activations=True,
                          task_fn=counting_specs)
    assert calls == [("activations",)]                      # weights were already there
    c = rep.checkpoints[0]
    assert c.status == "computed" and c.kinds == ["weights", "activations"] and len(c.files) == 2
    with store.connect() as con:
        kinds = con.execute("SELECT kind FROM analysis_jobs ORDER BY kind").fetchall()
        metrics = {r[0] for r in con.execute("SELECT DISTINCT metric FROM analysis_results").fetchall()}
    assert kinds == [("activations",), ("weights",)]
    assert set(names("activations")) <= metrics


def test_retry_then_success_is_reported(tmp_path, ckpts):
    store = Store(tmp_path / "b.duckdb")
    ids = _ids(store, ckpts)
    flaky = _sha(store, ids[1])
    rep = batch.run_batch(store, ids, results=tmp_path / "r", device="cpu", task_fn=Counting({flaky: 1}))
    c = rep.checkpoints[1]
    assert c.status == "computed" and c.rows > 0
    assert [a["outcome"] for a in c.attempts] == [
        "RuntimeError: flaky disk under run_k_eq_v (retried if attempts remain)", "computed"]


def test_retries_exhausted_fail_that_checkpoint_only(tmp_path, ckpts):
    store = Store(tmp_path / "b.duckdb")
    ids = _ids(store, ckpts)
    bad = _sha(store, ids[0])
    rep = batch.run_batch(store, ids, results=tmp_path / "r", device="cpu", retries=1,
                          task_fn=Counting({bad: 5}))
    assert [c.status for c in rep.checkpoints] == ["failed", "computed", "computed"]
    assert rep.checkpoints[0].error == "RuntimeError: flaky disk under run_qkv"
    assert len(rep.checkpoints[0].attempts) == 2 and rep.checkpoints[0].files == []
    with store.connect() as con:
        stored = {r[0] for r in con.execute("SELECT DISTINCT checkpoint_id FROM analysis_results").fetchall()}
    assert stored == set(ids[1:])
    assert rep.to_dict()["failed"] == 1


def test_missing_checkpoint_file_fails_without_retry(tmp_path, ckpts):
    store = Store(tmp_path / "b.duckdb")
    ids = _ids(store, ckpts)
    ckpts[2].unlink()
    rep = batch.run_batch(store, ids, results=tmp_path / "r", device="cpu", retries=3)
    c = rep.checkpoints[2]
    host = c.attempts[0]["host"]
    why = (f"{ckpts[2]}: checkpoint {ids[2]} is not readable on host {host} "
           "(workers must reach the checkpoints at their stored paths)")
    assert c.status == "failed" and c.error == why
    assert [a["outcome"] for a in c.attempts] == [f"failed: {why}"]


def test_registration_rejects_results_of_another_checkpoint(tmp_path, ckpts):
    store = Store(tmp_path / "b.duckdb")
    ids = _ids(store, ckpts[:2])
    rep = batch.run_batch(store, ids, results=tmp_path / "r", device="cpu")
    a, b = rep.checkpoints
    src = Path(b.files[0]).parent
    dst = Path(a.files[0]).parent
    for name in ("job.parquet", "part.parquet"):              # someone copied b's files over a's
        (dst / name).write_bytes((src / name).read_bytes())
    loc = batch.ResultsLocation(tmp_path / "r")
    with pytest.raises(batch.BatchError) as exc:
        batch.register(store, a.id, a.sha256, "weights", loc)
    why = (f"{dst / 'job.parquet'}: expected one row for checkpoint sha256 {a.sha256} at "
           f"metric version {METRIC_VERSION}, found [('{b.sha256}', {METRIC_VERSION})]")
    assert str(exc.value) == why
    # in a batch (a fresh database over the same results) that checkpoint fails, the other registers
    fresh = Store(tmp_path / "fresh.duckdb")
    again = batch.run_batch(fresh, _ids(fresh, ckpts[:2]), results=tmp_path / "r", device="cpu")
    assert [(c.status, c.error) for c in again.checkpoints] == [("failed", why), ("skipped", None)]
    with fresh.connect() as con:
        assert con.execute("SELECT DISTINCT checkpoint_id FROM analysis_results").fetchall() == [(b.id,)]


def test_results_location_urls():
    loc = batch.ResultsLocation("s3://bucket/qkvscope/")
    assert loc.remote and loc.root == "s3://bucket/qkvscope"
    assert loc.part("ab12", "weights") == (f"s3://bucket/qkvscope/checkpoint=ab12/metric_version={METRIC_VERSION}"
                                           "/kind=weights/part.parquet")
    local = batch.ResultsLocation("rel/dir")
    assert not local.remote and local.root == str(Path("rel/dir").resolve())


def test_cli_glob_then_all(tmp_path, ckpts, capsys):
    db = tmp_path / "c.duckdb"
    pattern = str(tmp_path / "ckpts" / "**" / "*.safetensors")
    assert main(["analyze", pattern, "--db", str(db), "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"results", "metric_version", "executor", "computed", "skipped", "failed", "errors",
                        "checkpoints"}
    assert out["results"] == str(tmp_path / "c.results")
    assert (out["computed"], out["skipped"], out["failed"], out["executor"]) == (3, 0, 0, "in-process")
    assert [c["path"] for c in out["checkpoints"]] == [str(p) for p in sorted(ckpts)]
    assert set(out["checkpoints"][0]) == {"id", "path", "sha256", "status", "kinds", "rows", "files",
                                          "attempts", "error", "groups"}
    assert out["checkpoints"][0]["groups"] == []                      # tiny: one task per checkpoint
    assert set(out["checkpoints"][0]["attempts"][0]) == {"attempt", "host", "pid", "outcome", "task"}
    assert main(["analyze", "--all", "--db", str(db), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert (again["computed"], again["skipped"]) == (0, 3)
    assert main(["analyze", "--all", "--db", str(db)]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == f"0 computed, 3 skipped, 0 failed (in-process); results in {tmp_path / 'c.results'}"


def test_cli_input_errors_and_no_match(tmp_path, ckpts, capsys):
    db = tmp_path / "c.duckdb"
    (tmp_path / "ckpts" / "run_qkv" / "notes.safetensors").write_bytes(b"not a safetensors file")
    pattern = str(tmp_path / "ckpts" / "run_qkv" / "*.safetensors")
    assert main(["analyze", pattern, "--db", str(db), "--device", "cpu", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["computed"] == 1 and [e["target"] for e in out["errors"]] == [
        str(tmp_path / "ckpts" / "run_qkv" / "notes.safetensors")]
    nothing = str(tmp_path / "elsewhere" / "*.pt")
    assert main(["analyze", nothing, "--db", str(db)]) == 2
    assert capsys.readouterr().err == f"error: {nothing}: no file or folder matches this pattern\n"


def test_cli_explicit_targets_keep_the_single_checkpoint_json(tmp_path, ckpts, capsys):
    db = tmp_path / "c.duckdb"
    assert main(["analyze", str(ckpts[0]), "--db", str(db), "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"checkpoint", "metrics", "notes", "cached", "tied"} and out["cached"] is False
    assert not (tmp_path / "c.results").exists()


def test_cli_ray_without_ray_installed_is_one_line(tmp_path, ckpts, capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    db = tmp_path / "c.duckdb"
    assert main(["analyze", str(ckpts[0]), "--db", str(db), "--ray", "auto"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --ray auto: the ray package is not installed (pip install -r requirements-scale.txt)\n"


# -- layer groups (very large checkpoints, forced here with a tiny --max-task-bytes) ----------------
N_DEEP = 5


def make_deep(root: Path, seed: int = 7) -> Path:
    """One of qkvscope's own models, 5 layers, kv head 0's W_K zero in every layer: its K/V
    and Q/K metrics are undefined there, so the notes name heads of every layer (more than 8).
    ``seed`` draws the other weights (another seed: another checkpoint of the same shape)."""
    from experiments.model import GPT, GPTConfig
    from experiments.train import TrainConfig, save_checkpoint

    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=N_DEEP, n_head=4, n_kv_heads=2, d_model=32, variant="qkv")).eval()
    d_head = 32 // 4
    with torch.no_grad():
        for block in model.blocks:
            block.attn.k.weight[:d_head].zero_()             # nn.Linear [out, in]: kv head 0's rows
    path = root / "run_deep" / "final_step_000010.safetensors"
    path.parent.mkdir(parents=True)
    save_checkpoint(model, path, step=10, tokens=100, final=True, tc=TrainConfig())
    return path


@pytest.fixture
def deep(tmp_path) -> Path:
    return make_deep(tmp_path / "deep")


class Flaky:
    """``run_task`` that records each task (by its key) and raises on chosen first attempts."""

    def __init__(self, fail: dict[str, int] | None = None):
        self.calls: list[str] = []
        self.specs: list[batch.TaskSpec] = []
        self.fail = fail or {}          # task key -> how many first attempts raise

    def __call__(self, spec, log):
        self.calls.append(spec.key)
        self.specs.append(spec)
        if self.calls.count(spec.key) <= self.fail.get(spec.key, 0):
            raise RuntimeError(f"flaky disk under {spec.label}")
        return batch.run_task(spec, log)


RESULT_ROWS = ("SELECT c.sha256, r.layer, r.head, r.metric, r.value, r.layer2 FROM analysis_results r "
               "JOIN checkpoints c ON c.id = r.checkpoint_id ORDER BY 1, 4, 2, 3 NULLS FIRST, 6 NULLS FIRST")
#: The pairs of layers (analysis.cross_layer) need every layer in one task: a checkpoint split into
#: layer groups has none, and a note instead (compared apart from the other rows below).
PAIRS = {m.name for m in registry.METRICS if m.axis == "layer_pair"}
SPLIT_NOTE = "computed over all of the model's layers together, not over a range of layers"
JOB_ROWS = ("SELECT c.sha256, j.kind, j.metric_version, j.device, j.notes, j.sample, j.tied FROM analysis_jobs j "
            "JOIN checkpoints c ON c.id = j.checkpoint_id ORDER BY 1, 2")


def _stored_results(store: Store) -> tuple[list, list]:
    """The stored rows and jobs but for the pairs of layers and their notes (``PAIRS``)."""
    with store.connect() as con:
        rows, jobs_ = con.execute(RESULT_ROWS).fetchall(), con.execute(JOB_ROWS).fetchall()
    rows = [r for r in rows if r[3] not in PAIRS]
    jobs_ = [(*j[:4], json.dumps({m: why for m, why in json.loads(j[4]).items() if m not in PAIRS})
              if j[4] else j[4], *j[5:]) for j in jobs_]
    return rows, jobs_


def _pair_notes(store: Store) -> dict[str, str]:
    with store.connect() as con:
        notes = json.loads(con.execute("SELECT notes FROM analysis_jobs WHERE kind = 'weights'").fetchone()[0])
    return {m: why for m, why in notes.items() if m in PAIRS}


def _layer_bytes(store: Store, cid: int) -> int:
    with store.connect() as con:
        row = con.execute(f"SELECT {', '.join(STORED_COLUMNS)} FROM checkpoints WHERE id = ?", [cid]).fetchone()
    return batch.attention_bytes(dict(zip(STORED_COLUMNS, row))) // N_DEEP


@pytest.mark.parametrize("n_layers, total, limit, groups", [
    (5, 500, None, [(0, 5)]),                               # never split
    (5, 500, 500, [(0, 5)]),                                # fits exactly
    (5, 500, 1, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]),  # a layer is the smallest task
    (5, 500, 200, [(0, 2), (2, 4), (4, 5)]),                # 2 layers a task at most
    (10, 1000, 400, [(0, 4), (4, 7), (7, 10)]),             # as even as possible: 4, 3, 3
    (1, 10**12, 1, [(0, 1)]),                               # one layer cannot be split
])
def test_layer_groups(n_layers, total, limit, groups):
    assert batch.layer_groups(n_layers, total, limit) == groups


@pytest.mark.parametrize("text, size", [
    ("4GB", 4 * 10**9), ("512MiB", 512 * 2**20), ("1.5 kb", 1500), ("123", 123), ("2gib", 2 * 2**30),
    ("none", None), ("NONE", None),
])
def test_parse_size(text, size):
    assert batch.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "0", "4 parsecs", "-1GB", "0.1"])
def test_parse_size_rejects(text):
    with pytest.raises(batch.BatchError) as exc:
        batch.parse_size(text)
    assert str(exc.value) == ("--max-task-bytes: expected a size of at least 1 byte such as 4GB, 512MiB or "
                              f"1000000, or 'none', found {text!r}")


def test_layer_group_tasks_compute_weights_only():
    with pytest.raises(ValueError, match="activation metrics need the whole model"):
        batch.TaskSpec(1, "ab", "p", ("weights", "activations"), "r", layers=(0, 2))
    spec = batch.TaskSpec(1, "ab", "p", ("weights",), "r", layers=(2, 4))
    assert (spec.key, spec.label) == ("ab-L0002-0003", "layers 2-3")
    assert batch.ResultsLocation("s3://b/q").part("ab", "weights", (2, 4)).endswith(
        "/kind=weights/part-L0002-0003.parquet")


def test_split_rows_and_notes_identical_to_one_task(tmp_path, deep):
    whole = Store(tmp_path / "whole.duckdb")
    (cid,) = _ids(whole, [deep])
    one = batch.run_batch(whole, [cid], results=tmp_path / "whole", device="cpu")
    assert one.checkpoints[0].groups == [] and one.checkpoints[0].status == "computed"
    reference = _stored_results(whole)
    notes = json.loads(reference[1][0][4])
    with whole.connect() as con:                                    # one task: the pairs of its 5 layers
        assert con.execute("SELECT count(*) FROM analysis_results WHERE metric = 'xlayer_cka_wk'").fetchone() == (10,)
    undefined = [m for m, why in notes.items() if why.startswith("undefined")]
    assert undefined and any(notes[m].endswith(" ...") for m in undefined)   # labels from several layers
    layer_bytes = _layer_bytes(whole, cid)

    for limit, groups in ((1, [[0, 0], [1, 1], [2, 2], [3, 3], [4, 4]]),
                          (2 * layer_bytes, [[0, 1], [2, 3], [4, 4]])):
        store = Store(tmp_path / f"split{limit}.duckdb")
        results = tmp_path / f"split{limit}"
        flaky = Flaky()
        rep = batch.run_batch(store, _ids(store, [deep]), results=results, device="cpu",
                              max_task_bytes=limit, task_fn=flaky)
        c = rep.checkpoints[0]
        assert c.status == "computed" and c.error is None
        assert [g["layers"] for g in c.groups] == groups and {g["status"] for g in c.groups} == {"computed"}
        assert [s.layers for s in flaky.specs] == [(a, b + 1) for a, b in groups]
        assert [a["task"] for a in c.attempts] == [f"layers {a}-{b}" for a, b in groups]
        assert _stored_results(store) == reference                   # the same rows and notes, bit for bit
        assert _pair_notes(store) == {m: SPLIT_NOTE for m in PAIRS if registry.BY_NAME[m].level == "weights"}
        folder = results / f"checkpoint={c.sha256}" / f"metric_version={METRIC_VERSION}" / "kind=weights"
        tags = [f"-L{a:04d}-{b:04d}" for a, b in groups]
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            ["job.parquet"] + [f"part{t}.parquet" for t in tags] + [f"job{t}.parquet" for t in tags])
        assert [g["file"] for g in c.groups] == [str(folder / f"part{t}.parquet") for t in tags]
        assert c.files == [str(folder / "part-L*.parquet")] and c.rows == len(reference[0])
        with duckdb.connect() as con:
            parts = con.execute("SELECT parts FROM read_parquet(?)", [str(folder / "job.parquet")]).fetchone()[0]
        assert json.loads(parts) == [f"part{t}.parquet" for t in tags]
        with store.connect() as con:
            assert con.execute("SELECT location, job_location, n_rows FROM analysis_result_files").fetchall() == [
                (str(folder / "part-L*.parquet"), str(folder / "job.parquet"), c.rows)]
        # the single-checkpoint command reads the registered result back
        (cached,) = jobs.analyze(store, c.id, device="cpu")
        assert cached.cached and {m: w for m, w in cached.notes.items() if m not in PAIRS} == notes

        again = Flaky()                                             # complete: skipped, nothing recomputed
        rerun = batch.run_batch(store, [c.id], results=results, device="cpu", max_task_bytes=limit, task_fn=again)
        assert again.calls == [] and rerun.checkpoints[0].status == "skipped"
        assert rerun.checkpoints[0].rows == c.rows and rerun.checkpoints[0].files == c.files


def test_failed_group_is_retried_once_and_reported(tmp_path, deep, ckpts):
    store = Store(tmp_path / "b.duckdb")
    ids = _ids(store, [deep, *ckpts[:1]])
    sha = _sha(store, ids[0])
    flaky = Flaky({f"{sha}-L0002-0003": 1})
    rep = batch.run_batch(store, ids, results=tmp_path / "r", device="cpu", task_fn=flaky,
                          max_task_bytes=2 * _layer_bytes(store, ids[0]))
    c = rep.checkpoints[0]
    assert [x.status for x in rep.checkpoints] == ["computed", "computed"] and c.error is None
    assert [(g["layers"], g["status"], [a["outcome"] for a in g["attempts"]]) for g in c.groups] == [
        ([0, 1], "computed", ["computed"]),
        ([2, 3], "computed", ["RuntimeError: flaky disk under layers 2-3 (retried if attempts remain)", "computed"]),
        ([4, 4], "computed", ["computed"]),
    ]
    assert len(c.attempts) == 4 and rep.checkpoints[1].groups == []   # the small one stays one task
    whole = Store(tmp_path / "whole.duckdb")
    batch.run_batch(whole, _ids(whole, [deep, *ckpts[:1]]), results=tmp_path / "w", device="cpu")
    assert _stored_results(store) == _stored_results(whole)


def test_failed_group_leaves_nothing_registered_and_rerun_redoes_only_it(tmp_path, deep, ckpts, capsys):
    store = Store(tmp_path / "b.duckdb")
    ids = _ids(store, [deep, *ckpts[:1]])
    sha = _sha(store, ids[0])
    bad = f"{sha}-L0002-0003"
    limit = 2 * _layer_bytes(store, ids[0])
    results = tmp_path / "r"
    notes = []
    rep = batch.run_batch(store, ids, results=results, device="cpu", task_fn=Flaky({bad: 9}), retries=1,
                          max_task_bytes=limit, notify=lambda r, done, total: notes.append((r.id, r.status)))
    c = rep.checkpoints[0]
    assert [x.status for x in rep.checkpoints] == ["failed", "computed"] and rep.to_dict()["failed"] == 1
    assert c.error == "layers 2-3: RuntimeError: flaky disk under layers 2-3"
    assert [(g["layers"], g["status"], len(g["attempts"])) for g in c.groups] == [
        ([0, 1], "computed", 1), ([2, 3], "failed", 2), ([4, 4], "computed", 1)]
    assert c.rows == 0 and c.files == [] and sorted(notes) == sorted([(ids[0], "failed"), (ids[1], "computed")])
    with store.connect() as con:
        for table in ("analysis_results", "analysis_jobs", "analysis_result_files"):
            assert con.execute(f"SELECT count(*) FROM {table} WHERE checkpoint_id = ?", [ids[0]]).fetchone()[0] == 0
    folder = results / f"checkpoint={sha}" / f"metric_version={METRIC_VERSION}" / "kind=weights"
    assert sorted(p.name for p in folder.iterdir()) == [
        "job-L0000-0001.parquet", "job-L0004-0004.parquet", "part-L0000-0001.parquet", "part-L0004-0004.parquet"]

    # the summary names the checkpoint, the failed layer range and its retries
    from app.commands.analyze import _print_batch

    _print_batch(rep.to_dict())
    text = capsys.readouterr().out.splitlines()
    assert text[1].split()[:3] == [str(ids[0]), "failed", "0"] and text[1].endswith("in 3 layer groups after 1 retry")
    assert text[2:4] == ["        layers 2-3: failed after 1 retry",
                         "        layers 2-3: RuntimeError: flaky disk under layers 2-3"]

    # still failing: still nothing registered, and the partial set is not taken as done
    rep = batch.run_batch(store, ids[:1], results=results, device="cpu", task_fn=Flaky({bad: 9}), retries=0,
                          max_task_bytes=limit)
    assert rep.checkpoints[0].status == "failed" and not (folder / "job.parquet").exists()
    # a re-run computes only the missing group, joins the three and registers them
    fixed = Flaky()
    rep = batch.run_batch(store, ids, results=results, device="cpu", task_fn=fixed, max_task_bytes=limit)
    c = rep.checkpoints[0]
    assert fixed.calls == [bad] and [x.status for x in rep.checkpoints] == ["computed", "skipped"]
    assert [g["status"] for g in c.groups] == ["skipped", "computed", "skipped"]
    whole = Store(tmp_path / "whole.duckdb")
    batch.run_batch(whole, _ids(whole, [deep, *ckpts[:1]]), results=tmp_path / "w", device="cpu")
    assert _stored_results(store) == _stored_results(whole)


def test_activations_stay_one_task_per_checkpoint(tmp_path, deep):
    store = Store(tmp_path / "b.duckdb")
    flaky = Flaky()
    rep = batch.run_batch(store, _ids(store, [deep]), results=tmp_path / "r", device="cpu", activations=True,
                          max_task_bytes=1, task_fn=flaky)
    assert [(s.kinds, s.layers) for s in flaky.specs] == [(("weights",), (i, i + 1)) for i in range(N_DEEP)] + [
        (("activations",), None)]
    c = rep.checkpoints[0]
    assert c.status == "computed" and c.kinds == ["weights", "activations"]
    assert c.files[1].endswith("kind=activations/part.parquet")
    assert [a["task"] for a in c.attempts][-1] == "whole checkpoint"
    whole = Store(tmp_path / "whole.duckdb")
    batch.run_batch(whole, _ids(whole, [deep]), results=tmp_path / "w", device="cpu", activations=True)
    assert _stored_results(store) == _stored_results(whole)
    with store.connect() as con:
        assert con.execute("SELECT count(*) FROM analysis_results WHERE metric = 'kv_cka_act'").fetchone()[0] > 0


def test_changing_the_split_replaces_the_parts(tmp_path, deep):
    """--force with other groups (or none) leaves only the files of the new split, so
    `**/part*.parquet` reads every row once; the old checkpoint marker goes first."""
    store = Store(tmp_path / "b.duckdb")
    (cid,) = _ids(store, [deep])
    results = tmp_path / "r"
    reference = None
    for limit in (1, None, 2 * _layer_bytes(store, cid), 1):
        rep = batch.run_batch(store, [cid], results=results, device="cpu", max_task_bytes=limit, force=True)
        assert rep.checkpoints[0].status == "computed"
        with duckdb.connect() as con:
            parts = [str(results / "**" / "part*.parquet")]
            # the pairs of layers exist only where the checkpoint is one task (PAIRS)
            everything = _sorted_rows(con.execute(
                "SELECT layer, head, metric, value FROM read_parquet(?, hive_partitioning = true) "
                "WHERE layer2 IS NULL", parts).fetchall())
            pairs = con.execute("SELECT count(*) FROM read_parquet(?, hive_partitioning = true) "
                                "WHERE layer2 IS NOT NULL", parts).fetchone()[0]
        assert pairs == (0 if limit else 2 * 10)                       # 5 layers: 10 pairs of W_K, of W_V
        reference = reference or everything
        assert everything == reference and len(everything) + pairs == rep.checkpoints[0].rows
        assert _stored_results(store)[0] == [(rep.checkpoints[0].sha256, *r, None) for r in reference]


def _sorted_rows(rows):
    """Rows as RESULT_ROWS orders them (metric, layer, head), with undefined values as None
    (as registration stores them; NaN never equals itself)."""
    import math

    out = [(layer, head, metric, None if value is None or not math.isfinite(value) else value)
           for layer, head, metric, value in rows]
    return sorted(out, key=lambda r: (r[2], r[0], -1 if r[1] is None else r[1]))


def test_cli_max_task_bytes(tmp_path, deep, capsys):
    from app.cli import build_parser

    assert build_parser().parse_args(["analyze", "--all"]).max_task_bytes == batch.DEFAULT_MAX_TASK_BYTES
    db = tmp_path / "c.duckdb"
    assert main(["analyze", str(deep), "--db", str(db), "--device", "cpu", "--json", "--all",
                 "--max-task-bytes", "1B"]) == 0
    out = json.loads(capsys.readouterr().out)
    (c,) = out["checkpoints"]
    assert c["status"] == "computed" and [g["layers"] for g in c["groups"]] == [[i, i] for i in range(N_DEEP)]
    assert set(c["groups"][0]) == {"layers", "status", "file", "attempts", "error"}
    with pytest.raises(SystemExit) as exc:
        main(["analyze", "--all", "--db", str(db), "--max-task-bytes", "lots"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "argument --max-task-bytes: expected a size of at least 1 byte such as 4GB, 512MiB or 1000000, "
        "or 'none', found 'lots'")


@pytest.mark.slow
def test_a_bomb_among_good_checkpoints_fails_alone_under_the_analysis_limits(tmp_path, ckpts, monkeypatch,
                                                                              capsys):
    """Issue 14: a batch task reads its checkpoint in a child under QKVSCOPE_PARSE_MEMORY_MB, as a
    single ``analyze`` does (before: in the batch's own process, no limit). A stored GPT-2 folder
    replaced after ingest by an 11 GB sparse one (its own sparse check off: only the net is left):
    one failure line, no retry, the good checkpoints analysed, this process's memory unchanged."""
    import resource
    import shutil

    from safetensors.torch import save_file

    from tests.hostile.test_bombs import gpt2_state
    from tests.hostile.test_sandbox import _sparse_gpt2

    db = tmp_path / "b.duckdb"
    store = Store(db)
    folder = tmp_path / "gpt2"                  # a 1-layer GPT-2 folder of d_model 8, as the bomb's below
    folder.mkdir()
    save_file(gpt2_state(), folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 8,
                                                    "vocab_size": 16, "n_positions": 8}))
    # the budgets first: the pooled child that ingests them is the one the batch analyses in
    monkeypatch.setenv("QKVSCOPE_ALLOW_SPARSE", "1")
    monkeypatch.setenv("QKVSCOPE_PARSE_MEMORY_MB", "1024")
    ids = _ids(store, [ckpts[0], folder, ckpts[1]])
    shutil.rmtree(folder)
    bomb = _sparse_gpt2(folder)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    assert main(["analyze", "--all", "--db", str(db), "--device", "cpu", "--retries", "2"]) == 1
    out = capsys.readouterr().out
    grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10) - before
    assert out.splitlines()[0].startswith("2 computed, 0 skipped, 1 failed (in-process)"), out
    why = (f"{bomb}: safetensors tensor 'h.0.attn.c_attn.weight' needs 2,831,155,200 bytes, more memory "
           "than this process may use")
    assert [ln.strip() for ln in out.splitlines() if "needs" in ln] == [why], out
    assert "retr" not in out                                              # the file decides: never retried
    with store.connect() as con:
        done = con.execute("SELECT DISTINCT checkpoint_id FROM analysis_results ORDER BY 1").fetchall()
    assert done == [(ids[0],), (ids[2],)]
    assert grew < 512 << 20, grew
