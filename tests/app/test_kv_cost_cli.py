"""``python -m app kv-cost``: the JSON contract, the readable report, the lists, the errors."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.gpus import CATALOGUE
from analysis.presets import PRESETS
from app.cli import main

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = {"bytes_per_token", "bytes_per_user", "weights_bytes", "users_per_gpu", "tokens_per_s",
            "usd_per_million_tokens", "bound"}


def run_json(capsys, *args: str) -> dict:
    assert main(["kv-cost", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_contract_as_a_user_runs_it():
    out = subprocess.run([sys.executable, "-m", "app", "kv-cost", "--preset", "llama-3-8b", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert CONTRACT <= set(data)
    assert data["bytes_per_token"] == 131072
    assert data["bound"] in ("memory", "compute")


def test_preset_variant_kv_heads_and_savings(capsys):
    data = run_json(capsys, "--preset", "projection-sharing-300m", "--variant", "k_eq_v", "--kv-heads", "1",
                    "--context", "2048", "--gpu", "a100-80gb", "--price-per-hour", "2")
    assert data["bytes_per_token"] == 20 * 1 * 1 * 64 * 2
    assert data["bytes_per_user"] == 20 * 64 * 2 * 2048
    assert data["savings"]["saving_bytes_per_token"] == 0.96875
    assert data["baseline"]["bytes_per_token"] == 20 * 2 * 16 * 64 * 2
    assert data["price_per_hour"] == 2 and data["gpu"] == "a100-80gb"
    assert [s["name"] for s in data["steps"]][:3] == ["parameters", "weight memory", "KV bytes per token"]


def test_typed_geometry(capsys):
    data = run_json(capsys, "--layers", "24", "--heads", "16", "--kv-heads", "4", "--d-head", "64",
                    "--d-model", "1024", "--context", "1000", "--kv-dtype", "fp32", "--users", "3")
    assert data["bytes_per_token"] == 24 * 2 * 4 * 64 * 4
    assert data["bytes_all_users"] == data["bytes_per_user"] * 3
    assert data["users"] == 3


def test_does_not_fit_gives_zero_users_and_null_cost(capsys):
    data = run_json(capsys, "--preset", "llama-2-70b", "--gpu", "l4")
    assert data["users_per_gpu"] == 0 and data["usd_per_million_tokens"] is None and data["bound"] is None


def test_compare_table(capsys):
    data = run_json(capsys, "--preset", "gpt2", "--compare")
    variants = [row["variant"] for row in data["comparison"]]
    assert variants[:5] == ["qkv", "wq_identity", "q_eq_k", "k_eq_v", "q_eq_k_eq_v"]


def test_lists(capsys):
    assert [p["name"] for p in run_json(capsys, "--list-presets")] == list(PRESETS)
    gpus = run_json(capsys, "--list-gpus")
    assert [g["name"] for g in gpus] == list(CATALOGUE)
    assert all(set(g["sources"]) == {"memory", "bandwidth", "bf16", "price"} for g in gpus)


def test_readable_report_labels_units(capsys):
    assert main(["kv-cost", "--preset", "llama-3-8b", "--variant", "k_eq_v"]) == 0
    text = capsys.readouterr().out
    assert "units: GB = 1e9 bytes, GiB = 2^30 bytes, KiB = 1024 bytes" in text
    assert "32 * 1 * 8 * 128 * 2 = 65,536.0 B (64.000 KiB)" in text
    assert "saves 50.0%" in text


@pytest.mark.parametrize("args, message", [
    (["--preset", "gpt5"], "error: unknown preset 'gpt5': expected one of " + ", ".join(PRESETS)),
    (["--preset", "gpt2", "--layers", "3"],
     "error: kv-cost: give exactly one of --preset NAME, --checkpoint PATH, or --layers/--heads/--d-head/--d-model"),
    (["--layers", "3", "--heads", "4"], "error: kv-cost: a typed geometry needs --d-head, --d-model as well"),
    (["--preset", "gpt2", "--kv-heads", "5"],
     "error: geometry 'gpt2': n_kv_heads must divide n_heads=12 (1 for MQA, 12 for MHA), got 5"),
    (["--preset", "gpt2", "--gpu", "tpu"], "error: unknown GPU 'tpu': expected one of " + ", ".join(CATALOGUE)),
])
def test_errors_are_one_line_and_exit_2(capsys, args, message):
    assert main(["kv-cost", *args]) == 2
    assert capsys.readouterr().err.strip() == message


def test_checkpoint_geometry_matches_info(capsys, tmp_path):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=64,
                               n_positions=64)).save_pretrained(tmp_path / "tiny")
    from loaders.checkpoints import inspect_checkpoint

    info = inspect_checkpoint(tmp_path / "tiny")
    data = run_json(capsys, "--checkpoint", str(tmp_path / "tiny"), "--kv-dtype", "fp32", "--context", "10")
    assert data["bytes_per_token"] == info["kv_bytes_per_token"] == 2 * 2 * 4 * 8 * 4
    assert data["params_total"] == info["params"]["total"]
    assert data["params_attention"] == info["params"]["attention"]
    # K=V drops W_V and b_V of both layers: 2 * (32 * 32 + 32)
    tied = run_json(capsys, "--checkpoint", str(tmp_path / "tiny"), "--variant", "k_eq_v")
    assert data["params_total"] - tied["params_total"] == 2 * (32 * 32 + 32)


def test_missing_checkpoint_is_a_one_line_error(capsys, tmp_path):
    assert main(["kv-cost", "--checkpoint", str(tmp_path / "nope.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "nope.pt" in err and "\n" not in err
