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
#: The serving figures (docs/guide/kv-cost.md): the batch cap, GPUs, cost per month, latency.
SERVING = {"gpus", "max_batch", "batch_per_replica", "batch_limit", "tokens_per_s_per_gpu", "usd_per_month",
           "prompt_tokens", "prefill_flops", "prefill_time_s", "prefill_bound", "ttft_s", "tpot_s"}


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
    (["--preset", "gpt2", "--gpu", "tpu"],
     "error: unknown GPU 'tpu': expected one of h100-sxm (h100, h100 sxm5, h100 80gb), h100-pcie (h100 pcie), "
     "h200 (h200 sxm), b200 (b200 hgx), a100-40gb (a100 40g), a100-80gb (a100, a100 sxm, a100 80g), l40s, l4, "
     "a10g, rtx-4090 (rtx 4090, 4090), mi300x, edge-phone (phone); any case, spaces or hyphens, or the label "
     "--list-gpus prints"),
    (["--preset", "gpt2", "--max-batch", "-3"], "error: serving: max_batch must be >= 1 (or None: no cap), got -3"),
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


def test_serving_fields_in_json_with_hand_computed_values(capsys):
    data = run_json(capsys, "--preset", "llama-3-8b", "--users", "100000", "--max-batch", "64",
                    "--prompt-len", "1000", "--price-per-hour", "2")
    assert SERVING <= set(data) and SERVING <= set(data["baseline"])
    # 100 users' caches fit an H100; the cap is 64: ceil(100,000 / min(64, 100)) GPUs
    assert (data["users_per_gpu"], data["max_batch"], data["batch_per_replica"]) == (100, 64, 64)
    assert data["batch_limit"] == "batch cap" and data["gpus"] == 1563
    assert data["usd_per_month"] == 2 * 1563 * 730
    assert data["tokens_per_s_per_gpu"] == pytest.approx(data["tokens_per_s"] / 1563)
    assert data["prompt_tokens"] == 1000
    read = 8_030_261_248 - 128256 * 4096
    assert data["prefill_flops"] == 2 * read * 1000 + 4 * 32 * 32 * 128 * 500_500
    assert data["ttft_s"] == pytest.approx(data["prefill_flops"] / (989.4e12 * 0.5))
    assert data["tpot_s"] == data["step_time_s"]
    assert data["serving"]["max_batch"] == 64
    assert {"saving_gpus", "saving_usd_per_month", "saving_ttft_s", "saving_tpot_s",
            "ratio_tokens_per_s_per_gpu"} <= set(data["savings"])


def test_no_batch_cap_with_zero(capsys):
    data = run_json(capsys, "--preset", "projection-sharing-300m", "--variant", "k_eq_v", "--kv-heads", "1",
                    "--max-batch", "0", "--users", "6625")
    assert (data["max_batch"], data["gpus"], data["batch_limit"]) == (None, 1, "memory")


def test_compare_rows_carry_the_serving_columns(capsys):
    data = run_json(capsys, "--preset", "gpt2", "--compare", "--users", "5000")
    assert all(SERVING - {"prefill_flops", "prefill_bound"} <= set(row) for row in data["comparison"])


@pytest.mark.parametrize("spelling, name", [("H100", "h100-sxm"), ("A100", "a100-80gb"),
                                            ("h100 pcie", "h100-pcie"), ("RTX 4090", "rtx-4090")])
def test_gpu_accepts_common_spellings(capsys, spelling, name):
    assert run_json(capsys, "--preset", "gpt2", "--gpu", spelling)["gpu"] == name


def test_readable_report_shows_gpus_and_latency(capsys):
    assert main(["kv-cost", "--preset", "llama-3-8b", "--users", "100000"]) == 0
    text = capsys.readouterr().out
    assert "GPUs needed                1,000 for 100,000 users, batch up to 100 a replica (limited by memory)" in text
    assert "USD per month              2,190,000 ($3/GPU-hour * 1000 * 730 h)" in text
    assert "time to first token" in text and "time per output token" in text


def test_mla_checkpoint_is_costed_with_its_latent(capsys, tmp_path):
    tf = pytest.importorskip("transformers")
    if not hasattr(tf, "DeepseekV3Config"):
        pytest.skip("this transformers has no DeepseekV3")
    import torch

    torch.manual_seed(0)
    tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(
        vocab_size=64, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1,
        n_group=1, topk_group=1, max_position_embeddings=64)).save_pretrained(tmp_path / "v3")
    data = run_json(capsys, "--checkpoint", str(tmp_path / "v3"), "--kv-dtype", "bf16", "--compare")
    # 2 layers * (kv_lora_rank 16 + rope 8) * 2 B, against MHA: 2 layers * 2 * 4 heads * d_head 24 * 2 B
    assert (data["variant"], data["bytes_per_token"]) == ("mla", 2 * (16 + 8) * 2)
    assert data["baseline"]["bytes_per_token"] == 2 * 2 * 4 * 24 * 2
    assert data["comparison"][0]["variant"] == "mla"


def test_plus_variant_is_accepted(capsys):
    plus = run_json(capsys, "--preset", "gpt2", "--variant", "q_eq_k_eq_v_plus")
    base = run_json(capsys, "--preset", "gpt2", "--variant", "q_eq_k_eq_v")
    assert plus["bytes_per_token"] == base["bytes_per_token"] == 12 * 1 * 12 * 64 * 2
    assert plus["label"] == "(Q=K=V)+, MHA"


# -- hybrid stacks and engine mode ------------------------------------------------------------------

ENGINE = {"max_concurrency", "kv_cache_bytes", "activation_bytes", "layer_types", "engine"}


def test_engine_vllm_prints_vllms_line_for_the_published_a100_log(capsys):
    args = ["kv-cost", "--preset", "llama-3-8b", "--gpu", "a100-40gb", "--context", "8192", "--engine", "vllm",
            "--gpu-memory-utilization", "0.90", "--activation-gib", "9.37"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "Maximum concurrency for 8,192 tokens per request: 11.12x" in text.splitlines()
    assert "capacity: as vLLM computes it" in text
    data = run_json(capsys, *args[1:])
    assert ENGINE | CONTRACT <= set(data)
    assert round(data["max_concurrency"], 2) == 11.12 and data["users_per_gpu"] == 11
    assert data["activation_bytes"] == 9.37 * 2 ** 30
    assert data["kv_cache_bytes"] == pytest.approx((39.50 * 0.90 - 0.10 - 9.37) * 2 ** 30 - 16_060_522_496)


def test_datasheet_mode_is_labelled_and_keeps_its_figures(capsys):
    assert main(["kv-cost", "--preset", "llama-3-8b", "--gpu", "a100-40gb", "--context", "8192"]) == 0
    text = capsys.readouterr().out
    assert "capacity: datasheet (GPU GB * utilisation - weights - reserve" in text
    assert "Maximum concurrency" not in text
    data = run_json(capsys, "--preset", "llama-3-8b", "--gpu", "a100-40gb", "--context", "8192")
    assert data["users_per_gpu"] == 16 and data["max_concurrency"] is None and data["engine"] == "datasheet"


def test_layer_types_by_hand_print_both_per_token_and_per_user(capsys):
    args = ["--layers", "6", "--heads", "4", "--kv-heads", "1", "--d-head", "16", "--d-model", "64",
            "--kv-dtype", "fp32", "--context", "2048", "--layer-types", "5xlocal:512,1xglobal"]
    data = run_json(capsys, *args)
    assert data["bytes_per_token"] == 768 and data["bytes_per_user"] == 128 * (2048 + 5 * 512)
    assert [(t["name"], t["n_layers"], t["n_kv_heads"], t["d_head_k"], t["d_head_v"], t["window"], t["bytes"])
            for t in data["layer_types"]] == [("local", 5, 1, 16, 16, 512, 640 * 512),
                                              ("global", 1, 1, 16, 16, None, 128 * 2048)]
    data = run_json(capsys, *args, "--engine", "transformers")
    assert data["bytes_per_user"] == 589_184
    assert main(["kv-cost", *args]) == 0
    text = capsys.readouterr().out
    assert "per layer type at context 2,048:" in text
    assert "KV bytes per user          1,572,864 B" not in text


def test_a_bad_layer_types_spec_is_one_line(capsys):
    code = main(["kv-cost", "--preset", "llama-3-8b", "--layer-types", "5xlocal:512,40xglobal"])
    assert code == 2
    assert capsys.readouterr().err.strip() == ("error: layer types '5xlocal:512,40xglobal': 45 layers, "
                                               "but the model has 32")


def test_a_gemma3_checkpoint_is_priced_as_transformers_caches_it(tmp_path, capsys):
    """A Gemma-3-layout checkpoint (5 sliding layers of 512 per global) saved by transformers: after a
    2,048-token forward its cache holds 589,184 bytes; ``--checkpoint`` reads the layer types from
    the saved config and gives the same (priced as global it was 1,572,864)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(
        "gemma3_text", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=512, max_position_embeddings=4096)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(tmp_path / "g3", safe_serialization=True)
    with torch.no_grad():
        cache = model(torch.randint(0, 64, (1, 2048)), use_cache=True).past_key_values
    real = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert real == 589_184
    data = run_json(capsys, "--checkpoint", str(tmp_path / "g3"), "--engine", "transformers", "--kv-dtype", "fp32",
                    "--context", "2048")
    assert data["bytes_per_user"] == real and data["bytes_per_token"] == 768
    data = run_json(capsys, "--checkpoint", str(tmp_path / "g3"), "--kv-dtype", "fp32", "--context", "2048",
                    "--window", "0")
    assert data["bytes_per_user"] == 1_572_864
