"""Other people's logs read as a person counts them by hand: runs, rows kept,
names, lr and weight decay (real files in ``samples/``, see its SOURCES.md;
where a licence does not allow a copy, the file is built here with the
structure of the public one, named in the test)."""
from __future__ import annotations

import collections
import csv
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from loaders.errors import LogFormatError
from loaders.logs import detect_log, ingest_log, list_runs
from tests.loaders.logs.helpers import points, write

SAMPLES = Path(__file__).parent / "samples"


# -- a long CSV whose other columns name runs ------------------------------------------------------
def test_paper_b_synthetic_loss_curves_are_thirty_runs(store):
    p = SAMPLES / "paper_b" / "synthetic_loss_curves.csv"      # task,variant,step,loss_mean
    assert detect_log(p) == "csv_wide"
    [rep] = ingest_log(store, p)
    runs = list_runs(store)
    # 5 tasks x 6 variants, 20 steps each (the trimmed copy: steps 0-19), every row kept
    assert (len(runs), rep.n_points, rep.reason) == (30, 600, None)
    assert [r["n_points"] for r in runs] == [20] * 30
    assert {r["resumed"] for r in runs} == {False}
    assert [r["name"] for r in runs[:6]] == [
        "task=REVERSE variant=QKV", "task=REVERSE variant=Q=K!=V", "task=REVERSE variant=(Q=K!=V)+",
        "task=REVERSE variant=Q!=K=V", "task=REVERSE variant=Q=K=V", "task=REVERSE variant=(Q=K=V)+"]
    assert [r["variant"] for r in runs[:6]] == ["qkv", "q_eq_k", "q_eq_k_plus", "k_eq_v", "q_eq_k_eq_v",
                                                  "q_eq_k_eq_v_plus"]
    assert {r["name"].split()[0] for r in runs} == {f"task={t}" for t in ("REVERSE", "SORT", "COPY", "SWAP", "SUB")}
    copy_qkv = next(r for r in runs if r["name"] == "task=COPY variant=QKV")
    assert copy_qkv["metrics"] == ["loss_mean"]
    assert copy_qkv["config"]["run_columns"] == {"task": "COPY", "variant": "QKV"}
    assert points(store, copy_qkv["id"], "loss_mean")[-2:] == [(18, 2.20312), (19, 2.1774)]
    last = next(r for r in runs if r["name"] == "task=SWAP variant=(Q=K=V)+")
    assert points(store, last["id"], "loss_mean")[-1] == (19, 2.35202)
    assert ingest_log(store, p)[0].status == "unchanged"


def test_long_csv_extra_columns_split_runs_and_appends_find_their_run(store, tmp_path):
    p = write(tmp_path / "r" / "sweep.csv", "seed,step,metric,value,wall_time\n"
              "1,0,train_loss,3.0,2026-01-01T00:00:00\n2,0,train_loss,3.5,2026-01-01T00:00:01\n"
              "1,1,train_loss,2.0,2026-01-01T00:00:02\n")
    [rep] = ingest_log(store, p)
    assert [r["name"] for r in list_runs(store)] == ["seed=1", "seed=2"]
    with open(p, "a") as fh:
        fh.write("2,1,train_loss,2.5,2026-01-01T00:00:03\n3,0,train_loss,n/a,2026-01-01T00:00:04\n")
    [rep] = ingest_log(store, p)
    assert (rep.status, rep.n_points, rep.reason) == ("appended", 1, "1 cell not a number: n/a")
    runs = list_runs(store)
    assert [(r["name"], r["seed"], r["n_points"]) for r in runs] == [("seed=1", 1, 2), ("seed=2", 2, 2),
                                                                       ("seed=3", 3, 0)]
    assert points(store, runs[1]["id"], "train/loss") == [(0, 3.5), (1, 2.5)]


# -- cells that are not numbers ----------------------------------------------------------------------
def _keras_csv_logger(path: Path, epochs: int, *, windows: bool) -> Path:
    """A Keras ``CSVLogger`` file as keras/src/callbacks/csv_logger.py writes it
    (keras-team/keras @ 3ebe943): sorted keys after ``epoch``, ``NA`` for a
    metric the epoch did not log (validation every second epoch:
    ``validation_freq=2``), ``csv.DictWriter`` with the excel dialect into a
    text-mode file, which on Windows turns each row's ``\\r\\n`` into ``\\r\\r\\n``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = ["accuracy", "loss", "val_accuracy", "val_loss"]
    with open(path, "w", newline="\r\n" if windows else None) as f:
        w = csv.DictWriter(f, fieldnames=["epoch"] + keys, dialect=csv.excel)
        w.writeheader()
        for e in range(epochs):
            logs = {"accuracy": 0.5 + e / 10, "loss": 1.0 - e / 10}
            if e % 2 == 1:
                logs.update(val_accuracy=0.45 + e / 10, val_loss=1.1 - e / 10)
            w.writerow(collections.OrderedDict({"epoch": e, **{k: logs.get(k, "NA") for k in keys}}))
    return path


@pytest.mark.parametrize("windows", [False, True])
def test_keras_csv_logger_na_cells_are_counted_and_windows_line_ends_read(store, tmp_path, windows):
    p = _keras_csv_logger(tmp_path / "run" / "training.log", 4, windows=windows)
    assert (b"\r\r\n" in p.read_bytes()) == windows
    assert detect_log(p) == "csv_wide"
    [rep] = ingest_log(store, p)
    # 4 epochs x 2 train metrics + 2 epochs x 2 val metrics; 2 epochs x 2 NA cells
    assert (rep.status, rep.n_points, rep.reason) == ("added", 12, "4 cells not numbers: NA")
    [run] = list_runs(store)
    assert (run["name"], run["config"]["step_axis"]) == ("run", "epoch")
    assert run["metrics"] == ["accuracy", "train/loss", "val/accuracy", "val/loss"]
    assert points(store, run["id"], "val/loss") == [(1, 1.0), (3, pytest.approx(0.8))]
    assert points(store, run["id"], "train/loss")[-1] == (3, pytest.approx(0.7))


def test_windows_line_ends_in_a_grown_log(store, tmp_path):
    p = write(tmp_path / "r" / "log.csv", "")
    p.write_bytes(b"epoch,loss\r\r\n0,1.0\r\r\n")
    ingest_log(store, p)
    with open(p, "ab") as fh:
        fh.write(b"1,0.5\r\r\n")
    [rep] = ingest_log(store, p)
    assert (rep.status, rep.n_points) == ("appended", 1)
    [run] = list_runs(store)
    assert points(store, run["id"], "train/loss") == [(0, 1.0), (1, 0.5)]


def test_a_csv_with_no_number_to_store_is_an_error_with_the_reason(store, tmp_path):
    p = write(tmp_path / "r" / "log.csv", "step,val_loss,val_acc\n0,n/a,n/a\n1,-,n/a\n")
    with pytest.raises(LogFormatError) as err:
        ingest_log(store, p)
    assert str(err.value) == (f"{p}: expected numbers in its metric columns, found none to store: "
                              "4 cells not numbers: n/a, -")
    assert list_runs(store) == []


# -- Lightning's _step / _epoch names ----------------------------------------------------------------
# The first two epochs of 0Xero7/slm_training lightning_logs/version_0/metrics.csv and its
# hparams.yaml (@ d4575f90030ef6839b1717d96ea4dbc355b4b7e6; no licence, so written out here
# with the file's exact header, row layout and values): a language model logged with
# self.log(..., on_step=True, on_epoch=True) every 50 steps, validated at each epoch's end.
SLM_METRICS = """\
epoch,epoch_time,step,train_epoch_perplexity,train_loss_epoch,train_loss_step,train_perplexity_epoch,train_perplexity_step,val_epoch_perplexity,val_loss,val_perplexity
0,,49,,,8.620475769042969,,5544.0234375,,,
0,,99,,,7.601476669311523,,2001.1488037109375,,,
0,,149,,,7.221154689788818,,1368.06787109375,,,
0,,199,,,6.983570575714111,,1078.7633056640625,,,
0,,249,,,6.828794956207275,,924.0765991210938,,,
0,,286,,,,,,928.60546875,6.833683967590332,935.6399536132812
0,155.4527130126953,286,2080.531982421875,7.640378952026367,,3753.686279296875,,,,
1,,299,,,6.816020488739014,,912.3470458984375,,,
1,,349,,,6.732990741729736,,839.6547241210938,,,
1,,399,,,6.626404285430908,,754.763427734375,,,
1,,449,,,6.621363639831543,,750.968505859375,,,
1,,499,,,6.484894752502441,,655.1699829101562,,,
1,,549,,,6.578193664550781,,719.239013671875,,,
1,,573,,,,,,644.2499389648438,6.4680867195129395,649.3938598632812
1,37.71946334838867,573,745.6710205078125,6.614284515380859,,750.7208862304688,,,,
"""
SLM_HPARAMS = """\
d_model: 492
dropout: 0.260558688084297
ff_hidden: 2048
lr: 5.3438960475985955e-05
max_seq_len: 128
num_epochs: 20
num_layers: 12
use_experimental: true
vocab_size: 50258
weight_decay: 0.00012301490356963837
"""


def test_lightning_step_and_epoch_names_are_normalised_apart(store, tmp_path):
    d = tmp_path / "lightning_logs" / "version_0"
    write(d / "hparams.yaml", SLM_HPARAMS)
    p = write(d / "metrics.csv", SLM_METRICS)
    assert detect_log(p) == "lightning"
    [rep] = ingest_log(store, d)
    [run] = list_runs(store)
    assert run["metrics"] == ["epoch", "epoch_time", "train/loss", "train/loss_epoch", "train_epoch_perplexity",
                              "train_perplexity_epoch", "train_perplexity_step", "val/loss",
                              "val_epoch_perplexity", "val_perplexity"]
    # the per-step loss every 50 steps, the epoch means at each epoch's last step, apart
    assert points(store, run["id"], "train/loss") == [
        (49, 8.620475769042969), (99, 7.601476669311523), (149, 7.221154689788818), (199, 6.983570575714111),
        (249, 6.828794956207275), (299, 6.816020488739014), (349, 6.732990741729736),
        (399, 6.626404285430908), (449, 6.621363639831543), (499, 6.484894752502441),
        (549, 6.578193664550781)]
    assert points(store, run["id"], "train/loss_epoch") == [(286, 7.640378952026367), (573, 6.614284515380859)]
    assert points(store, run["id"], "val/loss") == [(286, 6.833683967590332), (573, 6.4680867195129395)]
    assert (run["lr"], run["weight_decay"]) == (5.3438960475985955e-05, 0.00012301490356963837)
    assert rep.reason is None


# -- paper B's ViT ImageNet CSVs are image runs ------------------------------------------------------
def test_paper_b_vit_csv_is_an_image_run_without_perplexity(store, tmp_path):
    from analysis.results_table import results_table
    from loaders.run_table import run_table
    # checkpoints_imagenet/vit_s16_imagenet_<tag>.csv as paper B's imagenet_experiment.py writes them
    # (the header of the issue and DESIGN.md; the repository's snapshot here holds none to copy)
    head = "epoch,train_loss,val_loss,val_top1,val_top5,epoch_time_sec,lr\n"
    vit = write(tmp_path / "checkpoints_imagenet" / "vit_s16_imagenet_QKV.csv",
                head + "0,6.78,6.11,0.03,0.10,3335.7,0.000025\n1,6.48,5.61,0.08,0.20,3335.1,0.00005\n")
    lm = write(tmp_path / "lm" / "log.csv", "step,train_loss,val_loss\n0,10.0,10.1\n100,4.0,4.5\n")
    ingest_log(store, vit)
    ingest_log(store, lm)
    table = run_table(store)
    assert list(zip(table["name"], table["task"])) == [("vit_s16_imagenet_QKV", "image"), ("lm", "language")]
    values = pd.DataFrame([{"run_id": int(i), "metric": "val/loss", "final": f, "min": f, "max": f}
                           for i, f in zip(table["id"], (5.61, 4.5))])
    res = results_table(table, values, ["val/loss"], perplexity=True).set_index("task")
    assert res.loc["language", "exp(val/loss) mean"] == pytest.approx(math.exp(4.5))
    assert math.isnan(res.loc["image", "exp(val/loss) mean"])


# -- modded-nanogpt: a weight decay set by a class default in the logged code -------------------------
@pytest.mark.parametrize("name, lr, steps, last, val0", [
    # Muon(hidden_matrix_params, lr=0.025, momentum=0.95, rank=rank, world_size=world_size) passes no
    # weight decay; the logged class Muon has def __init__(self, params, lr=0.02, weight_decay=0.01, ...)
    ("wd_medium_b01743db.txt", 0.025, 29, (28, 219.71), 10.8258),
    # the same, in a script with a Python 3.12 f-string (print0(f"...{metadata_fn().get("filename", ...)}"))
    # 170 lines before its optimizers: that line is read as `pass`, not the end of the code
    ("record8_medium_640429f2.txt", 0.025, 11, (10, 205.39), 10.825837),
])
def test_modded_weight_decay_from_the_class_default_in_the_code(store, tmp_path, name, lr, steps, last, val0):
    p = tmp_path / "records" / name
    p.parent.mkdir()
    shutil.copy(SAMPLES / "modded_nanogpt" / name, p)
    assert detect_log(p) == "modded_nanogpt"
    ingest_log(store, p)
    [run] = list_runs(store)
    assert (run["weight_decay"], run["lr"]) == (0.01, lr)
    assert run["config"]["weight_decay_from"] == "default of Muon.__init__ in the logged code"
    assert run["config"]["weight_decay_applies_to"] == "Muon(hidden_matrix_params)"
    assert run["config"]["metadata_sources"]["weight_decay"] == "log"
    assert (run["first_step"], run["last_step"]) == (0, steps - 1)
    assert points(store, run["id"], "step_avg_ms")[-1] == last
    assert points(store, run["id"], "val/loss") == [(0, val0)]


def test_torch_optim_defaults_and_a_class_without_a_default():
    from loaders.logs.codeheader import header_hyperparameters
    code = ("import torch\n"
            "class Muon(torch.optim.Optimizer):\n"
            "    def __init__(self, params, lr=0.02, weight_decay=None):\n        pass\n"
            "optimizer1 = torch.optim.AdamW(embed_params, lr=0.3)\n"
            "optimizer2 = Muon(hidden_matrix_params, lr=0.05)\n")
    got = header_hyperparameters(code)
    assert [(g["optimizer"], g["weight_decay"], g.get("weight_decay_from")) for g in got["optimizer_groups"]] == [
        ("AdamW", 0.01, "torch.optim.AdamW's default"), ("Muon", None, None)]
    assert "weight_decay" not in got and got["lr"] == 0.05


# -- nanoGPT grid stdout: runs named by their printout ------------------------------------------------
# The structure of cjackson692/Group1_NanoGPT all_outputs.txt (@ 2c82f8a11b4410b4a4b8bc1b4780579059f9705d;
# no licence, so written out here with its lines, the runs shortened to steps 0 and 250): Colab's
# truncation notice and the tail of a run whose printout was cut off, then one printout per grid run
# (train_shakespeare_char.py echoed, the grid's Overriding: lines, wandb's lines) and its steps.
_SHAKESPEARE_CHAR = """\
Overriding config with config/train_shakespeare_char.py:
# train a miniature character-level shakespeare model
# good for debugging and playing on macbooks and such

out_dir = 'out-shakespeare-char'
eval_interval = 250 # keep frequent because we'll overfit
eval_iters = 200
log_interval = 10 # don't print too too often

# we expect to overfit on this small dataset, so only save when val improves
always_save_checkpoint = False

wandb_log = False # override via command line if you like
wandb_project = 'shakespeare-char'
wandb_run_name = 'mini-gpt'

dataset = 'shakespeare_char'
gradient_accumulation_steps = 1
batch_size = 64
block_size = 256 # context of up to 256 previous characters

# baby GPT model :)
n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2

learning_rate = 1e-3 # with baby networks can afford to go a bit higher
max_iters = 5000
lr_decay_iters = 5000 # make equal to max_iters usually
min_lr = 1e-4 # learning_rate / 10 usually
beta2 = 0.99 # make a bit bigger because number of tokens per iter is small

warmup_iters = 100 # not super necessary potentially

# on macbook also add
# device = 'cpu'  # run on cpu only
# compile = False # do not torch compile the model

"""


def _grid_run(batch: int, dropout: float, losses: tuple, wandb_id: str) -> str:
    tag = f"block_size128_n_layer6_n_head8_n_embd128_batch_size{batch}_max_iters1000_dropout{dropout}"
    over = ["compile = False", "eval_iters = 20", "log_interval = 5", "device = cuda", "lr_decay_iters = 1000",
            "block_size = 128", "n_layer = 6", "n_head = 8", "n_embd = 128", f"batch_size = {batch}",
            "max_iters = 1000", f"dropout = {dropout}", f"out_dir = out/{tag}", "wandb_log = True",
            "wandb_project = owt", f"wandb_run_name = run_{tag}"]
    return (_SHAKESPEARE_CHAR + "".join(f"Overriding: {o}\n" for o in over) +
            f"tokens per iteration will be: {batch * 128:,}\n"
            "found vocab_size = 65 (inside data/shakespeare_char/meta.pkl)\n"
            "Initializing a new model from scratch\nnumber of parameters: 1.19M\n"
            "using fused AdamW: True\n"
            f"wandb: Syncing run run_{tag}\n"
            f"step 0: train loss {losses[0]:.4f}, val loss {losses[1]:.4f}\n"
            f"iter 0: loss {losses[2]:.4f}, time 946.68ms, mfu -100.00%\n"
            f"iter 5: loss {losses[3]:.4f}, time 24.45ms, mfu 0.22%\n"
            f"step 250: train loss {losses[4]:.4f}, val loss {losses[5]:.4f}\n"
            f"saving checkpoint to out/{tag}\n"
            f"iter 250: loss {losses[6]:.4f}, time 368.95ms, mfu 0.26%\n"
            f"wandb: 🚀 View run run_{tag} at: \nwandb: Find logs at: wandb/run-20251024_{wandb_id}/logs\n")


def test_nanogpt_grid_runs_are_named_by_their_printout(store, tmp_path):
    text = ("Streaming output truncated to the last 5000 lines.\n"
            "step 500: train loss 2.4262, val loss 2.4279\n"
            "saving checkpoint to out/block_size128_n_layer6_n_head8_n_embd128_batch_size8_max_iters2000_dropout0.2\n"
            "iter 500: loss 2.4267, time 414.19ms, mfu 0.14%\n"
            "wandb: Find logs at: wandb/run-20251024_005251-ii2rl3da/logs\n"
            + _grid_run(16, 0.1, (4.1954, 4.1906, 4.1939, 3.9568, 2.4342, 2.4260, 2.4230), "005339-8kxjewdd")
            + _grid_run(16, 0.2, (4.1950, 4.1912, 4.1935, 3.9601, 2.4402, 2.4311, 2.4290), "005512-3x9k2m1a")
            + _grid_run(16, 0.2, (4.1951, 4.1913, 4.1936, 3.9602, 2.4403, 2.4312, 2.4291), "005640-7q1w2e3r"))
    p = write(tmp_path / "Group1_NanoGPT" / "all_outputs.txt", text)
    assert detect_log(p) == "nanogpt"
    ingest_log(store, p)
    runs = list_runs(store)
    tag = "block_size128_n_layer6_n_head8_n_embd128_batch_size16_max_iters1000_dropout"
    # the cut-off run has no printout: the file's name; the grid's runs: their wandb_run_name,
    # a repeated one with its run number
    assert [r["name"] for r in runs] == ["all_outputs", f"run_{tag}0.1", f"run_{tag}0.2", f"run_{tag}0.2#4"]
    assert [r["n_points"] for r in runs] == [5, 13, 13, 13]     # 2 per eval line, 3 per iter line
    assert [(r["config"].get("out_dir"), r["config"].get("dropout")) for r in runs[1:]] == [
        (f"out/{tag}0.1", 0.1), (f"out/{tag}0.2", 0.2), (f"out/{tag}0.2", 0.2)]
    assert points(store, runs[1]["id"], "val/loss") == [(0, 4.1906), (250, 2.426)]
    assert [r["lr"] for r in runs[1:]] == [1e-3, 1e-3, 1e-3]


def test_nanogpt_run_named_by_its_out_dir_keeps_its_name_when_the_log_grows(store, tmp_path):
    head = ("Overriding: out_dir = out/lr3e-4\nstep 0: train loss 4.0000, val loss 4.1000\n"
            "iter 0: loss 4.0000, time 50.00ms, mfu -100.00%\n")
    p = write(tmp_path / "sweep" / "stdout.log", head)
    ingest_log(store, p)
    with open(p, "a") as fh:
        fh.write("iter 5: loss 3.5000, time 50.00ms, mfu 1.00%\nOverriding: out_dir = out/lr1e-3\n"
                 "step 0: train loss 4.2000, val loss 4.3000\n")
    ingest_log(store, p)
    runs = list_runs(store)
    assert [(r["name"], r["lr"], r["n_points"]) for r in runs] == [("lr3e-4", 3e-4, 8), ("lr1e-3", 1e-3, 2)]


def test_the_ingest_report_line_names_the_cells_that_are_not_numbers(tmp_path, capsys):
    from app.cli import main
    p = _keras_csv_logger(tmp_path / "run" / "training.log", 4, windows=True)
    assert main(["ingest", str(p), "--db", str(tmp_path / "db.duckdb")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"added     csv_wide           {p}, 12 points (4 cells not numbers: NA)",
                   "1 added, 0 appended, 0 unchanged, 0 skipped, 0 errors"]


def test_a_blank_wide_cell_is_an_empty_one_a_blank_long_value_is_counted(store, tmp_path):
    wide = write(tmp_path / "a" / "log.csv", "step,loss,lr\n0, ,0.1\n1,2.0,\n")
    [rep] = ingest_log(store, wide)
    assert (rep.n_points, rep.reason) == (2, None)       # lr at 0, loss at 1
    long = write(tmp_path / "b" / "log.csv", "step,metric,value\n0,loss, \n1,loss,2.0\n")
    [rep] = ingest_log(store, long)
    assert (rep.n_points, rep.reason) == (1, "1 cell not a number: ' '")
