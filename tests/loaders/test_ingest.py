"""Folder scans: what is found, how checkpoints link to runs, failure isolation."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from loaders.errors import QkvscopeError
from loaders.ingest import discover, ingest_paths
from loaders.logs import list_runs
from loaders.store import Store
from tests.loaders.test_layouts_papers import D, H, L, ps_sd


def gpt2_folder(folder: Path, seed: int = 0) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=64,
                               n_positions=64)).save_pretrained(folder)
    return folder


def test_discover_treats_a_hf_folder_as_one_item(tmp_path):
    gpt2_folder(tmp_path / "runs" / "a" / "final")
    (tmp_path / "runs" / "a" / "log.csv").write_text("step,loss\n0,1\n")
    (tmp_path / "runs" / ".git").mkdir()
    (tmp_path / "runs" / ".git" / "HEAD").write_text("ref")
    found = [p.relative_to(tmp_path).as_posix() for p in discover([tmp_path / "runs"])]
    assert found == ["runs/a/final", "runs/a/log.csv"]


def test_checkpoints_link_to_their_run_and_take_the_step_from_the_name(tmp_path):
    run = tmp_path / "runs" / "gpt2-wd0.1"
    ck = run / "checkpoints"
    ck.mkdir(parents=True)
    gpt2_folder(ck / "step_000200", seed=1)
    gpt2_folder(ck / "step_000400", seed=2)
    (run / "metrics.csv").write_text("step,train_loss,val_loss\n0,4.0,4.1\n200,3.0,3.2\n400,2.5,2.9\n")
    store = Store(tmp_path / "q.duckdb")
    report = ingest_paths(store, [tmp_path / "runs"])
    assert report.count("added") == 3 and report.count("error") == 0
    runs = list_runs(store)
    assert len(runs) == 1 and runs[0]["weight_decay"] == 0.1
    ckpts = store.checkpoints()
    assert sorted((c["step"], c["run_id"]) for c in ckpts) == [(200, runs[0]["id"]), (400, runs[0]["id"])]
    # the log never states the model size: it comes from the run's checkpoints
    assert runs[0]["model_size"] == ckpts[0]["params_total"] > 0


def test_checkpoint_stored_before_its_log_is_linked_later(tmp_path):
    run = tmp_path / "run"
    gpt2_folder(run / "final")
    store = Store(tmp_path / "q.duckdb")
    ingest_paths(store, [run / "final"])
    assert store.checkpoints()[0]["run_id"] is None
    (run / "metrics.jsonl").write_text("\n".join(json.dumps({"step": s, "train_loss": 3 - s / 100})
                                                 for s in range(5)) + "\n")
    ingest_paths(store, [run])
    assert store.checkpoints()[0]["run_id"] == list_runs(store)[0]["id"]


def test_one_broken_file_does_not_stop_the_others(tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    gpt2_folder(folder / "good")
    (folder / "broken.safetensors").write_bytes(b"\xff" * 4)
    store = Store(tmp_path / "q.duckdb")
    report = ingest_paths(store, [folder])
    by_name = {Path(f.path).name: f for f in report.files}
    assert by_name["good"].status == "added"
    assert by_name["broken.safetensors"].status == "error"
    assert by_name["broken.safetensors"].reason.startswith(str(folder / "broken.safetensors"))
    assert len(store.checkpoints()) == 1


def test_same_weights_under_two_names_are_stored_once(tmp_path):
    a = gpt2_folder(tmp_path / "a" / "model", seed=3)
    b = tmp_path / "b" / "model"
    b.mkdir(parents=True)
    for f in a.iterdir():
        (b / f.name).write_bytes(f.read_bytes())
    store = Store(tmp_path / "q.duckdb")
    report = ingest_paths(store, [tmp_path / "a", tmp_path / "b"])
    assert [f.status for f in report.files] == ["added", "unchanged"]
    assert len(store.checkpoints()) == 1


def test_projection_sharing_checkpoint_gives_a_checkpoint_and_its_val_metrics(tmp_path):
    sd = ps_sd({"c_q": H, "c_k": H}, torch.Generator().manual_seed(7))
    run = tmp_path / "GPT-300M-QKV-KEqualsV"
    run.mkdir()
    torch.save({"step": 33908, "tokens_seen": 10_000, "model_state_dict": sd,
                "val_metrics": {"loss": 3.058, "perplexity": 21.28},
                "model_config": {"n_layer": L, "n_embd": D, "n_head": H, "n_inner": 4 * D,
                                 "n_positions": 8, "vocab_size": 32},
                "train_config": {"weight_decay": 0.1, "learning_rate": 2e-4}}, run / "final_model.pt")
    store = Store(tmp_path / "q.duckdb")
    report = ingest_paths(store, [run])
    kinds = sorted((f.kind, f.status) for f in report.files)
    assert kinds == [("checkpoint", "added"), ("log", "added")]
    ckpt = store.checkpoints()[0]
    assert (ckpt["architecture"], ckpt["variant"], ckpt["step"]) == ("projection_sharing", "k_eq_v", 33908)
    runs = list_runs(store)
    assert len(runs) == 1 and "val/loss" in runs[0]["metrics"] and runs[0]["weight_decay"] == 0.1
    assert ckpt["run_id"] == runs[0]["id"]


def test_own_checkpoints_report_their_training_step():
    from loaders.checkpoints import inspect_checkpoint

    ckpt = Path(__file__).resolve().parents[2] / "data/demo/qkv-mha-wd0.1/checkpoints/step_000500.safetensors"
    info = inspect_checkpoint(ckpt)
    assert (info["architecture"], info["variant"], info["step"]) == ("qkvscope", "qkv", 500)


def test_watch_ingests_new_lines_of_a_live_log(tmp_path):
    from loaders.ingest import watch

    run = tmp_path / "live"
    run.mkdir()
    log = run / "metrics.jsonl"
    log.write_text('{"step": 0, "train_loss": 4.0}\n')
    store = Store(tmp_path / "q.duckdb")
    polls: list[dict] = []

    def on_report(report):
        polls.append(report.to_json())
        with log.open("a") as fh:  # the trainer writes another line between polls
            fh.write(json.dumps({"step": len(polls), "train_loss": 4.0 - len(polls) / 10}) + "\n")

    watch(store, [tmp_path], interval=0.01, on_report=on_report, stop=lambda: len(polls) >= 4)
    assert [p["added"] + p["appended"] for p in polls] == [1, 1, 1, 1]
    [r] = list_runs(store)
    assert (r["n_points"], r["last_step"]) == (4, 3)  # steps 0-3 stored; the 5th line came after the last poll


def test_watch_waits_out_a_busy_database(tmp_path):
    """Another process holding the database longer than busy_timeout costs a poll, not the watch."""
    import subprocess
    import sys

    from loaders.errors import DatabaseBusyError
    from loaders.ingest import watch

    run = tmp_path / "live"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "train_loss": 4.0}\n{"step": 1, "train_loss": 3.5}\n')
    db = tmp_path / "q.duckdb"
    Store(db).checkpoints()                                   # create the file and its schema
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time; con = duckdb.connect(sys.argv[1]); "
         "print('held', flush=True); time.sleep(2.0); con.close()", str(db)],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    busy: list[DatabaseBusyError] = []
    reports: list[dict] = []
    watch(Store(db, busy_timeout=0.2), [run], interval=0.1, on_busy=busy.append,
          on_report=lambda r: reports.append(r.to_json()), stop=lambda: bool(reports))
    holder.wait(timeout=30)
    assert busy and all("database is busy" in str(e) for e in busy)
    assert reports[0]["added"] == 1
    [r] = list_runs(Store(db))
    assert r["n_points"] == 2


def test_watch_without_on_busy_raises_database_busy(tmp_path):
    import subprocess
    import sys

    from loaders.errors import DatabaseBusyError
    from loaders.ingest import watch

    run = tmp_path / "live"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "train_loss": 4.0}\n')
    db = tmp_path / "q.duckdb"
    Store(db).checkpoints()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time; con = duckdb.connect(sys.argv[1]); "
         "print('held', flush=True); time.sleep(2.0); con.close()", str(db)],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(DatabaseBusyError, match="database is busy"):
        watch(Store(db, busy_timeout=0.2), [run], interval=0.1, stop=lambda: True)
    holder.wait(timeout=30)


def test_watch_from_the_cli_stops_cleanly_on_ctrl_c(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "live"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "train_loss": 4.0}\n')
    db = tmp_path / "q.duckdb"
    proc = subprocess.Popen([sys.executable, "-m", "app", "ingest", str(tmp_path), "--db", str(db), "--watch",
                             "--interval", "0.2"], cwd=Path(__file__).resolve().parents[2],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # started with SIGINT ignored, as under a parent that ignores it (a pytest
                            # worker did, and the watch never stopped): Ctrl-C must still end it
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if db.exists():
                try:
                    if list_runs(Store(db, busy_timeout=1)):
                        break
                except QkvscopeError:  # the watcher holds the write lock for a moment
                    continue
        with (run / "metrics.jsonl").open("a") as fh:
            fh.write('{"step": 1, "train_loss": 3.5}\n')
        while time.monotonic() < deadline:
            time.sleep(0.5)
            try:
                if list_runs(Store(db, busy_timeout=1))[0]["n_points"] == 2:
                    break
            except QkvscopeError:
                continue
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)   # a busy 2-core CI box: the child is stopped too
    assert proc.returncode == 0, err
    assert "appended" in out
    assert list_runs(Store(db))[0]["n_points"] == 2
