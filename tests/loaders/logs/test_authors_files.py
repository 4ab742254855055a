"""Other people's logs read as their authors meant (long CSV lines included).

Every file is built here with the shape of the public one it stands for:
nanoGPT grid stdout, modded-nanogpt track-3 records, Trainer states, llm.c
``main.log``, TensorBoard folders, paper B's ``checkpoints_imagenet/*.csv``.
"""
from __future__ import annotations

import json
import os
import time

import pytest

from analysis.directions import direction
from app.cli import main
from loaders.errors import LogFormatError
from loaders.logs import detect_log, ingest_log, list_runs
from loaders.logs.codeheader import header_hyperparameters
from loaders.logs.metadata import from_name, name_number, paper_b_condition
from loaders.logs.readers._csv_bytes import _quick_scan, csv_line_bytes, scan_bytes
from tests.loaders.logs.helpers import count_points, points, write


def _settled(path, age: float = 10.0):
    """Make ``path`` look finished: last written ``age`` seconds ago."""
    t = time.time() - age
    os.utime(path, (t, t))
    return path


# -- item 1: a nanoGPT grid's stdout ------------------------------------------------
def _nanogpt_config(lr: float, wd: float, n_layer: int) -> list[str]:
    return ["Overriding config with config/train_shakespeare_char.py:",
            "# train a miniature character-level shakespeare model", "",
            "out_dir = 'out-shakespeare-char'", "eval_interval = 250 # keep frequent because we'll overfit",
            "batch_size = 64", "block_size = 256 # context of up to 256 previous characters",
            f"n_layer = {n_layer}", "n_head = 6", "n_embd = 384", "dropout = 0.2", "",
            "learning_rate = 1e-3 # with baby networks can afford to go a bit higher",
            f"Overriding: learning_rate = {lr}", f"Overriding: weight_decay = {wd}",
            "tokens per iteration will be: 16,384",
            "found vocab_size = 65 (inside data/shakespeare_char/meta.pkl)",
            "Initializing a new model from scratch", "number of parameters: 10.65M"]


def _nanogpt_steps(base: float, steps=(0, 250, 500)) -> list[str]:
    out = []
    for s in steps:
        out.append(f"step {s}: train loss {base - s / 1000:.4f}, val loss {base + 0.1 - s / 1000:.4f}")
        out.append(f"iter {s}: loss {base - s / 1000:.4f}, time 52.31ms, mfu 7.13%")
    return out


GRID = [(1e-3, 0.1, 6), (3e-4, 0.0, 4), (6e-4, 0.03, 8)]


def test_nanogpt_grid_is_one_run_per_configuration(store, tmp_path):
    lines = []
    for k, (lr, wd, n_layer) in enumerate(GRID):
        lines += _nanogpt_config(lr, wd, n_layer) + _nanogpt_steps(4.0 - k)
    p = write(tmp_path / "grid" / "grid.log", "\n".join(lines) + "\n")
    assert detect_log(p) == "nanogpt"
    ingest_log(store, p)
    runs = list_runs(store)
    assert [r["name"] for r in runs] == ["grid", "grid#2", "grid#3"]
    assert [(r["lr"], r["weight_decay"]) for r in runs] == [(lr, wd) for lr, wd, _ in GRID]
    assert [r["config"]["n_layer"] for r in runs] == [6, 4, 8]
    for r in runs:
        assert {k: r["config"][k] for k in ("n_head", "n_embd", "batch_size", "block_size", "dropout")} == {
            "n_head": 6, "n_embd": 384, "batch_size": 64, "block_size": 256, "dropout": 0.2}
    assert [r["resumed"] for r in runs] == [False, False, False]
    assert [r["n_points"] for r in runs] == [15, 15, 15]
    assert points(store, runs[1]["id"], "val/loss") == [(0, 3.1), (250, 2.85), (500, 2.6)]


def test_nanogpt_step_back_without_a_printout_is_a_resume(store, tmp_path):
    lines = _nanogpt_config(1e-3, 0.1, 6) + _nanogpt_steps(4.0) + _nanogpt_steps(3.0, steps=(250, 500))
    p = write(tmp_path / "r" / "train.log", "\n".join(lines) + "\n")
    ingest_log(store, p)
    [run] = list_runs(store)
    assert run["resumed"] is True and run["lr"] == 1e-3
    assert points(store, run["id"], "val/loss") == [(0, 4.1), (250, 2.85), (500, 2.6)]


def test_nanogpt_resume_printout_is_the_same_run(store, tmp_path):
    lines = (_nanogpt_config(1e-3, 0.1, 6) + _nanogpt_steps(4.0)
             + _nanogpt_config(1e-3, 0.1, 6) + ["Resuming training from out-shakespeare-char"]
             + _nanogpt_steps(3.0, steps=(500, 750)))
    p = write(tmp_path / "r" / "train.log", "\n".join(lines) + "\n")
    ingest_log(store, p)
    [run] = list_runs(store)
    assert run["resumed"] is True and run["last_step"] == 750


def test_nanogpt_grid_growing_between_ingests(store, tmp_path):
    first = _nanogpt_config(*GRID[0]) + _nanogpt_steps(4.0) + _nanogpt_config(*GRID[1])
    p = write(tmp_path / "grid" / "grid.log", "\n".join(first) + "\n")
    ingest_log(store, p)
    assert len(list_runs(store)) == 1
    with open(p, "a", encoding="utf-8") as fh:     # the second configuration's steps, from 0
        fh.write("\n".join(_nanogpt_steps(3.0)) + "\n")
    assert ingest_log(store, p)[0].status == "appended"
    runs = list_runs(store)
    assert [(r["name"], r["lr"], r["weight_decay"], r["resumed"]) for r in runs] == [
        ("grid", 1e-3, 0.1, False), ("grid#2", 3e-4, 0.0, False)]
    assert points(store, runs[0]["id"], "val/loss") == [(0, 4.1), (250, 3.85), (500, 3.6)]


# -- items 2 and 3: modded-nanogpt code headers -----------------------------------------
TRACK3_CODE = '''import os
import sys
with open(sys.argv[0]) as f:
    code = f.read() # read the code of this file ASAP, for logging
import torch
from torch import nn

class Muon(torch.optim.Optimizer):
    def __init__(self, params, lr=0.02, weight_decay=0, momentum=0.95):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum))

def make_adam(params, lr=0.02, weight_decay=0):
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)

@dataclass
class Hyperparameters:
    seed : int = 7
    num_iterations : int = 3

args = Hyperparameters()
embed_lr = 0.6
muon_lr = 0.05
muon_weight_decay = 0.0125
block_adamw_lr = 0.0015
block_adamw_weight_decay = 0.10
num_trials = int(sys.argv[-1]) if len(sys.argv) > 1 else 1
for _ in range(num_trials):
    embed_params = [model.embed.weight]
    hidden_matrix_params = [p for p in model.blocks.parameters() if p.ndim >= 2]
    adam_groups = [dict(params=embed_params, lr=embed_lr, weight_decay=0.0),
                   dict(params=[model.lm_head.weight], lr=1/320)]
    optimizer1 = torch.optim.Adam(adam_groups, betas=(0.8, 0.95), eps=1e-10, fused=True)
    optimizer2 = Muon(hidden_matrix_params, lr=muon_lr, momentum=0.95, weight_decay=muon_weight_decay)
    for step in range(args.num_iterations + 1):
        print0(f"step:{step}/{args.num_iterations} val_loss:{val_loss:.4f} train_time:{t:.0f}ms")
====================================================================================================
Running PyTorch 2.5.1 compiled for CUDA 12.4 on NVIDIA H100 80GB HBM3 with world_size 8
====================================================================================================
'''


def _modded_steps(iters: int, base: float) -> str:
    lines = [f"step:0/{iters} val_loss:{base:.4f} train_time:0ms step_avg:nanms"]
    for s in range(1, iters + 1):
        lines.append(f"step:{s}/{iters} train_loss:{base - 0.1 * s:.4f} train_time:{s * 100}ms step_avg:100.00ms")
    lines.append(f"step:{iters}/{iters} val_loss:{base - 0.35:.4f} train_time:{iters * 100}ms step_avg:100.00ms")
    lines.append("peak memory allocated: 22 GiB reserved: 24 GiB")
    return "\n".join(lines) + "\n"


def test_code_header_reads_the_optimizer_calls_not_signature_defaults():
    got = header_hyperparameters(TRACK3_CODE)
    assert (got["weight_decay"], got["lr"]) == (0.0125, 0.05)
    assert got["weight_decay_applies_to"] == "Muon(hidden_matrix_params)"
    assert [(g["optimizer"], g["bound_to"], g["params"], g["lr"], g["weight_decay"])
            for g in got["optimizer_groups"]] == [
        ("Adam", "optimizer1", "embed_params", 0.6, 0.0),
        ("Adam", "optimizer1", "[model.lm_head.weight]", 1 / 320, 0.0),      # torch.optim.Adam's default
        ("Muon", "optimizer2", "hidden_matrix_params", 0.05, 0.0125)]
    assert (got["seed"], got["num_iterations"]) == (7, 3)
    assert got["code_assignments"]["block_adamw_weight_decay"] == 0.10


def test_code_header_matrix_group_is_not_a_vector_group_of_the_blocks():
    code = ("import torch\n"
            "opt1 = torch.optim.AdamW([dict(params=[p for p in model.blocks.parameters() if p.ndim < 2], lr=0.01,"
            " weight_decay=0.05), dict(params=[model.lm_head.weight], lr=0.004)], weight_decay=0.0)\n"
            "opt2 = Muon([p for p in model.blocks.parameters() if p.ndim >= 2], lr=0.02, weight_decay=0.01)\n")
    got = header_hyperparameters(code)
    assert (got["lr"], got["weight_decay"]) == (0.02, 0.01)
    assert [g["weight_decay"] for g in got["optimizer_groups"]] == [0.05, 0.0, 0.01]


def test_code_header_optimizer_without_weight_decay_and_a_broken_tail():
    code = ("import torch\nclass MuonH(torch.optim.Optimizer):\n    def __init__(self, params, lr=0.014, mu=0.95):\n"
            "        super().__init__(params, dict(lr=lr, mu=mu))\n"
            "opt = MuonH([p for p in model.blocks.parameters() if p.ndim == 2], lr=0.018)\n"
            "this line is not python (\n")
    got = header_hyperparameters(code)
    assert (got["lr"], got["weight_decay"]) == (0.018, 0.0)   # MuonH applies no weight decay
    unparsable = "import torch\ndef f(lr=0.5, weight_decay=0.3):\n  pass(\nweight_decay = 0.2\nlr = 3e-4\n"
    # the broken line is read as `pass`: the assignments after it count, never the signature's defaults
    assert header_hyperparameters(unparsable) == {"lr": 3e-4, "weight_decay": 0.2,
                                                  "code_assignments": {"lr": 3e-4, "weight_decay": 0.2}}
    deep = "import torch\nx = " + "+".join(["1"] * 20000) + "\nopt = Muon(ps, lr=x, weight_decay=0.1)\n"
    assert header_hyperparameters(deep) == {}       # too deep to parse: nothing read, no crash


def test_modded_track3_records_and_runs_sharing_one_header(store, tmp_path):
    text = TRACK3_CODE + _modded_steps(3, 10.8) + _modded_steps(3, 10.9) + _modded_steps(3, 11.0)
    p = write(tmp_path / "records" / "track_3_optimization" / "0a1b2c.txt", text)
    assert detect_log(p) == "modded_nanogpt"
    ingest_log(store, p)
    runs = list_runs(store)
    assert [r["name"] for r in runs] == ["0a1b2c", "0a1b2c#2", "0a1b2c#3"]
    assert [(r["weight_decay"], r["lr"], r["seed"]) for r in runs] == [(0.0125, 0.05, 7)] * 3
    assert [r["config"]["code_header_of"] for r in runs] == ["#1", "#1", "#1"]
    assert all(len(r["config"]["optimizer_groups"]) == 3 for r in runs)


# -- item 4: Trainer states ------------------------------------------------------------
def _trainer_state(losses: dict[int, float], **extra) -> str:
    hist = [{"step": s, "loss": v, "learning_rate": 1e-4, "epoch": s / 100} for s, v in losses.items()]
    return json.dumps({"log_history": hist, "global_step": max(losses), "logging_steps": 10,
                       "max_steps": 200, "train_batch_size": 8, **extra})


def test_two_trainer_states_in_one_folder_are_two_runs(store, tmp_path):
    d = tmp_path / "results"
    a = write(d / "trainer_state_bert.json", _trainer_state({s: 3.0 - s / 100 for s in range(10, 210, 10)}))
    b = write(d / "trainer_state_gpt.json", _trainer_state({s: 5.0 - s / 100 for s in range(10, 210, 10)}))
    ingest_log(store, a)
    ingest_log(store, b)
    runs = {r["name"]: r for r in list_runs(store)}
    assert set(runs) == {"trainer_state_bert", "trainer_state_gpt"}
    assert [runs[n]["n_points"] for n in sorted(runs)] == [60, 60]
    assert points(store, runs["trainer_state_gpt"]["id"], "train/loss")[0] == (10, 4.9)


def test_trainer_output_dir_and_checkpoint_are_one_run_unless_they_disagree(store, tmp_path):
    out = tmp_path / "out"
    losses = {s: 3.0 - s / 100 for s in range(10, 210, 10)}
    ck = write(out / "checkpoint-100" / "trainer_state.json", _trainer_state({s: losses[s] for s in range(10, 110, 10)}))
    final = write(out / "trainer_state.json", _trainer_state(losses))
    ingest_log(store, ck)
    ingest_log(store, final)
    [run] = list_runs(store)
    assert run["name"] == "out" and run["n_points"] == 60
    # Another training written into the same output dir: its own run.
    other = write(out / "checkpoint-50" / "trainer_state.json",
                  _trainer_state({s: 9.0 - s / 100 for s in range(10, 60, 10)}))
    ingest_log(store, other)
    runs = {r["name"]: r for r in list_runs(store)}
    assert set(runs) == {"out", "out/checkpoint-50"}
    assert points(store, runs["out"]["id"], "train/loss")[:2] == [(10, 2.9), (20, 2.8)]
    assert points(store, runs["out/checkpoint-50"]["id"], "train/loss")[0] == (10, 8.9)


# -- item 5: the last line without a newline --------------------------------------------
LLMC = "s:0 tel:10.97\ns:0 trl:10.96 lr:0.0001 norm:12.5\ns:1 trl:9.81 lr:0.0006 norm:9.1\ns:2 tel:9.2"


def test_finished_log_without_trailing_newline_keeps_its_last_line(store, tmp_path):
    p = _settled(write(tmp_path / "run" / "main.log", LLMC))
    [rep] = ingest_log(store, p)
    assert rep.status == "added" and rep.n_points == 8
    assert rep.reason == "last line has no newline; read, as the file is not being written"
    assert points(store, rep.run_ids[0], "val/loss") == [(0, 10.97), (2, 9.2)]
    # It grows after all: the line is read again whole and replaces what was read of it.
    with open(p, "a", encoding="utf-8") as fh:
        fh.write("5\ns:3 trl:9.0 lr:0.0005 norm:8.0\n")
    [rep] = ingest_log(store, p)
    assert rep.status == "appended"
    [run] = list_runs(store)
    assert run["resumed"] is False
    assert points(store, run["id"], "val/loss") == [(0, 10.97), (2, 9.25)]


def test_log_being_written_keeps_back_its_last_line_until_it_settles(store, tmp_path):
    p = write(tmp_path / "run" / "main.log", LLMC)      # just written: being written
    [rep] = ingest_log(store, p)
    assert rep.n_points == 7 and rep.reason is None
    _settled(p)                                         # same size, no longer changing
    [rep] = ingest_log(store, p)
    assert (rep.status, rep.n_points) == ("appended", 1)
    assert points(store, rep.run_ids[0], "val/loss") == [(0, 10.97), (2, 9.2)]
    assert ingest_log(store, p)[0].status == "unchanged"


@pytest.mark.parametrize("name, text, last", [
    ("metrics.csv", "step,train_loss\n0,3.0\n10,2.5", (10, 2.5)),
    ("train.log", "step 0: train loss 4.0, val loss 4.1\nstep 250: train loss 2.0, val loss 2.1", (250, 2.1)),
    ("log.jsonl", '{"step": 0, "val_loss": 4.0}\n{"step": 5, "val_loss": 3.5}', (5, 3.5)),
])
def test_every_line_format_reads_a_finished_last_line(store, tmp_path, name, text, last):
    p = _settled(write(tmp_path / "run" / name, text))
    [rep] = ingest_log(store, p)
    metric = "train/loss" if name.endswith(".csv") else "val/loss"
    assert points(store, rep.run_ids[0], metric)[-1] == last


# -- item 6: names --------------------------------------------------------------------------
def test_name_encodings_and_ranges():
    assert from_name("lr1em2-wd010") == {"lr": 1e-2, "weight_decay": 0.10}
    assert from_name("gpt_lr3e-4_wd0p1") == {"lr": 3e-4, "weight_decay": 0.1}
    assert [name_number(t) for t in ("6e-4", "1em2", "0p1", "010", "001", "0.03", ".5", "2")] == [
        6e-4, 1e-2, 0.1, 0.1, 0.01, 0.03, 0.5, 2.0]
    notes: list[str] = []
    assert from_name("lr20-wd11", notes) == {}
    assert notes == ["weight_decay 11 read from the name 'lr20-wd11' refused: outside [0, 10]",
                     "lr 20 read from the name 'lr20-wd11' refused: outside (0, 10]"]


def test_content_wins_over_name_and_implausible_values_are_refused(store, tmp_path):
    d = tmp_path / "lr1em2-wd010"
    write(d / "config.json", json.dumps({"weight_decay": 0.05, "learning_rate": 0.01}))
    p = write(d / "metrics.jsonl", '{"step": 0, "train_loss": 3.0}\n')
    ingest_log(store, p)
    [run] = list_runs(store)
    assert (run["lr"], run["weight_decay"]) == (0.01, 0.05)
    assert run["config"]["metadata_sources"] == {"weight_decay": "config.json", "lr": "config.json"}
    assert run["config"]["metadata_notes"] == [
        "the name says weight_decay 0.1, config.json says 0.05: the file's value is kept"]
    d2 = tmp_path / "run-lr1e3"
    write(d2 / "config.json", json.dumps({"weight_decay": -1}))
    p2 = write(d2 / "metrics.jsonl", '{"step": 0, "train_loss": 3.0}\n')
    ingest_log(store, p2)
    run = next(r for r in list_runs(store) if r["name"] == "run-lr1e3")
    assert (run["lr"], run["weight_decay"]) == (None, None)
    assert run["config"]["metadata_notes"] == [
        "weight_decay -1 from config.json refused: outside [0, 10]",
        "lr 1000 read from the name 'run-lr1e3' refused: outside (0, 10]"]


# -- item 10: llm.c lr, TensorBoard folders ----------------------------------------------
def test_llmc_run_gets_its_peak_and_initial_lr(store, tmp_path, capsys):
    lines = ["s:0 tel:10.97"] + [f"s:{s} trl:{10 - s / 10:.2f} lr:{min(s + 1, 5) * 1.2e-4:.6f} norm:1.0"
                                 for s in range(10)]
    p = write(tmp_path / "gpt2_124M" / "main.log", "\n".join(lines) + "\n")
    assert detect_log(p) == "llmc"
    ingest_log(store, p)
    assert main(["runs", "--db", str(store.path), "--json", "--config"]) == 0
    [run] = json.loads(capsys.readouterr().out)
    assert run["lr"] == pytest.approx(6e-4)
    assert (run["config"]["lr_peak"], run["config"]["lr_initial"]) == (pytest.approx(6e-4), pytest.approx(1.2e-4))
    assert run["config"]["metadata_sources"]["lr"] == "logged lr (peak)"


def test_two_event_files_of_one_folder_are_one_run(store, tmp_path):
    from torch.utils.tensorboard import SummaryWriter
    d = tmp_path / "runs" / "GPT8L8H"
    for steps in ((0, 10), (20, 30)):                  # a run resumed into a second event file
        w = SummaryWriter(log_dir=str(d))
        for s in steps:
            w.add_scalar("train/loss", 5.0 - s / 10, s)
        w.close()
        time.sleep(1.1)                                # event file names carry the second
    files = sorted(d.glob("events.out.tfevents.*"))
    assert len(files) == 2
    for f in files:
        ingest_log(store, f)
    [run] = list_runs(store)
    assert run["name"] == "GPT8L8H"
    assert points(store, run["id"], "train/loss") == [(0, 5.0), (10, 4.0), (20, 3.0), (30, 2.0)]


# -- paper B's per-epoch CSVs ----------------------------------------------------
PAPER_B = "epoch,train_loss,val_loss,val_top1,val_top5,epoch_time_sec,lr\n" + "".join(
    f"{e},{6.78 - 0.3 * e:.4f},{6.11 - 0.5 * e:.4f},{0.03 + 0.05 * e:.4f},{0.10 + 0.1 * e:.4f},3335.7,"
    f"{min(e + 1, 5) * 0.000025:.6f}\n" for e in range(8))


@pytest.mark.parametrize("tag, variant, condition", [
    ("QKV", "qkv", "QKV"), ("Q__K_V", "k_eq_v", "Q!=K=V"), ("Q_K_V", "q_eq_k_eq_v_plus", "(Q=K=V)+"),
    ("QVV_3", "k_eq_v", "QVV(3)"), ("Q_K__V", "q_eq_k_plus", "(Q=K!=V)+"),
    ("Q_K_V_noplus", "q_eq_k_eq_v", "Q=K=V"), ("Q_K__V_noplus", "q_eq_k", "Q=K!=V"),
])
def test_paper_b_epoch_csv(store, tmp_path, tag, variant, condition):
    p = write(tmp_path / "checkpoints_imagenet" / f"vit_s16_imagenet_{tag}.csv", PAPER_B)
    assert detect_log(p) == "csv_wide"
    assert paper_b_condition(p.stem) == (variant, condition)
    [rep] = ingest_log(store, p)
    [run] = list_runs(store)
    assert (run["name"], run["variant"], run["first_step"], run["last_step"]) == (p.stem, variant, 0, 7)
    assert (run["config"]["step_axis"], run["config"]["paper_condition"]) == ("epoch", condition)
    assert (run["config"]["task"], run["config"]["metadata_sources"]["task"]) == ("image", "name")  # a ViT
    assert run["lr"] == pytest.approx(0.000125)
    assert run["metrics"] == ["epoch_time_sec", "lr", "train/loss", "val/loss", "val_top1", "val_top5"]
    assert points(store, run["id"], "val_top1")[-1] == (7, pytest.approx(0.38))
    assert direction("val_top1") == "max" and direction("val/loss") == "min"


def test_a_step_column_wins_over_epoch(store, tmp_path):
    p = write(tmp_path / "r" / "log.csv", "epoch,step,train_loss\n0,0,3.0\n0,50,2.0\n1,100,1.5\n")
    ingest_log(store, p)
    [run] = list_runs(store)
    assert (run["last_step"], "step_axis" in run["config"]) == (100, False)
    assert points(store, run["id"], "epoch") == [(0, 0.0), (50, 0.0), (100, 1.0)]


# -- a CSV line too long to read ---------------------------------------------------
def test_over_long_csv_line_fails_the_file_with_one_line(store, tmp_path):
    n = csv_line_bytes() + 10
    p = write(tmp_path / "r" / "metrics_long.csv", "step,loss,note\n0,1.0,a\n1,2.0," + "x" * n + "\n2,3.0,b\n")
    with pytest.raises(LogFormatError) as e:
        ingest_log(store, p)
    assert str(e.value) == (f"{p}: line 3 is {n + 6:,} bytes long, over the {csv_line_bytes():,}-byte "
                            "limit for one CSV line (QKVSCOPE_CSV_LINE_BYTES; set it in the environment to raise "
                            "it); the file is refused, not read without that line")
    assert count_points(store) == 0


@pytest.mark.parametrize("length", [199_999, 200_000, 200_001])
@pytest.mark.parametrize("last", [False, True])
def test_line_limit_is_exact_past_the_quick_scan(tmp_path, monkeypatch, length, last):
    # 200,000-byte limit: blocks of 100,000 bytes. A line of 199,999 bytes or more
    # holds a whole block without a newline, so the exact scan decides; last: the
    # line ends the data, with no newline after it.
    monkeypatch.setenv("QKVSCOPE_CSV_LINE_BYTES", "200000")
    long_line = b"x" * length
    data = b"step,note\n" + b"0," + b"a" * 150_000 + b"\n" + long_line + (b"" if last else b"\n1,b\n")
    line = 3
    assert _quick_scan(data, len(data), 200_000) is None
    if length > 200_000:
        with pytest.raises(LogFormatError, match=f"line {line} is {length:,} bytes long, over the 200,000-byte"):
            scan_bytes(tmp_path / "f.csv", data)
    else:
        assert scan_bytes(tmp_path / "f.csv", data) is True


def test_quick_scan_answers_short_lines_and_non_ascii(tmp_path, monkeypatch):
    monkeypatch.setenv("QKVSCOPE_CSV_LINE_BYTES", "200000")
    rows = b"".join(b"%d,%d.5\n" % (i, i) for i in range(40_000))     # 40,000 lines, ~400 KB
    ascii_data = b"step,loss\n" + rows
    accented = b"step,lo\xc3\x9fs\n" + rows
    assert _quick_scan(ascii_data, len(ascii_data), 200_000) is True
    assert _quick_scan(accented, len(accented), 200_000) is False
    assert scan_bytes(tmp_path / "f.csv", accented) is False
    assert _quick_scan(ascii_data, len(ascii_data), 100) is None     # blocks under 64 KiB: the exact scan


def test_over_long_line_in_an_appended_tail(store, tmp_path, monkeypatch):
    monkeypatch.setenv("QKVSCOPE_CSV_LINE_BYTES", "100")
    p = write(tmp_path / "r" / "metrics_grow.csv", "step,loss,note\n0,1.0,a\n")
    ingest_log(store, p)
    with open(p, "a", encoding="utf-8") as fh:
        fh.write("1,2.0,b\n2,3.0," + "y" * 200 + "\n")
    with pytest.raises(LogFormatError, match=r"line 2 is 206 bytes long, over the 100-byte limit"):
        ingest_log(store, p)
    assert count_points(store) == 1
