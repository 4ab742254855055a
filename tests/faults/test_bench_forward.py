"""``bench/forward_speed.py``: its parameter count, medians, checkpoint choice and rows; the
plain forward's windows against the ones the activation job feeds; and, marked slow, one small
run whose ``BENCH_ROW`` lines ``bench/run_all.py`` reads (no timing is asserted)."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from app.commands.bench import _runner

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))          # bench/ is a folder of scripts, not a package

import forward_speed as F  # noqa: E402

R = _runner()
DEMO_RUN = ROOT / "data" / "demo" / "qkv-mha-wd0" / "checkpoints" / "final_step_004000.safetensors"


def test_the_parameter_count_is_transformers_own():
    transformers = pytest.importorskip("transformers")
    conf = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                    num_key_value_heads=4, intermediate_size=80, vocab_size=100,
                                    tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(conf)
    n = sum(p.numel() for p in model.parameters())
    assert F.llama_parameters(32, 3, 80, 100) == n
    assert F.llama_parameters(32, 3, 80, 100, tied=True) == n - 100 * 32
    # the shape: 134.1M untied, 109.5M with the LM head tied to the embeddings
    assert F.llama_parameters(768, 12, 2048, 32000) == 134_105_856
    assert F.llama_parameters(768, 12, 2048, 32000, tied=True) == 109_529_856


def test_ratios_round_down_to_two_decimals():
    assert F.floor2(0.695) == 0.69                      # never printed as the 0.70 target
    assert [F.floor2(x) for x in (0.29, 0.57, 0.7, 1.0)] == [0.29, 0.57, 0.7, 1.0]   # exact ones stay
    assert F.floor2(0.6999) == 0.69 and math.isnan(F.floor2(math.nan))


def test_rates_spread_and_medians():
    assert F.rate(4096, 2.0) == 2048.0 and math.isnan(F.rate(10, 0.0))
    assert F.spread(list(range(23)), 3) == [0, 11, 22]
    assert F.spread([1, 2], None) == [1, 2] == F.spread([1, 2], 5)
    assert F.spread([7, 8, 9], 1) == [7]
    job = lambda secs, load, fwd: {"tokens": 1000, "seconds": secs, "load_s": load, "forward_s": fwd,  # noqa: E731
                                   "add_s": 0.1, "result_s": 0.2}
    plain = lambda secs, stop: {"tokens": 1000, "seconds": secs, "stopped_s": stop}   # noqa: E731
    s = F.summarise([(job(3.0, 1.0, 0.5), plain(0.25, 0.125)), (job(1.5, 0.5, 0.4), plain(0.5, 0.1)),
                     (job(2.0, 1.0, 1.0), plain(1.0, 0.5))])
    assert s["plain"] == 2000.0                                               # 4000, 2000, 1000 tok/s
    assert s["stopped"] == 8000.0                                             # 8000, 10000, 2000 tok/s
    assert s["forward"] == 2000.0 and s["job"] == 1000.0 and s["with_load"] == 1000 / 2.0
    # ratios per pair, then the median: forward 0.5, 1.25, 1.0; without the load 0.125, 0.5, 1.0;
    # with it 1/12, 1/3, 1/2; the forward pass against the stopped forward 0.25, 0.25, 0.5
    assert s["ratio"] == {"forward": 1.0, "job": 0.5, "with_load": pytest.approx(1 / 3)}
    assert s["capture"] == 0.25
    assert "(to the last attention input 8,000 tok/s)" in F.ratios_text(s) and "(0.25x of the stopped one)" in \
        F.ratios_text(s)
    assert s["split"]["seconds"] == 2.0 and s["split"]["load_s"] == 1.0
    assert "job 2.000 s = load 1.000 + forward pass 0.500 (of which add() 0.100) + result() 0.200" in F.split_text(s)


def test_demo_checkpoints_are_each_language_runs_final_one(tmp_path):
    for run, files in {"qkv-a": ["step_000500.safetensors", "final_step_004000.safetensors"],
                       "vit-qkv-a": ["final_step_004000.safetensors"], "k_eq_v-b": ["final_step_000100.safetensors"],
                       "empty": []}.items():
        (tmp_path / run / "checkpoints").mkdir(parents=True)
        for f in files:
            (tmp_path / run / "checkpoints" / f).write_bytes(b"")
    (tmp_path / "README.md").write_text("x")
    assert F.demo_checkpoints(tmp_path) == [tmp_path / "k_eq_v-b/checkpoints/final_step_000100.safetensors",
                                            tmp_path / "qkv-a/checkpoints/final_step_004000.safetensors"]
    assert len(F.demo_checkpoints(ROOT / "data" / "demo")) == 23


def test_rows_print_as_bench_row_lines_with_the_target(capsys):
    s = {"plain": 1000.0, "stopped": 2000.0, "forward": 800.0, "job": 500.0, "with_load": 400.0,
         "ratio": {"forward": 0.8, "job": 0.5, "with_load": 0.4}, "capture": 0.4}
    F.ratio_rows("a model, 4,096 tokens", s)
    rows = R.printed_rows(capsys.readouterr().out)
    assert [(r.bench, r.figure, r.target, r.result) for r in rows] == [
        ("forward_speed", "0.80x (800 tok/s)", ">= 0.7x", "pass"),
        ("forward_speed", "0.50x (500 tok/s)", "-", "-"),
        ("forward_speed", "0.40x (400 tok/s)", "-", "-"),
        ("forward_speed", "0.40x (800 tok/s)", "-", "-")]
    assert rows[0].measured.startswith("tokens/s of the activation job's forward pass") and \
        rows[0].measured.endswith(", a model, 4,096 tokens")
    assert rows[0].against == "the same model's plain forward, same windows (1,000 tok/s)"
    assert rows[3].measured == ("tokens/s of the activation job's forward pass (hooks and every layer's add()) "
                                "against the forward it stops, a model, 4,096 tokens")
    assert rows[3].against == "the same model's forward to its last attention input, no add() (2,000 tok/s)"
    assert F.FORWARD_RATIO == R.FORWARD_RATIO == 0.7


def test_the_plain_forward_runs_the_windows_the_job_feeds(monkeypatch):
    from analysis.activations import ActivationAccumulator
    from experiments import activation_runs, runnable
    from loaders.checkpoints import open_checkpoint

    fed = []
    feed = activation_runs.feed
    monkeypatch.setattr(activation_runs, "feed", lambda model, mods, accs, inputs, *a: (
        fed.append(inputs.clone()), feed(model, mods, accs, inputs, *a))[1])
    add, results = ActivationAccumulator.add, runnable.results_of
    job = F.measure_job(DEMO_RUN, "cpu", 300)
    assert (ActivationAccumulator.add, runnable.results_of) == (add, results)   # unwrapped again
    assert activation_runs.load_runnable is runnable.load_runnable
    with open_checkpoint(DEMO_RUN) as ckpt:
        model, tok, vocab = activation_runs.load_runnable(ckpt)
        windows = F.job_windows(ckpt, model, tok, vocab, 300)
    assert torch.equal(windows, fed[0]) and list(windows.shape) == [3, 128] == job["windows"]
    assert job["tokens"] == 384 and job["rows"] > 0
    assert 0 < job["forward_s"] < job["seconds"] and job["add_s"] > 0 and job["result_s"] > 0
    plain = F.measure_plain(DEMO_RUN, "cpu", 300)
    assert (plain["tokens"], plain["windows"]) == (384, [3, 128]) and plain["seconds"] > 0 < plain["stopped_s"]


@pytest.mark.slow
def test_a_small_run_prints_rows_run_all_reads(capsys):
    assert F.main(["--quick", "--limit", "2", "--tokens", "512", "--threads", "1", "--hidden", "64",
                   "--layers", "2", "--heads", "2", "--intermediate", "128", "--vocab", "1000"]) == 0
    out = capsys.readouterr().out
    n = F.llama_parameters(64, 2, 128, 1000)
    assert f"LlamaForCausalLM {n / 1e6:.1f}M parameters (hidden 64, 2 layers, 2 heads, intermediate 128, " \
           f"vocab 1,000): {n:,} parameters (formula {n:,}; " in out
    rows = R.printed_rows(out)
    assert [r.measured.split(", ")[0] for r in rows] == 2 * [
        "tokens/s of the activation job's forward pass (hooks and every layer's add())",
        "tokens/s of the activation job without its model load (add()", "tokens/s of the activation job end to end (its "
        "model load included)", "tokens/s of the activation job's forward pass (hooks and every layer's add()) "
        "against the forward it stops", "peak RSS above the imports"]
    assert "median of 2 demo checkpoints, 512 tokens each" in rows[0].measured
    assert rows[5].measured.endswith("vocab 1,000), 512 tokens")
    for r in rows:
        assert r.bench == "forward_speed"
        if r.target == ">= 0.7x":
            assert r.result == ("pass" if float(r.figure.split("x")[0]) >= 0.7 else "FAIL")
        else:
            assert (r.target, r.result) == ("-", "-")
    # the target is on the job's forward pass (the hooks and captures), one per model set
    assert [r.target for r in rows] == 2 * [">= 0.7x", "-", "-", "-", "-"]
