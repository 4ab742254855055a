"""Logs written by other people's code and by the real libraries."""
from __future__ import annotations

import json

import pytest

from loaders.logs import detect_log, ingest_log, list_runs
from tests.loaders.logs.helpers import points


def test_realworld_llmc_log(store, realworld):
    p = realworld / "logs" / "llmc" / "llmc-adamw-f66d43d7.log"
    assert detect_log(p) == "llmc"
    [rep] = ingest_log(store, p)
    [run] = list_runs(store)
    assert (run["name"], run["format"], run["metrics"]) == ("llmc-adamw-f66d43d7", "llmc", ["train/loss", "val/loss"])
    val = points(store, run["id"], "val/loss")
    assert val[0] == (0, 10.968871) and val[1] == (128, 6.034447) and val[2] == (256, 5.231128)
    assert points(store, run["id"], "train/loss")[:2] == [(0, 10.965596), (1, 10.814037)]
    assert rep.n_points == 9612  # one point per line of the file
    assert ingest_log(store, p)[0].status == "unchanged"


def test_realworld_tensorboard(store, realworld):
    [p] = (realworld / "logs" / "tensorboard").rglob("events.out.tfevents.*")
    assert detect_log(p) == "tensorboard"
    ingest_log(store, p)
    [run] = list_runs(store)
    assert run["name"] == "GPT8L8H"
    assert run["metrics"] == ["lr", "mfu", "train/loss", "val/loss"]
    with store.connect() as con:
        n_null_wall = con.execute("SELECT count(*) FROM points WHERE wall_time IS NULL").fetchone()[0]
    assert n_null_wall == 0  # every event carries its wall time


def test_realworld_hf_trainer_state(store, realworld):
    p = realworld / "logs" / "hf-trainer" / "trainer_state.json"
    assert detect_log(p) == "hf_trainer"
    ingest_log(store, p)
    [run] = list_runs(store)
    doc = json.loads(p.read_text())
    train = [(e["step"], e["loss"]) for e in doc["log_history"] if "loss" in e]
    assert points(store, run["id"], "train/loss") == train
    g3 = [(e["step"], e["eval_g3_loss"]) for e in doc["log_history"] if "eval_g3_loss" in e]
    assert points(store, run["id"], "eval_g3_loss") == g3  # custom eval groups keep their names
    assert run["config"]["global_step"] == 12030


def test_realworld_hf_trainer_lr_is_the_configured_one_or_said_to_be_logged(store, realworld, tmp_path):
    import shutil

    import torch
    from transformers import TrainingArguments

    real = realworld / "logs" / "hf-trainer" / "trainer_state.json"
    alone, beside = tmp_path / "alone", tmp_path / "beside"
    for d in (alone, beside):
        d.mkdir()
        shutil.copy(real, d / "trainer_state.json")
    # its log_history logs learning_rate 1e-05 at every 401st step; no config says what was set
    ingest_log(store, alone / "trainer_state.json")
    [run] = list_runs(store)
    assert (run["lr"], run["config"]["metadata_sources"]["lr"]) == (1e-05, "logged lr (peak)")
    assert run["config"]["metadata_notes"] == [
        "lr 1e-05 is the highest lr the log shows (the schedule's value at a logged step, after warmup or "
        "decay): no config beside the log states the configured lr"]
    # the Trainer's own training_args.bin beside it (torch.save(args), as Trainer._save writes it)
    torch.save(TrainingArguments(output_dir=str(beside), learning_rate=2e-5, weight_decay=0.01, seed=42,
                                 report_to=[]), beside / "training_args.bin")
    ingest_log(store, beside / "trainer_state.json")
    run = next(r for r in list_runs(store) if r["name"] == "beside")
    assert (run["lr"], run["weight_decay"], run["seed"]) == (2e-5, 0.01, 42)
    assert run["config"]["metadata_sources"]["lr"] == "training_args.bin"
    assert run["config"]["lr_peak"] == 1e-05 and "metadata_notes" not in run["config"]


def test_summary_writer_scalars(store, tmp_path):
    from torch.utils.tensorboard import SummaryWriter
    d = tmp_path / "runs" / "wd0.1-k_eq_v"
    w = SummaryWriter(log_dir=str(d))
    for step in range(0, 50, 10):
        w.add_scalar("train/loss", 5.0 - step / 10, step, walltime=1000.0 + step)
        w.add_scalar("Loss/val", 5.5 - step / 10, step)
    w.add_text("note", "not a scalar", 0)
    w.close()
    [ev] = d.glob("events.out.tfevents.*")
    assert detect_log(ev) == "tensorboard"
    [rep] = ingest_log(store, ev)
    [run] = list_runs(store)
    assert (run["name"], run["variant"], run["weight_decay"]) == ("wd0.1-k_eq_v", "k_eq_v", 0.1)
    assert run["metrics"] == ["train/loss", "val/loss"]
    assert points(store, run["id"], "train/loss") == [(s, 5.0 - s / 10) for s in range(0, 50, 10)]
    with store.connect() as con:
        assert con.execute("SELECT wall_time FROM points WHERE metric = 'train/loss' AND step = 20").fetchone()[0] == 1020.0


@pytest.mark.slow
def test_transformers_trainer_state(store, tmp_path):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    data = [{"input_ids": torch.randint(0, 32, (16,)), "labels": torch.randint(0, 32, (16,))} for _ in range(16)]
    out = tmp_path / "hf-out-wd0.05"
    args = TrainingArguments(output_dir=str(out), max_steps=6, per_device_train_batch_size=4, logging_steps=2,
                             eval_strategy="steps", eval_steps=3, save_steps=3, learning_rate=1e-3,
                             weight_decay=0.05, report_to=[], use_cpu=True, seed=5, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:4])
    trainer.train()
    predicted = trainer.predict(data[:4], metric_key_prefix="predict").metrics    # as run_clm.py asks
    trainer.log(dict(predicted))                       # a script logging them: an entry at step 6
    trainer.state.log_history.append({"test_loss": predicted["predict_loss"]})   # one without a step
    trainer.save_state()  # out/trainer_state.json, with the closing summary entry
    states = sorted(out.rglob("trainer_state.json"))
    assert [s.parent.name for s in states] == ["checkpoint-3", "checkpoint-6", out.name]
    for s in states:
        assert detect_log(s) == "hf_trainer"
        ingest_log(store, s)
    [run] = list_runs(store)  # every state file feeds the one output-dir run
    assert run["name"] == "hf-out-wd0.05" and run["source"] == str(out.resolve())
    assert run["config"]["run_dir"] == str(out.resolve())
    assert [s for s, _ in points(store, run["id"], "train/loss")] == [2, 4, 6]
    assert [s for s, _ in points(store, run["id"], "val/loss")] == [3, 6]
    # the configured lr and weight decay, from training_args.bin (its pickle's opcodes, never unpickled);
    # the logged lr is the linear schedule's, already decayed at step 2
    assert (run["lr"], run["weight_decay"], run["seed"]) == (1e-3, 0.05, 5)
    assert run["config"]["metadata_sources"]["lr"] == "training_args.bin"
    assert points(store, run["id"], "lr")[0][1] < 1e-3 and "metadata_notes" not in run["config"]
    assert points(store, run["id"], "predict_loss") == [(6, pytest.approx(predicted["predict_loss"]))]
    assert points(store, run["id"], "test_loss") == [(6, pytest.approx(predicted["predict_loss"]))]
    assert run["config"]["entries_without_step"] == 1
    assert run["resumed"] is False
    with store.connect() as con:  # the closing summary keeps its own name, the curve is untouched
        assert con.execute("SELECT count(*) FROM points WHERE metric = 'train_loss'").fetchone()[0] == 1
