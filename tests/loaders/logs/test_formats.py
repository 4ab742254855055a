"""Each log format: detected from content, parsed into the expected points."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from loaders.logs import detect_log, ingest_log, list_runs
from tests.loaders.logs.helpers import points, write

MODDED_HEADER = '''import os
import sys
with open(sys.argv[0]) as f:
    code = f.read() # read the code of this file ASAP, for logging
import torch

@dataclass
class Hyperparameters:
    num_iterations : int = {iters}
    seed : int = {seed}

optimizer = torch.optim.AdamW(params, lr={lr}, betas=(0.9, 0.95), weight_decay={wd})
for step in range(train_steps + 1):
    print0(f"step:{{step}}/{{train_steps}} val_loss:{{val_loss:.4f}} train_time:{{t:.0f}}ms")
====================================================================================================
Running Python 3.12.7
'''


def modded_run(iters, seed, lr, wd, base):
    lines = [MODDED_HEADER.format(iters=iters, seed=seed, lr=lr, wd=wd)]
    lines.append(f"step:0/{iters} val_loss:{base:.4f} train_time:0ms step_avg:nanms")
    for s in range(1, iters + 1):
        lines.append(f"step:{s}/{iters} train_loss:{base - 0.1 * s:.4f} train_time:{s * 100}ms "
                     f"step_avg:{100.0:.2f}ms")
    lines.append(f"step:{iters}/{iters} val_loss:{base - 0.1 * iters - 0.05:.4f} "
                 f"train_time:{iters * 100}ms step_avg:100.00ms")
    lines.append("peak memory consumption: 22 GiB")
    return "\n".join(lines) + "\n"


def test_csv_long(store, tmp_path):
    p = write(tmp_path / "r" / "loss_long.csv",
              "step,metric,value\n0,train_loss,3.0\n0,val_loss,3.1\n10,train_loss,2.5\n10,lr,0.001\n")
    assert detect_log(p) == "csv_long"
    [rep] = ingest_log(store, p)
    assert (rep.status, rep.n_points) == ("added", 4)
    rid = rep.run_ids[0]
    assert points(store, rid, "train/loss") == [(0, 3.0), (10, 2.5)]
    assert points(store, rid, "val/loss") == [(0, 3.1)]
    assert points(store, rid, "lr") == [(10, 0.001)]


def test_csv_wide_sparse_and_wall_time(store, tmp_path):
    p = write(tmp_path / "r" / "wide.csv",
              "step,train_loss,val_loss,learning_rate,wall_time\n1,3.0,,0.1,5.5\n2,2.0,2.5,0.1,6.5\n")
    assert detect_log(p) == "csv_wide"
    [rep] = ingest_log(store, p)
    assert rep.n_points == 5
    with store.connect() as con:
        rows = con.execute("SELECT step, metric, value, wall_time FROM points ORDER BY step, metric").fetchall()
    assert rows == [(1, "lr", 0.1, 5.5), (1, "train/loss", 3.0, 5.5), (2, "lr", 0.1, 6.5),
                    (2, "train/loss", 2.0, 6.5), (2, "val/loss", 2.5, 6.5)]


def test_jsonl_with_resume_is_one_run(store, tmp_path):
    lines = [f'{{"step": {s}, "train_loss": {10 - s}, "tokens": {s * 100}}}' for s in range(0, 6)]
    # Crash after step 5, resumed from the checkpoint at step 3: steps 4, 5 repeat.
    lines += [f'{{"step": {s}, "train_loss": {20 - s}, "tokens": {s * 100}}}' for s in range(4, 8)]
    p = write(tmp_path / "r" / "log.jsonl", "\n".join(lines) + "\n")
    assert detect_log(p) == "jsonl"
    [rep] = ingest_log(store, p)
    [run] = list_runs(store)
    assert run["resumed"] is True
    assert points(store, run["id"], "train/loss") == [
        (0, 10.0), (1, 9.0), (2, 8.0), (3, 7.0), (4, 16.0), (5, 15.0), (6, 14.0), (7, 13.0)]
    with store.connect() as con:
        assert con.execute("SELECT tokens FROM points WHERE step = 7").fetchone()[0] == 700


def test_lightning_folder(store, tmp_path):
    d = tmp_path / "lightning_logs" / "version_0"
    write(d / "hparams.yaml", "lr: 0.0003\nweight_decay: 0.05\nvariant: q_eq_k\nseed: 7\n")
    write(d / "metrics.csv", "epoch,step,train_loss,val_loss,lr-AdamW\n"
                             "0,49,2.5,,0.0003\n0,49,,2.7,\n1,99,2.0,,0.0002\n1,99,,2.2,\n")
    assert detect_log(d) == "lightning"
    assert detect_log(d / "metrics.csv") == "lightning"
    [rep] = ingest_log(store, d)
    [run] = list_runs(store)
    assert run["name"] == "lightning_logs/version_0"
    assert (run["variant"], run["lr"], run["weight_decay"], run["seed"]) == ("q_eq_k", 0.0003, 0.05, 7)
    assert run["resumed"] is False
    assert points(store, run["id"], "val/loss") == [(49, 2.7), (99, 2.2)]
    assert points(store, run["id"], "lr") == [(49, 0.0003), (99, 0.0002)]
    assert points(store, run["id"], "epoch") == [(49, 0.0), (99, 1.0)]
    # The folder and its metrics.csv are one log.
    assert ingest_log(store, d / "metrics.csv")[0].status == "unchanged"


def test_wandb_export_many_runs(store, tmp_path):
    p = write(tmp_path / "wandb_export.csv",
              '"Step","wd0.1-run - train/loss","wd0.1-run - train/loss__MIN","wd0.1-run - train/loss__MAX",'
              '"wd0.03-run - train/loss","wd0.03-run - train/loss__MIN","wd0.03-run - train/loss__MAX"\n'
              '"0","3.0","2.9","3.1","3.2","3.1","3.3"\n"100","2.0","1.9","2.1","",""," "\n')
    assert detect_log(p) == "wandb_csv"
    [rep] = ingest_log(store, p)
    runs = {r["name"]: r for r in list_runs(store)}
    assert set(runs) == {"wd0.1-run", "wd0.03-run"}
    assert runs["wd0.03-run"]["weight_decay"] == 0.03
    assert points(store, runs["wd0.1-run"]["id"], "train/loss") == [(0, 3.0), (100, 2.0)]
    assert points(store, runs["wd0.03-run"]["id"], "train/loss") == [(0, 3.2)]
    assert rep.reason is None            # empty cells (and the bands) are not counted


def test_wandb_export_counts_what_it_cannot_read(store, tmp_path):
    """Cells that are not numbers are no points and are counted per run; a row without a step
    number is counted once for the file, whatever runs it holds cells of. NaN is stored as NULL,
    +-inf as it is; a step logged again replaces the earlier point (the run is resumed)."""
    p = write(tmp_path / "wandb_export.csv",
              'Step,r1 - loss,r1 - loss__MIN,r2 - train_loss,r1 - val_loss,"r""q - lr",r2 - train_loss__MAX\n'
              '0,1.0,0.9,n/a,2.0,nan,x\n1,inf,,--,, ,\nx,3.0,,4.0,,,\n,5.0,,,,,\n,,7,,,,\n1e30,6.0,,,,,\n'
              '2,1.5,,-inf,n/a,1e-3,\n1,1.25,,2.0,bad,7,\n2.6,9,,foo,bar,baz,\ny,,,,,,\n')
    [rep] = ingest_log(store, p)
    assert (rep.n_points, rep.reason) == (10, "7 cells not numbers: n/a, bad, bar, ...; "
                                              "4 rows without a step number: x, '', 1e30, ...")
    runs = {r["name"]: r for r in list_runs(store)}
    assert points(store, runs["r1"]["id"], "train/loss") == [(0, 1.0), (1, 1.25), (2, 1.5), (3, 9.0)]
    assert points(store, runs["r1"]["id"], "val/loss") == [(0, 2.0)]
    assert points(store, runs["r2"]["id"], "train/loss") == [(1, 2.0), (2, float("-inf"))]
    assert points(store, runs['r"q']["id"], "lr") == [(0, None), (1, 7.0), (2, 0.001)]
    assert all(r["resumed"] for r in runs.values())

def test_wandb_export_of_a_nanogpt_fork(store):
    """The structure of a real export (``realworld/SOURCES.md``): every cell quoted, run names with
    a timestamp, runs of different lengths (``""`` where a run has stopped)."""
    p = Path(__file__).parent / "realworld" / "wandb_export" / "wandb_export.csv"
    assert detect_log(p) == "wandb_csv"
    [rep] = ingest_log(store, p)
    assert (rep.status, rep.n_points, rep.reason) == ("added", 26, None)
    runs = {r["name"]: r for r in list_runs(store)}
    assert len(runs) == 8 and "gpt2_char_to_token1729534595.422701" in runs
    assert points(store, runs["gpt2"]["id"], "train/loss") == [
        (0, 10.95404052734375), (1, 6.684843063354492), (2, 5.882663726806641), (354, 3.297886848449707),
        (355, 3.2762792110443115)]
    assert points(store, runs["gpt2_char_to_token1729491541.2756786"]["id"], "train/loss") == [
        (0, 10.945090293884277), (1, 7.024113655090332), (2, 6.403542518615723)]

def test_nanogpt_stdout(store, tmp_path):
    text = """Overriding config with config/train_shakespeare_char.py:
Overriding: weight_decay = 0.1
Overriding: learning_rate = 0.001
tokens per iteration will be: 16,384
found vocab_size = 65 (inside data/shakespeare_char/meta.pkl)
number of parameters: 10.65M
step 0: train loss 4.2874, val loss 4.2823
iter 0: loss 4.2654, time 29813.38ms, mfu -100.00%
iter 10: loss 3.2457, time 52.31ms, mfu 7.13%
step 250: train loss 1.9681, val loss 2.0691
saving checkpoint to out-shakespeare-char
iter 250: loss 2.0409, time 6124.40ms, mfu 6.84%
"""
    p = write(tmp_path / "shakespeare" / "train.log", text)
    assert detect_log(p) == "nanogpt"
    [rep] = ingest_log(store, p)
    [run] = list_runs(store)
    assert (run["weight_decay"], run["lr"], run["model_size"]) == (0.1, 0.001, 10_650_000)
    assert points(store, run["id"], "train/loss") == [(0, 4.2654), (10, 3.2457), (250, 2.0409)]
    assert points(store, run["id"], "val/loss") == [(0, 4.2823), (250, 2.0691)]
    assert points(store, run["id"], "eval/train_loss") == [(0, 4.2874), (250, 1.9681)]
    assert points(store, run["id"], "mfu")[1] == (10, 7.13)
    assert run["config"]["saved_checkpoints"] == [{"step": 250, "dir": "out-shakespeare-char"}]
    with store.connect() as con:
        assert con.execute("SELECT tokens FROM points WHERE step = 250 LIMIT 1").fetchone()[0] == 250 * 16384


def test_modded_nanogpt_three_runs_with_code_header(store, tmp_path):
    text = (modded_run(4, 0, 0.0036, 0.0, 10.8) + modded_run(3, 1, 0.0018, 0.1, 10.9)
            + modded_run(2, 2, 0.0009, 0.03125, 11.0))
    p = write(tmp_path / "records" / "0a1b2c.txt", text)
    assert detect_log(p) == "modded_nanogpt"
    ingest_log(store, p)
    runs = list_runs(store)
    assert [r["name"] for r in runs] == ["0a1b2c", "0a1b2c#2", "0a1b2c#3"]
    assert [r["weight_decay"] for r in runs] == [0.0, 0.1, 0.03125]
    assert [r["lr"] for r in runs] == [0.0036, 0.0018, 0.0009]
    assert [r["seed"] for r in runs] == [0, 1, 2]
    assert [(r["first_step"], r["last_step"]) for r in runs] == [(0, 4), (0, 3), (0, 2)]
    assert points(store, runs[1]["id"], "val/loss") == [(0, 10.9), (3, pytest.approx(10.9 - 0.3 - 0.05))]
    assert points(store, runs[0]["id"], "train/loss")[0] == (1, pytest.approx(10.7))
    with store.connect() as con:
        wall = con.execute("SELECT wall_time FROM points WHERE run_id = ? AND step = 2 AND metric = 'train/loss'",
                           [runs[0]["id"]]).fetchone()[0]
    assert wall == 0.2  # train_time:200ms
    assert all(r["resumed"] is False for r in runs)


def test_llmc_log(store, tmp_path):
    p = write(tmp_path / "main.log", "s:0 tel:10.97\ns:0 trl:10.96 lr:0.0006 norm:12.5\ns:1 trl:10.81 lr:0.0006 norm:9.1\n")
    assert detect_log(p) == "llmc"
    [rep] = ingest_log(store, p)
    rid = rep.run_ids[0]
    assert points(store, rid, "val/loss") == [(0, 10.97)]
    assert points(store, rid, "train/loss") == [(0, 10.96), (1, 10.81)]
    assert points(store, rid, "norm") == [(0, 12.5), (1, 9.1)]


def test_query_free_tensors_one_run(store, tmp_path):
    d = tmp_path / "reduced_wd0.03"
    d.mkdir()
    (d / "config_reduced.py").write_text(
        "import math\nmodel_args = {\n  'n_embd': 64,\n  'use_query_weights': False,\n"
        "  'scale': 1/(2*(math.sqrt(16))),\n  'learning_rate': 6e-4,\n  'weight_decay': 0.03,\n}\n")
    train = torch.zeros(3001, 3)
    train[0, 0], train[10, 0], train[3000, 0] = 10.0, 9.0, 3.0
    ev = torch.zeros(4, 3)  # rows [eval_iters, mean, std], one per 1000 steps; last not reached
    ev[0] = torch.tensor([200.0, 10.5, 0.25])
    ev[1] = torch.tensor([200.0, 5.5, 0.5])
    ev[3] = torch.tensor([200.0, 3.25, 0.125])
    torch.save(train, d / "tensor.pt")
    torch.save(ev, d / "eval_val_tensor.pt")
    torch.save(ev * 0.5, d / "eval_train_tensor.pt")
    for f in ("tensor.pt", "eval_val_tensor.pt", "eval_train_tensor.pt"):
        assert detect_log(d / f) == "query_free"
        ingest_log(store, d / f)
    [run] = list_runs(store)
    assert (run["variant"], run["weight_decay"], run["lr"]) == ("wq_identity", 0.03, 6e-4)
    assert points(store, run["id"], "train/loss") == [(0, 10.0), (10, 9.0), (3000, 3.0)]
    assert points(store, run["id"], "val/loss") == [(0, 10.5), (1000, 5.5), (3000, 3.25)]
    assert points(store, run["id"], "val/loss_std") == [(0, 0.25), (1000, 0.5), (3000, 0.125)]
    assert points(store, run["id"], "eval/train_loss")[1] == (1000, 2.75)
    assert run["source"] == str(d.resolve())


def test_query_free_refuses_other_pickles(tmp_path):
    torch.save({"a": torch.zeros(2)}, tmp_path / "tensor.pt")
    assert detect_log(tmp_path / "tensor.pt") is None


def test_projection_sharing_final_model_by_format(store, tmp_path):
    d = tmp_path / "outputs_qkv_k_equals_v_10B"
    d.mkdir()
    torch.save({"step": 4069, "epoch": 0, "tokens_seen": 4069 * 491520,
                "model_state_dict": {"h.0.attn.c_q.weight": torch.zeros(4, 4)},
                "val_metrics": {"loss": 3.21, "perplexity": 24.8},
                "model_config": {"n_layer": 2, "n_head": 2, "n_embd": 4},
                "train_config": {"learning_rate": 0.0002, "weight_decay": 0.1, "seed": 42,
                                 "clearml_task": "GPT-300M-QKV-KEqualsV-10B"}}, d / "final_model.pt")
    assert detect_log(d / "final_model.pt") is None  # a checkpoint first: the checkpoint loader's
    [rep] = ingest_log(store, d / "final_model.pt", format="projection_sharing")
    [run] = list_runs(store)
    assert (run["variant"], run["weight_decay"], run["lr"], run["seed"]) == ("k_eq_v", 0.1, 0.0002, 42)
    assert points(store, run["id"], "val/loss") == [(4069, 3.21)]
    assert points(store, run["id"], "val/perplexity") == [(4069, 24.8)]


def test_nan_values_are_stored_as_null(store, tmp_path):
    p = write(tmp_path / "div" / "log.jsonl",
              '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": NaN}\n{"step": 3, "loss": Infinity}\n{"step": 4}\n')
    c = write(tmp_path / "div" / "wide.csv", "step,loss\n1,2.0\n2,nan\n3,inf\n4,\n")
    for path in (p, c):
        [rep] = ingest_log(store, path)
        got = points(store, rep.run_ids[0], "train/loss")
        assert got[0] == (1, 2.0) and got[1] == (2, None) and got[2][1] == math.inf
        assert len(got) == 3  # step 4 logged no loss: no point
