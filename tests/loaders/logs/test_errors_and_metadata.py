"""Exact error messages for bad input; run metadata; user corrections; the CLI."""
from __future__ import annotations

import json

import pytest

from app.cli import main
from loaders.errors import LogFormatError, QkvscopeError
from loaders.logs import READERS, detect_log, ingest_log, list_runs, set_run_metadata
from loaders.logs.metadata import from_name, normalise_variant
from tests.loaders.logs.helpers import write

EXPECTED = "expected a training log (" + ", ".join(n for n in READERS if n != "projection_sharing") + ")"


def test_empty_file(store, tmp_path):
    p = write(tmp_path / "empty.log", "")
    assert detect_log(p) is None
    with pytest.raises(LogFormatError) as e:
        ingest_log(store, p)
    assert str(e.value) == f"{p}: {EXPECTED}; found an empty file (0 bytes)"


def test_binary_garbage(store, tmp_path):
    p = tmp_path / "garbage.bin"
    p.write_bytes(bytes([0, 1, 2, 3, 255, 254, 0, 7]) * 100)
    assert detect_log(p) is None
    with pytest.raises(LogFormatError) as e:
        ingest_log(store, p)
    assert str(e.value) == f"{p}: {EXPECTED}; found binary data (first bytes 00 01 02 03 ff fe 00 07)"


def test_non_utf8_text(store, tmp_path):
    p = tmp_path / "latin1.log"
    p.write_bytes("iter 0: loss 4.0, time 1.0ms, mfu 1.00%\nlé\n".encode("latin-1"))
    with pytest.raises(LogFormatError) as e:
        ingest_log(store, p)
    assert str(e.value) == f"{p}: expected UTF-8 text, found byte 0xe9 at offset 41 that is not valid UTF-8"


def test_non_utf8_in_a_named_format(store, tmp_path):
    p = tmp_path / "wide.csv"
    p.write_bytes(b"step,train_loss\n1,2.0\n2,\xff\n")
    with pytest.raises(LogFormatError) as e:
        ingest_log(store, p, format="csv_wide")
    assert str(e.value) == f"{p}: expected UTF-8 text, found byte 0xff at offset 24 that is not valid UTF-8"


def test_unrecognised_text(store, tmp_path):
    p = write(tmp_path / "notes.txt", "\nremember to buy milk\n")
    with pytest.raises(LogFormatError) as e:
        ingest_log(store, p)
    assert str(e.value) == f"{p}: {EXPECTED}; found text whose first line is 'remember to buy milk'"


def test_corrupt_tensorboard(store, tmp_path):
    p = tmp_path / "events.out.tfevents.1.host"
    p.write_bytes(b"\x18\x00\x00\x00\x00\x00\x00\x00\xa3\x7fK\x22\t\x00\x00\x00\x00\x00\x00\x00\x00\x1a\rbrain.Event:2"
                  + b"\xff" * 40)
    assert detect_log(p) == "tensorboard"
    with pytest.raises(LogFormatError) as e:
        ingest_log(store, p)
    assert str(e.value) == (f"{p}: expected TensorBoard event records, found none with a valid checksum "
                            "(corrupt or truncated file)")


def test_unknown_format_name(store, tmp_path):
    p = write(tmp_path / "x.csv", "step,loss\n1,2\n")
    with pytest.raises(LogFormatError) as e:
        ingest_log(store, p, format="parquet")
    assert str(e.value) == f"{p}: unknown log format 'parquet'; expected one of {', '.join(READERS)}"


def test_project_trainer_folder_gets_its_metadata(store, tmp_path):
    d = tmp_path / "sweep" / "k_eq_v-wd0.1-s0"
    write(d / "config.json", json.dumps({"variant": "k_eq_v", "n_kv_heads": 2, "weight_decay": 0.03,
                                         "lr": 0.003, "seed": 3, "n_params": 123456, "d_model": 64}))
    write(d / "metrics.jsonl", '{"step": 0, "train_loss": 4.1, "lr": 0.0, "tokens": 0, "wall_time": 0.1}\n'
                               '{"step": 10, "val_loss": 3.9, "tokens": 5120, "wall_time": 1.5}\n')
    ingest_log(store, d / "metrics.jsonl")
    [run] = list_runs(store)
    # The config file wins over the folder name (wd0.1 in the name is stale).
    assert {k: run[k] for k in ("name", "variant", "n_kv_heads", "weight_decay", "lr", "seed", "model_size")} == {
        "name": "k_eq_v-wd0.1-s0", "variant": "k_eq_v", "n_kv_heads": 2, "weight_decay": 0.03, "lr": 0.003,
        "seed": 3, "model_size": 123456}
    assert run["config"]["run_dir"] == str(d.resolve())
    assert run["config"]["files"]["config.json"]["d_model"] == 64
    assert run["source"] == str(d.resolve())


def test_trainer_folder_jsonl_and_tensorboard_are_one_run(store, tmp_path):
    from torch.utils.tensorboard import SummaryWriter
    d = tmp_path / "qkv-wd0.1-s0"
    write(d / "config.json", json.dumps({"variant": "qkv", "weight_decay": 0.1}))
    w = SummaryWriter(log_dir=str(d))
    w.add_scalar("train/loss", 4.0, 0)
    w.add_scalar("train/loss", 3.0, 10)
    w.close()
    write(d / "metrics.jsonl", '{"step": 0, "train_loss": 4.0}\n{"step": 10, "train_loss": 3.0}\n')
    for f in sorted(d.iterdir()):
        if detect_log(f):
            ingest_log(store, f)
    [run] = list_runs(store)
    assert (run["n_points"], run["resumed"], run["variant"]) == (2, False, "qkv")


def test_metadata_from_names():
    assert from_name("gpt-k_eq_v-wd0.03-lr6e-4-seed2-kv2") == {
        "weight_decay": 0.03, "lr": 6e-4, "seed": 2, "n_kv_heads": 2, "variant": "k_eq_v"}
    assert from_name("query_free_wd_0.03125")["variant"] == "wq_identity"
    assert from_name("Q-MQA q_eq_k")["n_kv_heads"] == 1
    assert from_name("run-17") == {}
    assert [normalise_variant(v) for v in ("Q-K=V", "Q=K-V", "Q=K=V", "KEqualsV", "baseline", "gibberish")] == [
        "k_eq_v", "q_eq_k", "q_eq_k_eq_v", "k_eq_v", "qkv", None]


def test_correction_survives_reingest(store, tmp_path):
    d = tmp_path / "run-a"
    p = write(d / "log.jsonl", '{"step": 1, "train_loss": 2.0}\n')
    [rep] = ingest_log(store, p)
    rid = rep.run_ids[0]
    run = set_run_metadata(store, rid, weight_decay=0.03, variant="Q-K=V", mlp_ratio=4.5)
    assert (run["weight_decay"], run["variant"], run["config"]["mlp_ratio"]) == (0.03, "k_eq_v", 4.5)
    # The log is rewritten and read again: the correction stays.
    write(p, '{"step": 1, "train_loss": 2.5}\n{"step": 2, "train_loss": 2.0}\n')
    assert ingest_log(store, p)[0].status == "added"
    [run] = list_runs(store)
    assert (run["weight_decay"], run["variant"], run["overrides"]) == (0.03, "k_eq_v", ["mlp_ratio", "variant",
                                                                                      "weight_decay"])
    with store.connect() as con:  # the runs row itself carries it, for readers of the table
        assert con.execute("SELECT weight_decay, variant FROM runs WHERE id = ?", [rid]).fetchone() == (0.03, "k_eq_v")


def test_bad_corrections(store, tmp_path):
    [rep] = ingest_log(store, write(tmp_path / "r" / "log.jsonl", '{"step": 1, "train_loss": 2.0}\n'))
    rid = rep.run_ids[0]
    with pytest.raises(QkvscopeError) as e:
        set_run_metadata(store, rid, variant="qqq")
    assert str(e.value) == (f"run {rid}: variant must be one of qkv, wq_identity, q_eq_k, k_eq_v, q_eq_k_eq_v, "
                            "q_eq_k_plus, q_eq_k_eq_v_plus "
                            "or unknown, found 'qqq'")
    with pytest.raises(QkvscopeError) as e:
        set_run_metadata(store, rid, n_kv_heads=2.5)
    assert str(e.value) == f"run {rid}: n_kv_heads must be an integer, found 2.5"
    with pytest.raises(QkvscopeError) as e:
        set_run_metadata(store, 99, lr=0.1)
    assert str(e.value) == f"run 99: no such run in {store.path} (see `python -m app runs`)"


def test_cli_runs_and_run_meta(store, tmp_path, capsys):
    p = write(tmp_path / "r-wd0.1" / "log.jsonl", '{"step": 1, "train_loss": 2.0}\n{"step": 5, "val_loss": 2.5}\n')
    [rep] = ingest_log(store, p)
    assert main(["run-meta", str(rep.run_ids[0]), "--set", "weight_decay=0.03", "--set", "variant=k_eq_v",
                 "--db", str(store.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["weight_decay"] == 0.03
    assert main(["runs", "--db", str(store.path), "--json"]) == 0
    [run] = json.loads(capsys.readouterr().out)
    assert {k: run[k] for k in ("id", "name", "source", "format", "variant", "weight_decay", "lr", "n_points",
                                "metrics", "first_step", "last_step")} == {
        "id": rep.run_ids[0], "name": "r-wd0.1", "source": str(p.resolve()), "format": "jsonl",
        "variant": "k_eq_v", "weight_decay": 0.03, "lr": None, "n_points": 2,
        "metrics": ["train/loss", "val/loss"], "first_step": 1, "last_step": 5}
    assert main(["runs", "--db", str(store.path)]) == 0
    table = capsys.readouterr().out
    assert "r-wd0.1" in table and "k_eq_v" in table and "corrected by the user" in table
    assert main(["run-meta", "1", "--set", "oops", "--db", str(store.path)]) == 2
    assert capsys.readouterr().err.strip() == "error: --set 'oops': expected FIELD=VALUE"


def test_config_files_are_not_logs(tmp_path):
    d = tmp_path / "run"
    one_line = write(d / "config.json", '{"steps": 100, "lr": 0.001, "weight_decay": 0.1}\n')
    assert detect_log(one_line) is None
    assert detect_log(write(d / "train_config.yaml", "step: 1\nlr: 0.1\n")) is None
