"""Experiment trackers' stores: W&B run folders, MLflow (file store and
SQLite), trackio, Aim, and dot-folders, on files other people wrote
(``trackers/SOURCES.md``) or fixtures reproducing their exact layout."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from loaders.errors import LogFormatError
from loaders.ingest import ingest_paths
from loaders.logs import ingest_log
from loaders.logs.registry import detect_log, reader_for

from .helpers import points

TRACKERS = Path(__file__).parent / "trackers"
CS336 = TRACKERS / "cs336_wandb" / "wandb"
RESUMED = CS336 / "run-20260118_175801-a5sov16l"       # steps 4000-4070
LONG = CS336 / "run-20260118_160458-4s1rf4ay"          # steps 0-1000, 4 blocks of 32 KiB
EMPTY = CS336 / "run-20260118_160117-qnw4jb71"         # run-qnw4jb71.wandb of 0 bytes


def _run(store, name_or_id):
    with store.connect() as con:
        cols = ["id", "name", "format", "lr", "weight_decay", "seed", "model_size", "config"]
        row = con.execute(f"SELECT {', '.join(cols)} FROM runs WHERE id = ?", [name_or_id]).fetchone()
    out = dict(zip(cols, row))
    out["config"] = json.loads(out["config"])
    return out


def _metric_counts(store, run_id):
    with store.connect() as con:
        return dict(con.execute("SELECT metric, count(*) FROM points WHERE run_id = ? GROUP BY metric",
                                [run_id]).fetchall())


# --- W&B --------------------------------------------------------------------------------------


def test_wandb_folder_of_three_runs(store):
    report = ingest_paths(store, [CS336])
    got = {Path(f.path).parent.name: f for f in report.files}
    assert sorted(got) == [EMPTY.name, LONG.name, RESUMED.name]        # nothing else in the folders
    assert [got[n].status for n in (EMPTY.name, LONG.name, RESUMED.name)] == ["error", "added", "added"]
    assert got[EMPTY.name].reason == (
        f"{EMPTY / 'run-qnw4jb71.wandb'}: expected a W&B log starting with 3a 57 26 42 e1 be 00 (':W&B', "
        f"magic 0xBEE1, version 0), found an empty file (0 bytes)")
    long, resumed = got[LONG.name].run_ids[0], got[RESUMED.name].run_ids[0]
    # By hand: the run logs train/loss, lr, grad_norm, weight_norm every 10 steps from 0 to 1000
    # (101 points each) and val/loss, val/perplexity at 0, 250, 500, 750, 1000.
    assert _metric_counts(store, long) == {"train/loss": 101, "lr": 101, "grad_norm": 101, "weight_norm": 101,
                                           "val/loss": 5, "val/perplexity": 5}
    assert [s for s, _ in points(store, long, "val/loss")] == [0, 250, 500, 750, 1000]
    assert _metric_counts(store, resumed) == {"train/loss": 8, "lr": 8, "grad_norm": 8, "weight_norm": 8,
                                              "val/loss": 1, "val/perplexity": 1}
    # The history's last values are the summary's (wandb-summary.json, which is no run of its own).
    summary = json.loads((RESUMED / "files" / "wandb-summary.json").read_text())
    for metric in ("train/loss", "lr"):
        assert points(store, resumed, metric)[-1] == (summary["_step"], pytest.approx(summary[metric]))
    assert points(store, resumed, "val/loss") == [(4000, pytest.approx(summary["val/loss"]))]
    run = _run(store, resumed)
    assert run["name"] == "small-model" and run["format"] == "wandb_offline"
    # lr is the config's max_lr, not the summary's decayed 5.2e-05.
    assert run["lr"] == 0.0005 and summary["lr"] == pytest.approx(5.2277009105996896e-05)
    assert run["config"]["project"] == "Transformer-from-scratch"
    assert run["config"]["wandb_config"] == {"max_lr": 0.0005, "batch_size": 32, "optimizer": "adamw",
                                             "model parameters in Million": 22.7, "steps": 5000}
    again = ingest_paths(store, [CS336])
    assert sorted(f.status for f in again.files) == ["error", "unchanged", "unchanged"]


def test_wandb_run_folder_or_its_file_is_one_run(store):
    assert detect_log(RESUMED) == "wandb_offline"
    assert reader_for(RESUMED, None)[1] == RESUMED / "run-a5sov16l.wandb"
    [rep] = ingest_log(store, RESUMED)
    assert rep.n_points == 34
    [rep2] = ingest_log(store, RESUMED / "run-a5sov16l.wandb")
    assert rep2.status == "unchanged" and rep2.run_ids == rep.run_ids


def test_wandb_config_change_reads_the_run_again(store, tmp_path):
    run = shutil.copytree(RESUMED, tmp_path / "wandb" / RESUMED.name)
    [first] = ingest_log(store, run)
    cfg = run / "files" / "config.yaml"
    cfg.write_text(cfg.read_text().replace("value: 0.0005", "value: 0.0003")
                   + "seed:\n    value: 42\nweight_decay:\n    desc: null\n    value: 0.1\n")
    [second] = ingest_log(store, run)
    assert second.status == "added" and second.run_ids == first.run_ids
    got = _run(store, first.run_ids[0])
    assert (got["lr"], got["weight_decay"], got["seed"]) == (0.0003, 0.1, 42)


def _copy_wandb(tmp_path, data: bytes) -> Path:
    run = tmp_path / "wandb" / RESUMED.name
    shutil.copytree(RESUMED, run)
    (run / "run-a5sov16l.wandb").write_bytes(data)
    return run


def test_wandb_file_cut_inside_a_record_keeps_the_records_before_it(store, tmp_path):
    """A run killed (or still being written) ends inside a record, as the offline runs committed in
    github.com/7vik/nn-modularity do (wandb/offline-run-*/, 7 bytes of a record header at the end):
    the whole records are read, the rest is counted on the report line."""
    [whole] = ingest_log(store, RESUMED)
    data = (RESUMED / "run-a5sov16l.wandb").read_bytes()
    run = _copy_wandb(tmp_path, data[:10_000])     # inside the record that starts at byte 9,963
    [rep] = ingest_log(store, run)
    assert rep.status == "added"
    assert rep.reason == ("the last 37 bytes (from byte 9,963) not read: the file ends inside a W&B "
                          "record (a run being written, or killed)")
    # The steps logged before the cut (4000-4030 of 4000-4070), with the whole file's values.
    assert points(store, rep.run_ids[0], "train/loss") == points(store, whole.run_ids[0], "train/loss")[:4]
    assert _metric_counts(store, rep.run_ids[0]) == {"train/loss": 4, "lr": 4, "grad_norm": 4, "weight_norm": 4,
                                                     "val/loss": 1, "val/perplexity": 1}
    (run / "run-a5sov16l.wandb").write_bytes(data[:9963 + 7])         # only that record's header
    [rep2] = ingest_log(store, run)
    assert rep2.reason.startswith("the last 7 bytes (from byte 9,963) not read")
    assert _metric_counts(store, rep2.run_ids[0])["train/loss"] == 4


def test_wandb_corrupt_record_is_an_error(store, tmp_path):
    data = bytearray((RESUMED / "run-a5sov16l.wandb").read_bytes())
    data[3000] ^= 0xFF
    run = _copy_wandb(tmp_path, bytes(data))
    with pytest.raises(LogFormatError, match=r"W&B record at byte 2,\d+ fails its crc32 check \(stored "
                                             r"0x[0-9a-f]{8}\): the file is corrupt from there on$"):
        ingest_log(store, run)


# --- MLflow file store ---------------------------------------------------------------------------

# The exact layout of github.com/10-Academy-Batch-4-Week-4/Swahili-Speech-To-Text, commit
# 74e20e9632d263b73b22c847ae20af0e2a75c6da, mlruns/1/ (a Keras run of MLflow 1.x: empty run name,
# metrics/loss only; no licence, so reproduced here, not copied).
SWAHILI_LOSS = """1628697792090 332.6841735839844 0
1628697795789 297.6000061035156 1
1628697799319 270.32366943359375 2
1628697803121 248.3108367919922 3
1628697806972 239.03318786621094 4
1628697810423 238.0267791748047 5
1628697813877 235.6751708984375 6
1628697817574 235.4126739501953 7
1628697823629 235.13304138183594 8
1628697827236 234.7978057861328 9
"""
SWAHILI_RUN = "ed05f9cd599442fe9a0c9222184710b8"


def swahili_mlruns(root: Path) -> Path:
    exp = root / "mlruns" / "1"
    run = exp / SWAHILI_RUN
    (run / "metrics").mkdir(parents=True)
    (run / "tags").mkdir()
    (root / "mlruns" / "0").mkdir()
    (root / "mlruns" / "0" / "meta.yaml").write_text(
        "artifact_location: file:///C:/Users/x/notebooks/mlruns/0\nexperiment_id: '0'\n"
        "lifecycle_stage: active\nname: Default\n")
    (exp / "meta.yaml").write_text(
        "artifact_location: file:///C:/Users/x/notebooks/mlruns/1\nexperiment_id: '1'\n"
        "lifecycle_stage: active\nname: Speech model simple rnn\n")
    (run / "meta.yaml").write_text(
        f"artifact_uri: file:///C:/Users/x/notebooks/mlruns/1/{SWAHILI_RUN}/artifacts\n"
        f"end_time: 1628697851678\nentry_point_name: ''\nexperiment_id: '1'\nlifecycle_stage: active\n"
        f"name: ''\nrun_id: {SWAHILI_RUN}\nrun_uuid: {SWAHILI_RUN}\nsource_name: ''\nsource_type: 4\n"
        f"source_version: ''\nstart_time: 1628697775478\nstatus: 3\ntags: []\nuser_id: x\n")
    (run / "metrics" / "loss").write_text(SWAHILI_LOSS)
    (run / "tags" / "mlflow.source.name").write_text("C:\\Users\\x\\ipykernel_launcher.py")
    (run / "tags" / "mlflow.user").write_text("x")
    (run / "artifacts" / "tensorboard_logs").mkdir(parents=True)
    return root / "mlruns"


# An MLflow 2.x run (meta.yaml fields as in github.com/bertoxious/mlflow, Readme.md; params, tags
# and nested metric keys as mlflow/store/tracking/file_store.py writes them).
def mlflow2_run(root: Path, *, loss_lines: str | None = None) -> Path:
    exp = root / "mlruns" / "606783375233873416"
    run = exp / "1c6b2d5b909041df93e6e00b960de019"
    for d in ("metrics/train", "metrics/val", "params", "tags", "artifacts"):
        (run / d).mkdir(parents=True)
    (exp / "meta.yaml").write_text(
        "artifact_location: file:///home/u/mlruns/606783375233873416\ncreation_time: 1721450900000\n"
        "experiment_id: '606783375233873416'\nlast_update_time: 1721450900000\nlifecycle_stage: active\n"
        "name: qkv-sharing\n")
    (run / "meta.yaml").write_text(
        "artifact_uri: file:///home/u/mlruns/606783375233873416/1c6b2d5b909041df93e6e00b960de019/artifacts\n"
        "end_time: 1721450907230\nentry_point_name: ''\nexperiment_id: '606783375233873416'\n"
        "lifecycle_stage: active\nrun_id: 1c6b2d5b909041df93e6e00b960de019\nrun_name: wistful-ant-659\n"
        "run_uuid: 1c6b2d5b909041df93e6e00b960de019\nsource_name: ''\nsource_type: 4\nsource_version: ''\n"
        "start_time: 1721450907221\nstatus: 3\ntags: []\nuser_id: u\n")
    (run / "tags" / "mlflow.runName").write_text("k_eq_v-wd0.1")
    (run / "params" / "learning_rate").write_text("0.0006")
    (run / "params" / "weight_decay").write_text("0.1")
    (run / "params" / "seed").write_text("1337")
    (run / "params" / "n_layer").write_text("12")
    (run / "metrics" / "train" / "loss").write_text(loss_lines or
        "1721450907300 10.9 0\n1721450907400 7.5 100\n1721450907500 6.1 200\n")
    (run / "metrics" / "val" / "loss").write_text("1721450907450 7.7 100\n1721450907550 6.3 200\n")
    (run / "metrics" / "lr").write_text("1721450907300 0.0 0\n1721450907400 0.0006 100\n"
                                         "1721450907500 0.00006 200\n")
    return run


def test_mlflow_file_store_old_run_without_name(store, tmp_path):
    mlruns = swahili_mlruns(tmp_path)
    report = ingest_paths(store, [mlruns])
    # Experiment 0's meta.yaml is config-like; the run folder is one run, its artifacts not searched.
    runs = [f for f in report.files if f.format == "mlflow_files"]
    assert [f.status for f in runs] == ["added"] and runs[0].n_points == 10
    run = _run(store, runs[0].run_ids[0])
    assert run["name"] == SWAHILI_RUN
    assert run["config"]["project"] == "Speech model simple rnn"
    got = points(store, run["id"], "train/loss")
    assert [s for s, _ in got] == list(range(10))
    assert got[0][1] == 332.6841735839844 and got[-1][1] == 234.7978057861328


def test_mlflow_file_store_run_with_params(store, tmp_path):
    run_dir = mlflow2_run(tmp_path)
    [rep] = ingest_log(store, run_dir)
    assert rep.format == "mlflow_files" and rep.n_points == 8
    run = _run(store, rep.run_ids[0])
    assert run["name"] == "k_eq_v-wd0.1"
    assert (run["lr"], run["weight_decay"], run["seed"]) == (0.0006, 0.1, 1337)
    assert run["config"]["mlflow_params"]["n_layer"] == "12"
    assert run["config"]["project"] == "qkv-sharing"
    assert _metric_counts(store, run["id"]) == {"train/loss": 3, "val/loss": 2, "lr": 3}
    assert points(store, run["id"], "val/loss") == [(100, 7.7), (200, 6.3)]
    with store.connect() as con:
        assert con.execute("SELECT variant FROM runs WHERE id = ?", [run["id"]]).fetchone()[0] == "k_eq_v"
    # The same run by its meta.yaml: the same unit, unchanged.
    [again] = ingest_log(store, run_dir / "meta.yaml")
    assert again.status == "unchanged" and again.run_ids == rep.run_ids


def test_mlflow_two_field_lines_are_step_zero_as_mlflow_reads_them(store, tmp_path):
    run_dir = mlflow2_run(tmp_path, loss_lines="1721450907300 10.9\n")
    [rep] = ingest_log(store, run_dir)
    assert points(store, rep.run_ids[0], "train/loss") == [(0, 10.9)]


@pytest.mark.parametrize("line, found", [
    ("1721450907300 10.9 0 7", "line 2 with 4 fields: '1721450907300 10.9 0 7'"),
    ("10.9", "line 2 with 1 field: '10.9'"),
    ("1721450907300 ten 3", "line 2 with 3 fields: '1721450907300 ten 3'"),
])
def test_mlflow_bad_metric_line_is_an_error(store, tmp_path, line, found):
    run_dir = mlflow2_run(tmp_path, loss_lines=f"1721450907300 10.9 0\n{line}\n")
    with pytest.raises(LogFormatError) as exc:
        ingest_log(store, run_dir)
    assert str(exc.value) == (f"{run_dir / 'metrics' / 'train' / 'loss'}: expected MLflow metric lines "
                              f"'<timestamp ms> <value> <step>', found {found}")
    with store.connect() as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 0


# --- MLflow SQLite store -------------------------------------------------------------------------

def mlflow_db(path: Path) -> Path:
    """An mlflow.db on MLflow's own schema (``trackers/mlflow_latest_schema.sql``) with the rows
    MLflow writes for two runs of one experiment, one run deleted, one of another experiment."""
    import sqlite3

    schema = (TRACKERS / "mlflow_latest_schema.sql").read_text()
    con = sqlite3.connect(path)
    for stmt in schema.split("\n\n\n"):
        if stmt.strip():
            con.execute(stmt)
    con.executemany("INSERT INTO experiments VALUES (?, ?, ?, 'active', 1721450900000, 1721450900000)",
                    [(0, "Default", "mlflow-artifacts:/0"), (1, "qkv-sharing", "mlflow-artifacts:/1")])
    runs = [("aaa1", "bold-owl-1", 1, "active"), ("bbb2", "calm-fox-2", 1, "active"),
            ("ccc3", "dead-run-3", 1, "deleted"), ("ddd4", "calm-fox-2", 0, "active")]
    con.executemany("INSERT INTO runs (run_uuid, name, source_type, source_name, entry_point_name, user_id, "
                    "status, start_time, end_time, source_version, lifecycle_stage, artifact_uri, "
                    "experiment_id) VALUES (?, ?, 'LOCAL', '', '', 'u', 'FINISHED', ?, ?, '', ?, '', ?)",
                    [(r, n, 1000 + i, 2000 + i, stage, e) for i, (r, n, e, stage) in enumerate(runs)])
    con.executemany("INSERT INTO params VALUES (?, ?, ?)",
                    [("lr", "0.0003", "aaa1"), ("weight_decay", "0.03125", "aaa1"), ("seed", "7", "aaa1"),
                     ("variant", "q_eq_k", "aaa1"), ("lr", "0.001", "bbb2")])
    con.executemany("INSERT INTO tags VALUES (?, ?, ?)",
                    [("mlflow.runName", "bold-owl-1", "aaa1"), ("mlflow.user", "u", "aaa1"),
                     ("team", "attn", "aaa1"), ("mlflow.runName", "calm-fox-2", "bbb2")])
    rows = [("train_loss", 4.0, 0, "aaa1"), ("train_loss", 3.0, 10, "aaa1"), ("train_loss", 2.5, 20, "aaa1"),
            ("val_loss", 3.1, 20, "aaa1"), ("train_loss", 5.0, 0, "bbb2"), ("train_loss", 9.0, 0, "ccc3"),
            ("train_loss", 1.0, 0, "ddd4")]
    con.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?, ?, 0)",
                    [(k, v, 1721450907000 + s, r, s) for k, v, s, r in rows])
    con.execute("INSERT INTO metrics VALUES ('val_loss', 0.0, 1721450907099, 'bbb2', 5, 1)")
    con.commit()
    con.close()
    return path


def test_mlflow_sqlite_store(store, tmp_path):
    (tmp_path / "server").mkdir()
    db = mlflow_db(tmp_path / "server" / "mlflow.db")
    before = db.read_bytes()
    report = ingest_paths(store, [db.parent])
    [rep] = report.files
    assert (rep.status, rep.format, rep.n_points) == ("added", "mlflow_sqlite", 7)
    with store.connect() as con:
        got = con.execute("SELECT name, lr, weight_decay, seed, variant, config FROM runs ORDER BY name").fetchall()
    assert [g[:5] for g in got] == [("bold-owl-1", 0.0003, 0.03125, 7, "q_eq_k"),
                                    ("calm-fox-2 (bbb2)", 0.001, None, None, "unknown"),
                                    ("calm-fox-2 (ddd4)", None, None, None, "unknown")]
    configs = [json.loads(g[5]) for g in got]
    assert [c["project"] for c in configs] == ["qkv-sharing", "qkv-sharing", "Default"]
    assert configs[0]["mlflow_tags"] == {"team": "attn"} and configs[0]["mlflow_deleted_runs"] == 1
    first = rep.run_ids[0]
    assert points(store, first, "train/loss") == [(0, 4.0), (10, 3.0), (20, 2.5)]
    assert points(store, first, "val/loss") == [(20, 3.1)]
    with store.connect() as con:       # MLflow's is_nan row: a NaN, which the store keeps as NULL
        nan = con.execute("SELECT step, value FROM points WHERE metric = 'val/loss' AND run_id <> ?",
                          [first]).fetchall()
    assert nan == [(5, None)]
    assert db.read_bytes() == before                       # opened read-only
    assert [f.status for f in ingest_paths(store, [db.parent]).files] == ["unchanged"]


def test_an_sqlite_file_of_another_program_is_reported(store, tmp_path):
    import sqlite3

    other = tmp_path / "data" / "app.db"
    other.parent.mkdir()
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE users (id INTEGER, name TEXT)")
        con.execute("CREATE TABLE metrics (id INTEGER, value REAL)")
    [rep] = ingest_paths(store, [other.parent]).files
    assert rep.status == "skipped"
    assert rep.reason == (
        "not a training log qkvscope reads: expected a tracker's SQLite store (mlflow_sqlite: "
        "experiments(experiment_id, name), metrics(key, run_uuid, step, timestamp, value), "
        "params(key, run_uuid, value), runs(experiment_id, lifecycle_stage, name, run_uuid), "
        "tags(key, run_uuid, value); trackio: metrics(metrics, run_name, step, timestamp)), found an SQLite "
        "database with tables metrics, users")
    with pytest.raises(LogFormatError, match="found an SQLite database with tables metrics, users$"):
        ingest_log(store, other)


# --- trackio ---------------------------------------------------------------------------------------

def trackio_db(path: Path, *, bad_row: bool = False) -> Path:
    """A trackio project file as trackio's SQLiteStorage writes it (trackio/sqlite_storage.py:
    metrics(id, timestamp, run_name, step, metrics JSON) and configs(id, run_name, config, created_at))."""
    import sqlite3

    con = sqlite3.connect(path)
    con.execute("CREATE TABLE metrics (id INTEGER PRIMARY KEY AUTOINCREMENT, timestamp TEXT NOT NULL, "
                "run_name TEXT NOT NULL, step INTEGER NOT NULL, metrics TEXT NOT NULL)")
    con.execute("CREATE TABLE configs (id INTEGER PRIMARY KEY AUTOINCREMENT, run_name TEXT NOT NULL, "
                "config TEXT NOT NULL, created_at TEXT NOT NULL, UNIQUE(run_name))")
    con.execute("INSERT INTO configs (run_name, config, created_at) VALUES (?, ?, ?)",
                ["dainty-meadow-1", json.dumps({"learning_rate": 6e-4, "weight_decay": 0.1, "seed": 3,
                                                "_Username": "u", "_Created": "2026-02-05T12:46:00"}),
                 "2026-02-05T12:46:00"])
    rows = [("dainty-meadow-1", 0, {"train/loss": 10.9, "lr": 0.0}),
            ("dainty-meadow-1", 1, {"train/loss": 9.7, "lr": 6e-5, "samples": {"_type": "table"}}),
            ("dainty-meadow-1", 2, {"train/loss": 8.8, "lr": 1.2e-4, "eval/loss": 9.0}),
            ("quiet-river-2", 0, {"train/loss": 11.0})]
    for i, (run, step, m) in enumerate(rows):
        con.execute("INSERT INTO metrics (timestamp, run_name, step, metrics) VALUES (?, ?, ?, ?)",
                    [f"2026-02-05T12:46:0{i}", run, step, json.dumps(m)])
    if bad_row:
        con.execute("INSERT INTO metrics (timestamp, run_name, step, metrics) VALUES "
                    "('2026-02-05T12:47:00', 'quiet-river-2', 1, '{\"train/loss\": 1')")
    con.commit()
    con.close()
    return path


def test_trackio_project_file(store, tmp_path):
    db = trackio_db(tmp_path / "gpt-small.db")
    [rep] = ingest_log(store, db)
    assert (rep.format, rep.n_points) == ("trackio", 8)          # 2 + 2 + 3 numbers, and 1
    with store.connect() as con:
        got = con.execute("SELECT id, name, lr, weight_decay, seed, config FROM runs ORDER BY name").fetchall()
    assert [g[1:5] for g in got] == [("dainty-meadow-1", 6e-4, 0.1, 3), ("quiet-river-2", None, None, None)]
    cfg = json.loads(got[0][5])
    assert cfg["project"] == "gpt-small" and cfg["values_not_numbers"] == {"samples": 1}
    assert _metric_counts(store, got[0][0]) == {"train/loss": 3, "lr": 3, "val/loss": 1}    # eval/loss
    assert points(store, got[0][0], "train/loss") == [(0, 10.9), (1, 9.7), (2, 8.8)]
    assert points(store, got[1][0], "train/loss") == [(0, 11.0)]


def test_trackio_row_that_is_not_json_is_an_error(store, tmp_path):
    db = trackio_db(tmp_path / "gpt-small.db", bad_row=True)
    with pytest.raises(LogFormatError) as exc:
        ingest_log(store, db)
    assert str(exc.value) == f"{db}: expected the metrics of row 5 to be JSON, found '{{\"train/loss\": 1'"


# --- Aim and dot-folders ---------------------------------------------------------------------------

def aim_repo(root: Path) -> Path:
    """An Aim repository laid out as github.com/koyeb/example-aim commits its ``.aim/`` (commit
    135fa02a5ab7dd99f22624165ee3765d1bc23901: one run, RocksDB files; no licence, so the layout is
    reproduced with empty files)."""
    aim = root / ".aim"
    for sub in ("meta/chunks/82d7b9aee7b445b6b3a67959", "meta/index", "seqs/chunks/82d7b9aee7b445b6b3a67959"):
        (aim / sub).mkdir(parents=True)
        for f in ("000009.sst", "IDENTITY", "LOG", "MANIFEST-000004"):
            (aim / sub / f).write_bytes(b"")
    (aim / "run_metadata.sqlite").write_bytes(b"")
    return aim


def test_dot_folders(store, tmp_path):
    root = tmp_path / "project"
    aim = aim_repo(root)
    shutil.copytree(RESUMED, root / ".cache" / "wandb" / RESUMED.name)     # a dot-folder holding a store
    swahili_mlruns(root / ".mlflow")
    (root / ".server").mkdir()
    mlflow_db(root / ".server" / "mlflow.db")
    (root / ".idea").mkdir()
    (root / ".idea" / "workspace.xml").write_text("<project/>")
    (root / ".git").mkdir()
    (root / ".mlflow" / "mlruns" / ".trash" / "0f0f").mkdir(parents=True)      # runs deleted in MLflow
    (root / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    report = ingest_paths(store, [root])
    got = sorted((str(Path(f.path).relative_to(root)), f.status, f.format, f.reason) for f in report.files
                 if f.status != "skipped" or "/" not in str(Path(f.path).relative_to(root)))
    assert got == [
        (".aim", "skipped", None,
         "Aim repository (1 run): its metrics are in RocksDB, which qkvscope does not open; export them to "
         "CSV (the Aim UI's table export, or aim.Repo(path).query_metrics(...).dataframe()) and ingest that "
         "file"),
        (f".cache/wandb/{RESUMED.name}/run-a5sov16l.wandb", "added", "wandb_offline", None),
        (".idea", "skipped", None,
         "folder whose name starts with a dot, holding no tracker's store (W&B, MLflow, Aim): not searched; "
         "ingest it by its path to read it"),
        (f".mlflow/mlruns/1/{SWAHILI_RUN}/meta.yaml", "added", "mlflow_files", None),
        (".server/mlflow.db", "added", "mlflow_sqlite", None),
    ]
    [trash] = [f for f in report.files if f.path.endswith(".trash")]
    assert (trash.status, trash.reason) == ("skipped", "MLflow's .trash folder: runs deleted in MLflow, not read")
    # The Aim folder given as the path: the same line, its files are not listed one by one.
    [line] = ingest_paths(store, [aim]).files
    assert line.status == "skipped" and line.reason.startswith("Aim repository (1 run): ")
