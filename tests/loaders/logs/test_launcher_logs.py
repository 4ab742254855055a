"""Launchers' stdout and result files: the Hugging Face Trainer's printed
dicts and its *_results.json, Megatron-LM, DeepSpeed, fairseq, torchtune's
DiskLogger and lm-eval-harness results (``realworld/SOURCES.md`` names each file's source)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loaders.errors import LogFormatError
from loaders.logs import detect_log, ingest_log, list_runs
from tests.loaders.logs.helpers import points, write

REAL = Path(__file__).parent / "realworld"


def _run(store, name=None):
    runs = list_runs(store)
    return runs[0] if name is None else next(r for r in runs if r["name"] == name)


# --- Hugging Face Trainer stdout -------------------------------------------------------------

def test_hf_stdout_of_accelerate_lora_run(store):
    """accelerate + TRL, two ranks, tqdm bars on one line: the bar tqdm redraws
    under each dict gives its step (logging every 10 steps)."""
    p = REAL / "hf_stdout" / "train.log"
    assert detect_log(p) == "hf_stdout"
    [rep] = ingest_log(store, p)
    run = _run(store)
    assert points(store, run["id"], "train/loss") == [(10, 1.5618), (20, 1.2588), (30, 1.233)]
    assert points(store, run["id"], "lr") == [(10, 9.981458590852905e-05), (20, 9.960857025133911e-05),
                                              (30, 9.940255459414915e-05)]
    assert [s for s, _ in points(store, run["id"], "mean_token_accuracy")] == [10, 20, 30]
    # The dict cut off when the job was killed is counted on the report line, not dropped silently.
    assert rep.reason == ("1 Trainer-dict line not read (first: line 13 "
                          "\"{'loss': 1.2277, 'grad_norm': 0.23195728659629822, 'learning_r\")")
    # the log prints no TrainingArguments: its lr is the highest logged value, and the run says so
    assert run["config"]["metadata_notes"] == [
        "steps of 3 train dicts: the training progress bar tqdm redraws under the dict",
        "lr 9.98146e-05 is the highest lr the log shows (the schedule's value at a logged step, after warmup "
        "or decay): no config beside the log states the configured lr"]


def test_hf_stdout_written_by_transformers(store):
    """The stdout transformers 5.25's Trainer wrote (values printed as strings,
    TrainingArguments printed): steps, eval steps and hyperparameters as its
    trainer_state.json has them."""
    p = REAL / "hf_stdout" / "transformers-5.25-trainer.log"
    assert detect_log(p) == "hf_stdout"
    ingest_log(store, p)
    run = _run(store)
    state = json.loads((REAL / "hf_results" / "tiny-run" / "trainer_state.json").read_text())
    hist = state["log_history"]
    assert [s for s, _ in points(store, run["id"], "train/loss")] == [e["step"] for e in hist if "loss" in e]
    assert points(store, run["id"], "train/loss") == [(2, 3.249), (4, 3.257), (6, 3.222)]
    assert points(store, run["id"], "val/loss") == [(3, 3.227), (6, 3.222)]
    assert points(store, run["id"], "train_loss") == [(6, 3.243)]         # the summary keeps its name
    assert (run["lr"], run["weight_decay"], run["seed"], run["model_size"]) == (0.001, 0.05, 7, 4080)
    assert run["config"]["logging_steps"] == 2 and run["config"]["total_optimization_steps"] == 6


def test_hf_stdout_steps_without_a_bar(store, tmp_path):
    """No bar after the dicts: logging_steps from the printed arguments, evals
    at the train step before them, the summary at max_steps; a cut dict still
    takes its logging step."""
    p = write(tmp_path / "run-a" / "stdout.txt", "\n".join([
        "TrainingArguments(", "learning_rate=5e-05,", "logging_steps=10,", "max_steps=40,", "seed=3,", ")",
        "[rank0]: {'loss': 2.31, 'learning_rate': 4.9e-05, 'epoch': 0.33}",
        "[rank0]: {'eval_loss': 2.2, 'eval_runtime': 1.0, 'epoch': 0.33}",
        "[rank0]: {'loss': 2.1, 'learning_rate': 3e-05, 'epo",
        "[rank0]: {'loss': 2.0, 'learning_rate': 2e-05, 'epoch': 0.66}",
        "[rank0]: {'train_runtime': 10.5, 'train_loss': 2.2, 'epoch': 1.0}", ""]))
    [rep] = ingest_log(store, p)
    run = _run(store)
    assert points(store, run["id"], "train/loss") == [(10, 2.31), (30, 2.0)]
    assert points(store, run["id"], "val/loss") == [(10, 2.2)]
    assert points(store, run["id"], "train_runtime") == [(40, 10.5)]
    assert run["config"]["metadata_notes"] == [
        "steps of 2 train dicts: logging_steps=10 x the train dict's ordinal",
        "steps of 1 eval dicts: the step of the train dict before it",
        "steps of 1 summary dicts: max_steps / the total optimization steps"]
    assert rep.reason == "1 Trainer-dict line not read (first: line 9 \"{'loss': 2.1, 'learning_rate': 3e-05, 'epo\")"
    assert (run["lr"], run["seed"]) == (5e-05, 3)


def test_hf_stdout_ordinal_steps_and_errors(store, tmp_path):
    p = write(tmp_path / "o" / "log.txt", "{'loss': 1.0, 'epoch': 0.1}\n{'loss': 0.9, 'epoch': 0.2}\n")
    ingest_log(store, p)
    run = _run(store)
    assert points(store, run["id"], "train/loss") == [(1, 1.0), (2, 0.9)]
    assert run["config"]["metadata_notes"] == [
        "steps of 2 train dicts: the train dict's ordinal (1, 2, ...): no step, bar or logging_steps printed"]
    bad = write(tmp_path / "b" / "log.txt", "{'loss': 1.0, 'epoch': 0.1}\n{'loss': 0.9, 'ep\n")
    bad.write_text("x {'loss': 1.0, 'ep\n{'eval_loss': nan_value}\n")
    with pytest.raises(LogFormatError) as e:
        ingest_log(store, bad, format="hf_stdout")
    assert str(e.value) == (f"{bad}: expected Trainer log dicts ({{'loss': ..., 'learning_rate': ...}}), "
                            "found 2 such lines none of which parses (first: line 1 \"{'loss': 1.0, 'ep\")")


@pytest.mark.slow
def test_hf_stdout_of_a_live_trainer(store, tmp_path):
    """Run the Trainer, keep what it printed: the reader's steps are its trainer_state's."""
    script = (REAL / "hf_stdout" / "make_trainer_log.py")
    out = tmp_path / "hf-run"
    log = tmp_path / "hf-run.log"
    with open(log, "w") as fh:
        subprocess.run([sys.executable, str(script), str(out)], stdout=fh, stderr=subprocess.STDOUT, check=True)
    assert detect_log(log) == "hf_stdout"
    ingest_log(store, log)
    run = _run(store)
    hist = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert [s for s, _ in points(store, run["id"], "train/loss")] == [e["step"] for e in hist if "loss" in e]
    assert [s for s, _ in points(store, run["id"], "val/loss")] == sorted(
        {e["step"] for e in hist if "eval_loss" in e})


# --- Hugging Face *_results.json -------------------------------------------------------------

def test_hf_results_join_the_trainer_state_run(store, tmp_path):
    d = tmp_path / "tiny-run"
    shutil.copytree(REAL / "hf_results" / "tiny-run", d)
    for name in ("all_results.json", "eval_results.json", "train_results.json"):
        assert detect_log(d / name) == "hf_results"
        ingest_log(store, d / name)
    ingest_log(store, d / "trainer_state.json")
    [run] = list_runs(store)                  # one training, one run, named after its output dir
    assert (run["name"], run["format"]) == ("tiny-run", "hf_trainer")
    assert points(store, run["id"], "total_flos") == [(6, 7630848.0)]        # at the state's global_step
    assert points(store, run["id"], "train_loss") == [(6, 3.2428592840830484)]
    assert points(store, run["id"], "val/loss")[-1] == (6, 3.2217538356781006)
    assert [s for s, _ in points(store, run["id"], "train/loss")] == [2, 4, 6]


def test_hf_results_of_transformers_repo(store, tmp_path):
    """The all_results.json committed in huggingface/transformers: no trainer
    state beside it, so its metrics are at step 0 and a note says why."""
    p = REAL / "hf_results" / "transformers" / "all_results.json"
    assert detect_log(p) == "hf_results"
    ingest_log(store, p)
    run = _run(store)
    assert run["name"] == "transformers"
    assert sorted(run["metrics"]) == ["epoch", "eval_bleu", "eval_gen_len", "test_bleu", "test_gen_len",
                                      "test_loss", "total_flos", "val/loss"]
    assert points(store, run["id"], "val/loss") == [(0, 596.380859375)]
    assert points(store, run["id"], "test_loss") == [(0, 572.8933715820312)]
    assert run["config"]["metadata_notes"] == [
        "all_results.json: no trainer_state.json beside it gives the final step; its metrics are stored at step 0"]


def test_hf_results_refusals(store, tmp_path):
    other = write(tmp_path / "eval_results.json", '{"faithfulness": 0.9, "answer": "yes"}')
    assert detect_log(other) is None         # a RAG tool's eval_results.json is no Trainer file
    bad = write(tmp_path / "x" / "all_results.json", '{"eval_loss": "n/a"}')
    with pytest.raises(LogFormatError) as e:
        ingest_log(store, bad, format="hf_results")
    assert str(e.value) == f"{bad}: expected numeric final metrics, found none (keys ['eval_loss'])"


# --- Megatron-LM -------------------------------------------------------------------------------

def test_megatron_llama_run(store):
    p = REAL / "megatron" / "llama2-3.5b-tp1-pp4.log"
    assert detect_log(p) == "megatron"
    [rep] = ingest_log(store, p)
    run = _run(store)
    assert points(store, run["id"], "train/loss") == [(1, 10.43863), (2, 10.44022), (3, 10.44375), (4, 10.44319),
                                                      (5, 10.43448)]
    assert points(store, run["id"], "lr")[:2] == [(1, 6.976744e-08), (2, 1.395349e-07)]
    assert points(store, run["id"], "grad_norm")[0] == (1, 26.203)
    assert points(store, run["id"], "elapsed_time_per_iteration_ms")[0] == (1, 19138.8)
    assert points(store, run["id"], "val/loss") == [(4, 10.41297)]
    assert points(store, run["id"], "val/ppl") == [(4, 33254.12)]
    # The closing test evaluation is at the last iteration printed (6, whose own line was cut).
    assert points(store, run["id"], "test/loss") == [(6, 10.3912)]
    assert rep.reason == ("1 Megatron iteration/validation line not read (first: line 46 '[2025-08-01 07:19:42] "
                          "iteration        6/    5000 | consumed samples:          768 | elapsed time per "
                          "iteration (ms): 13')")
    # From the arguments block; the model size sums the four pipeline ranks' parameter counts.
    assert (run["lr"], run["weight_decay"], run["seed"]) == (3e-05, 0.1, 1234)
    assert run["model_size"] == 809619456 * 2 + 940605440 + 940609536
    assert (run["config"]["num_layers"], run["config"]["hidden_size"], run["config"]["num_attention_heads"]) == \
        (16, 4096, 32)


def test_megatron_deepspeed_tokens_and_growth(store, tmp_path):
    """Megatron-DeepSpeed prints consumed tokens: the points' token count. A
    log that grows is read from where the last read stopped."""
    line = (" iteration {i:>8}/  317892 | consumed samples: {s:>12} | consumed tokens: {t:>12} | elapsed time "
            "per iteration (ms): 25849.1 | learning rate: 3.000E-04 | global batch size:    96 | lm loss: "
            "{loss} | loss scale: 1.0 | actual seqlen:  4096 | number of skipped iterations:   0 |\n")
    p = write(tmp_path / "ds" / "output.log", line.format(i=1, s=96, t=393216, loss="1.117136E+01"))
    ingest_log(store, p)
    with open(p, "a") as fh:
        fh.write(line.format(i=2, s=192, t=786432, loss="1.054311E+01"))
    [rep] = ingest_log(store, p)
    assert rep.status == "appended"
    run = _run(store)
    with store.connect() as con:
        got = con.execute("SELECT step, value, tokens FROM points WHERE metric = 'train/loss' ORDER BY step").fetchall()
    assert got == [(1, 11.17136, 393216), (2, 10.54311, 786432)]
    assert run["lr"] == 3e-04          # the logged peak: this log prints no arguments block


def test_megatron_error_when_no_line_reads(store, tmp_path):
    p = write(tmp_path / "m" / "log.txt", " iteration        1/     100 | lm loss: 1.0E+01 | learning rate\n")
    with pytest.raises(LogFormatError) as e:
        ingest_log(store, p, format="megatron")
    assert str(e.value) == (f"{p}: expected Megatron iteration lines (' iteration N/M | ... | lm loss: X |'), "
                            "found 1 such line none of which parses (first: line 1 'iteration        1/     100 "
                            "| lm loss: 1.0E+01 | learning rate')")


# --- DeepSpeed ---------------------------------------------------------------------------------

def test_deepspeed_lines_of_a_trainer_run(store):
    """FATE's Trainer + DeepSpeed log: the Trainer's dicts make it an hf_stdout
    file (their loss is the curve); read as DeepSpeed, its log_dist lines give
    the lr schedule at the engine's steps and the echoed user config the lr."""
    p = REAL / "deepspeed" / "guest.log"
    assert detect_log(p) == "hf_stdout"
    ingest_log(store, p)
    run = _run(store)
    assert points(store, run["id"], "train/loss")[:3] == [(1, 2.075), (2, 0.8091), (3, 0.5003)]
    store2 = type(store)(store.path.parent / "ds.duckdb")
    ingest_log(store2, p, format="deepspeed")
    run = _run(store2)
    assert points(store2, run["id"], "lr") == [(10, 0.0003333333333333334), (20, 0.0004336766652213271),
                                               (30, 0.0004923737515732208), (40, 0.0005340199971093208)]
    assert points(store2, run["id"], "momentum") == [(10, 0.9), (20, 0.9), (30, 0.9), (40, 0.9)]
    # "MemA          llocated=1.87GB": the terminal's wrap is undone.
    assert points(store2, run["id"], "mem_allocated_gb") == [(10, 1.87), (20, 1.87), (30, 1.87), (40, 1.87)]
    assert points(store2, run["id"], "curr_samples_per_sec")[0] == (10, 111.33670009091573)
    assert run["lr"] == 0.0005 and run["config"]["optimizer_name"] == "Adam"


def test_deepspeed_ranks_loss_and_unread_lines(store, tmp_path):
    pre = "[2024-03-01 10:00:0{s},000] [INFO] [logging.py:96:log_dist] [Rank {r}] "
    p = write(tmp_path / "ds-run" / "train.out", "".join([
        "[2024-03-01 09:59:59,000] [INFO] [config.py:984:print] DeepSpeedEngine configuration:\n",
        "[2024-03-01 09:59:59,000] [INFO] [config.py:988:print]   optimizer_name ............... adamw\n",
        "[2024-03-01 09:59:59,000] [INFO] [config.py:988:print]   optimizer_params ............. "
        "{'lr': 0.0003, 'betas': [0.9, 0.95], 'weight_decay': 0.1}\n",
        pre.format(s=1, r=0) + "step=10, skipped=0, lr=[0.0003, 0.00015], mom=[(0.9, 0.95), (0.9, 0.95)], loss=2.5\n",
        pre.format(s=1, r=1) + "step=10, skipped=0, lr=[0.0003, 0.00015], mom=[(0.9, 0.95), (0.9, 0.95)], loss=2.6\n",
        pre.format(s=2, r=0) + "step=20, skipped=1, lr=[oops], mom=[(0.9, 0.95)]\n",
        pre.format(s=3, r=0) + "step=30, skipped=1, lr=[0.0002, 0.0001], mom=[(0.9, 0.95), (0.9, 0.95)], loss=2.1\n"]))
    assert detect_log(p) == "deepspeed"
    [rep] = ingest_log(store, p)
    run = _run(store)
    assert points(store, run["id"], "train/loss") == [(10, 2.5), (30, 2.1)]          # rank 0's only
    assert points(store, run["id"], "lr/group1") == [(10, 0.00015), (30, 0.0001)]
    assert points(store, run["id"], "skipped_steps") == [(10, 0.0), (30, 1.0)]
    assert (run["lr"], run["weight_decay"]) == (0.0003, 0.1)
    assert rep.reason == ("1 DeepSpeed progress line not read (first: line 6 '[2024-03-01 10:00:02,000] [INFO] "
                          "[logging.py:96:log_dist] [Rank 0] step=20, skipped=1, lr=[oops], mom=[(0.9, 0.95)]')")


# --- fairseq / metaseq -------------------------------------------------------------------------

def test_fairseq_simple_format(store):
    p = REAL / "fairseq" / "nat-train.log"
    assert detect_log(p) == "fairseq"
    [rep] = ingest_log(store, p)
    run = _run(store)
    assert points(store, run["id"], "train/loss") == [(40100, 3.171), (40200, 3.153)]
    assert points(store, run["id"], "lr") == [(40100, 0.000157917), (40200, 0.00015772)]
    assert points(store, run["id"], "epoch") == [(40100, 143.0), (40200, 143.0)]
    assert points(store, run["id"], "val/loss") == [(40297, 12.677)]
    assert points(store, run["id"], "val/bleu") == [(40297, 29.52)]
    assert points(store, run["id"], "epoch/loss") == [(40297, 3.162)]       # the epoch's mean, apart
    assert rep.reason.startswith("1 fairseq train_inner/valid line not read (first: line 19 '2023-06-13 17:33:31 "
                                 "| INFO | train_inner | epoch 144:      3 / 282 loss=3.164")
    # From the printed Namespace: lr=[0.0005] unwrapped; "num. model params".
    assert (run["lr"], run["weight_decay"], run["seed"], run["model_size"]) == (0.0005, 0.01, 0, 64126464)
    assert run["config"]["arch"] == "syntax_glat" and run["config"]["update_freq"] == 2


def test_fairseq_json_format(store):
    p = REAL / "fairseq" / "mass-json.log"
    assert detect_log(p) == "fairseq"
    ingest_log(store, p)
    run = _run(store)
    assert points(store, run["id"], "train/loss") == [(3600, 4.512)]
    assert points(store, run["id"], "val/loss") == [(3645, 4.033)]
    assert points(store, run["id"], "val/best_loss") == [(3645, 4.033)]
    assert points(store, run["id"], "epoch/wall") == [(3645, 119.0)]
    assert points(store, run["id"], "epoch/train_wall") == [(3645, 69.0)]
    assert run["model_size"] == 87404544 and run["lr"] == 9.1e-05     # no args printed: the logged lr's peak


def test_fairseq_old_format_and_config_dict(store, tmp_path):
    """fairseq 0.6-0.9 lines start with '|'; the hydra versions print a config dict."""
    p = write(tmp_path / "old" / "train.log", "\n".join([
        "[2021-01-01 00:00:00,000][fairseq_cli.train][INFO] - {'_name': None, 'common': {'seed': 3}, "
        "'optimization': {'lr': [0.0003], 'max_update': 100}, 'optimizer': {'_name': 'adam', 'weight_decay': 0.05}}",
        "| epoch 001:     50 / 200 loss=9.512, nll_loss=9.5, ppl=730.1, num_updates=50, lr=1.5e-05, gnorm=2.1",
        "| epoch 001 | loss 9.1 | ppl 550.2 | num_updates 200 | lr 6e-05",
        "| epoch 001 | valid on 'valid' subset | loss 8.413 | ppl 340.86 | num_updates 200 | best_loss 8.413",
        "| epoch 001 | valid on 'test' subset | loss 8.5 | ppl 362.0 | num_updates 200", ""]))
    assert detect_log(p) == "fairseq"
    ingest_log(store, p)
    run = _run(store)
    assert points(store, run["id"], "train/loss") == [(50, 9.512)]
    assert points(store, run["id"], "epoch/loss") == [(200, 9.1)]
    assert points(store, run["id"], "val/loss") == [(200, 8.413)]
    assert points(store, run["id"], "test/loss") == [(200, 8.5)]
    assert (run["lr"], run["weight_decay"], run["seed"]) == (0.0003, 0.05, 3)


# --- torchtune ---------------------------------------------------------------------------------

def test_torchtune_disk_logger(store):
    """A DiskLogger file in <output_dir>/logs/, with the recipe config torchtune
    saved in the output dir: lr and weight decay from that config."""
    p = REAL / "torchtune" / "llama3_2_1b-lora" / "logs" / "log_1727452384.txt"
    assert detect_log(p) == "torchtune"
    [rep] = ingest_log(store, p)
    run = _run(store)
    assert points(store, run["id"], "train/loss") == [(1, 2.0731472969055176), (2, 1.9982560873031616),
                                                      (3, 1.947), (4, 1.8751), (5, 1.8137316703796387)]
    assert [s for s, _ in points(store, run["id"], "lr")] == [1, 2, 3, 5]
    assert points(store, run["id"], "tokens_per_second_per_gpu")[0] == (1, 1843.6573486328125)
    assert rep.reason == "1 value not numbers, not read (first: line 4 'lr:None')"
    assert (run["lr"], run["weight_decay"], run["seed"]) == (3e-4, 0.01, None)    # seed: null in the config
    assert run["name"] == "llama3_2_1b-lora"            # the output dir, not log_<unix time>


def test_torchtune_stdout_logger_and_errors(store, tmp_path):
    p = write(tmp_path / "tt" / "stdout.txt", "INFO:torchtune.utils._logging:Running LoRAFinetuneRecipeSingleDevice\n"
              "Step 1 | loss:10.37 lr:2e-05 \nStep 2 | loss:10.1 lr:4e-05 \n")
    assert detect_log(p) == "torchtune"
    ingest_log(store, p)
    run = _run(store)
    assert points(store, run["id"], "train/loss") == [(1, 10.37), (2, 10.1)]
    bad = write(tmp_path / "b" / "log_1.txt", "Step 1 | loss:None \n")
    with pytest.raises(LogFormatError) as e:
        ingest_log(store, bad, format="torchtune")
    assert str(e.value) == (f"{bad}: expected torchtune 'Step N | name:value ...' lines with numbers, found 1 "
                            "such line none of which parses (first: line 1 'Step 1 | loss:None')")


# --- lm-evaluation-harness ---------------------------------------------------------------------

def test_lm_eval_results_of_the_harness_repo(store):
    """The results file committed in EleutherAI/lm-evaluation-harness: a steered
    model, one task; the model names no checkpoint step, so step 0 with a note."""
    [p] = (REAL / "lm_eval" / "steered").rglob("results_*.json")
    assert detect_log(p) == "lm_eval"
    ingest_log(store, p)
    run = _run(store)
    assert run["name"] == "dog_steer.csv"
    assert points(store, run["id"], "eval/mmlu_abstract_algebra/acc") == [(0, 0.34)]
    assert points(store, run["id"], "eval/mmlu_abstract_algebra/acc_stderr") == [(0, 0.047609522856952344)]
    assert run["seed"] is None and run["model_size"] is None     # eval seeds are not the run's; 0 params: unknown
    assert run["config"]["eval_random_seed"] == 0 and run["config"]["lm_eval_git_hash"] == "e16afa2f"
    assert run["config"]["metadata_notes"] == [
        "results_2025-01-21T00-40-03.356274.json: the model '/home/cs29824/matthew/lm-evaluation-harness/"
        "examples/dog_steer.csv' names no checkpoint step; its scores are stored at step 0"]


def test_lm_eval_v0_results(store):
    p = REAL / "lm_eval" / "v0" / "hellaswag-v0-res.json"
    assert detect_log(p) == "lm_eval"
    ingest_log(store, p)
    run = _run(store)
    assert sorted(run["metrics"]) == ["eval/hellaswag/acc", "eval/hellaswag/acc_norm",
                                      "eval/hellaswag/acc_norm_stderr", "eval/hellaswag/acc_stderr"]
    assert points(store, run["id"], "eval/hellaswag/acc_norm") == [(0, 0.3)]
    assert run["config"]["metadata_notes"] == ["hellaswag-v0-res.json: it names no model; its scores are "
                                               "stored at step 0"]


def test_lm_eval_checkpoints_of_one_model_are_one_curve(store):
    """Two Pythia revisions evaluated into one --output_path: one run, a point per checkpoint step."""
    files = sorted((REAL / "lm_eval" / "pythia").rglob("results_*.json"))
    reports = [ingest_log(store, p)[0] for p in files]
    [run] = list_runs(store)
    assert run["name"] == "EleutherAI/pythia-160m"
    assert points(store, run["id"], "eval/hellaswag/acc_norm") == [(1000, 0.2621), (143000, 0.3036)]
    assert points(store, run["id"], "eval/hellaswag/acc_norm_stderr") == [(1000, 0.0044), (143000, 0.0046)]
    assert points(store, run["id"], "eval/mmlu/acc") == [(1000, 0.2295), (143000, 0.2478)]
    assert reports[0].reason == "1 value not numbers, not read (first: mmlu acc_stderr,none='N/A')"
    assert run["model_size"] == 162322944


def test_lm_eval_step_and_name_of_a_checkpoint_folder():
    from loaders.logs.readers.lm_eval import checkpoint_step, model_name
    doc = {"config": {"model_args": "pretrained=/runs/gpt-wd0.1/checkpoint-500,dtype=bfloat16"}}
    assert model_name(doc, Path("x/results_1.json")) == ("gpt-wd0.1", "/runs/gpt-wd0.1/checkpoint-500")
    assert checkpoint_step("/runs/gpt-wd0.1/checkpoint-500") == 500
    assert checkpoint_step("/ckpts/iter_0001000") == 1000
    assert checkpoint_step("x/global_step300") == 300
    assert checkpoint_step("EleutherAI/pythia-160m,revision=step143000") == 143000
    assert checkpoint_step("meta-llama/Llama-3.2-1B") is None


def test_lm_eval_refusals(store, tmp_path):
    p = write(tmp_path / "r" / "results_1.json", '{"results": {"hellaswag": {"acc_stderr,none": "N/A"}}}')
    with pytest.raises(LogFormatError) as e:
        ingest_log(store, p, format="lm_eval")
    assert str(e.value) == (f"{p}: expected numeric scores in 'results', found none (1 values that are no "
                            "number: hellaswag acc_stderr,none='N/A')")


# --- detection ---------------------------------------------------------------------------------

_NEW = ("hf_stdout", "hf_results", "megatron", "deepspeed", "fairseq", "torchtune", "lm_eval")


@pytest.mark.parametrize("rel, claimed", [
    ("hf_stdout/train.log", {"hf_stdout"}),
    ("hf_stdout/transformers-5.25-trainer.log", {"hf_stdout"}),
    ("hf_results/transformers/all_results.json", {"hf_results"}),
    ("hf_results/tiny-run/trainer_state.json", {"hf_trainer"}),
    ("megatron/llama2-3.5b-tp1-pp4.log", {"megatron"}),
    ("deepspeed/guest.log", {"hf_stdout", "deepspeed"}),          # a Trainer + DeepSpeed log: the Trainer's
    ("fairseq/nat-train.log", {"fairseq"}),
    ("fairseq/mass-json.log", {"fairseq"}),
    ("torchtune/llama3_2_1b-lora/logs/log_1727452384.txt", {"torchtune"}),
    ("lm_eval/v0/hellaswag-v0-res.json", {"lm_eval"}),
])
def test_which_readers_claim_each_file(rel, claimed):
    """The readers whose sniff takes a file, and the one detection picks (the
    lowest PRIORITY): no new reader takes another's file."""
    from loaders.logs import READERS
    from loaders.logs.base import read_head
    p = REAL / rel
    head = read_head(p)
    assert {n for n, r in READERS.items() if r.sniff(p, head)} == claimed
    assert detect_log(p) == min(claimed, key=lambda n: READERS[n].PRIORITY)


@pytest.mark.parametrize("name", _NEW)
def test_new_readers_refuse_binary_and_zip_heads(name, tmp_path):
    from loaders.logs import READERS
    from loaders.logs.base import ZIP_MAGIC
    text = {"hf_stdout": b"{'loss': 2.0, 'epoch': 0.1}\n", "hf_results": b'{"eval_loss": 2.0}',
            "megatron": b" iteration        1/     100 | lm loss: 1.0E+01 | learning rate: 1.0E-04 |\n",
            "deepspeed": b"[Rank 0] step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.95)]\n",
            "fairseq": b"| INFO | train_inner | epoch 001:    100 / 1000 loss=9.5, num_updates=100, lr=1e-4\n",
            "torchtune": b"Step 1 | loss:10.37 lr:2e-05 \n",
            "lm_eval": b'{"results": {"hellaswag": {"acc,none": 0.3, "acc_stderr,none": 0.01}}}'}[name]
    p = tmp_path / ("all_results.json" if name == "hf_results" else "log.txt")
    assert READERS[name].sniff(p, text)
    assert not READERS[name].sniff(p, ZIP_MAGIC + text)
    assert not READERS[name].sniff(p, text + b"\x00")


@pytest.mark.parametrize("name, first, more, metric, want", [
    ("deepspeed", "[Rank 0] step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.95)], loss=2.5\n",
     "[Rank 0] step=20, skipped=0, lr=[0.0002], mom=[(0.9, 0.95)], loss=2.25\n", "train/loss", [(10, 2.5), (20, 2.25)]),
    ("fairseq", "| INFO | train_inner | epoch 001:    100 / 1000 loss=9.5, num_updates=100, lr=1e-4\n",
     "| INFO | train_inner | epoch 001:    200 / 1000 loss=8.5, num_updates=200, lr=2e-4\n", "train/loss",
     [(100, 9.5), (200, 8.5)]),
    ("torchtune", "Step 1 | loss:10.5 lr:2e-05 \n", "Step 2 | loss:10.25 lr:4e-05 \n", "train/loss",
     [(1, 10.5), (2, 10.25)]),
])
def test_a_growing_log_is_read_from_where_it_stopped(store, tmp_path, name, first, more, metric, want):
    p = write(tmp_path / name / "run.log", first)
    assert detect_log(p) == name
    ingest_log(store, p)
    with open(p, "a") as fh:
        fh.write(more)
    [rep] = ingest_log(store, p)
    assert rep.status == "appended"
    assert points(store, _run(store)["id"], metric) == want


def test_a_trainer_log_whose_first_dict_comes_late_stays_the_trainers(store, tmp_path):
    """DeepSpeed prints every 10 steps, the Trainer every 500: 64 KB of DeepSpeed
    lines before the first dict. The Trainer's banner says whose log it is."""
    ds = "[2024-03-01 10:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] step={}, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]\n"
    text = ("[INFO|trainer.py:2128] 2024-03-01 09:59:59 >> ***** Running training *****\n"
            "[INFO|trainer.py:2134] 2024-03-01 09:59:59 >>   Total optimization steps = 1,000\n"
            + "".join(ds.format(s) for s in range(10, 6010, 10))
            + "{'loss': 2.5, 'learning_rate': 9e-05, 'epoch': 0.5}\n")
    p = write(tmp_path / "hf-ds" / "train.out", text)
    assert p.stat().st_size > 64 * 1024
    assert detect_log(p) == "hf_stdout"
    ingest_log(store, p)
    assert points(store, _run(store)["id"], "train/loss") == [(1, 2.5)]


def test_hf_stdout_of_a_script_training_two_models(store, tmp_path):
    """Two banners with dicts after each: two runs, each with the arguments
    printed before it; a resume banner continues the run it resumes."""
    def training(lr, losses, resume=False):
        return "\n".join(["TrainingArguments(", f"learning_rate={lr},", "logging_steps=5,", ")",
                           "***** Running training *****", "  Total optimization steps = 20",
                           *(["  Continuing training from checkpoint, will skip to saved global_step"] if resume else []),
                           *(f"{{'loss': {x}, 'learning_rate': {lr}, 'epoch': 0.1}}" for x in losses), ""])
    text = training(1e-4, [3.0, 2.5]) + training(3e-4, [2.9, 2.4]) + training(3e-4, [2.2], resume=True)
    p = write(tmp_path / "sweep" / "train.log", text)
    ingest_log(store, p)
    one, two = sorted(list_runs(store), key=lambda r: r["name"])
    assert (one["name"], two["name"]) == ("sweep", "sweep#2")
    assert points(store, one["id"], "train/loss") == [(5, 3.0), (10, 2.5)]
    assert points(store, two["id"], "train/loss") == [(5, 2.9), (10, 2.4), (15, 2.2)]
    assert (one["lr"], two["lr"]) == (1e-4, 3e-4)
