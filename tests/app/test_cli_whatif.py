"""``python -m app whatif`` through the CLI's entry point (``app.cli.main``), its exit status and output."""
from __future__ import annotations

import json

from tests.app.test_cli import ROOT, run_main

DEMO = ROOT / "data" / "demo"
QKV = DEMO / "qkv-mha-wd0.1" / "checkpoints" / "final_step_004000.safetensors"


def test_whatif_json_contract_and_saved_checkpoint_reads_back(tmp_path, capsys):
    out = run_main(capsys, "whatif", str(QKV), "--to", "mqa", "--method", "aligned", "--tokens", "256",
                   "--heal-steps", "2", "--out", str(tmp_path / "mqa"), "--device", "cpu", "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert list(r) == ["checkpoint", "target", "method", "sample", "baseline", "steps", "healed", "notes"]
    assert (r["target"], r["method"]) == ("mqa", "aligned")
    assert r["steps"][0]["layers"] == [0, 1, 2, 3]
    assert r["steps"][0]["kv_bytes_per_token"] == 4 * 2 * 1 * 16 * 4
    assert list(r["healed"]) == ["steps", "loss", "ppl", "delta_ppl_pct"]
    info = run_main(capsys, "info", str(tmp_path / "mqa" / "model.safetensors"), "--json")
    assert info.returncode == 0, info.stderr
    got = json.loads(info.stdout)
    assert (got["variant"], got["n_kv_heads"], got["tied"]["variant"]) == ("qkv", 1, "qkv")
    assert json.loads((tmp_path / "mqa" / "config.json").read_text())["n_kv_heads"] == 1


def _pooled_pids() -> list[int]:
    from loaders.sandbox import POOL

    return [r.pid for key, r in POOL._idle if key[0] == "app.sandbox_jobs"]


def test_whatif_text_output_and_errors(capsys):
    out = run_main(capsys, "whatif", str(QKV), "--to", "k_eq_v", "--layers", "0,2", "--tokens", "256")
    assert out.returncode == 0, out.stderr
    child = _pooled_pids()                           # the reading child is the pool's: the runs below share it
    assert len(child) == 1
    assert "k_eq_v by lstsq" in out.stdout and "  0,2 " in out.stdout
    bad = run_main(capsys, "whatif", str(QKV), "--to", "gqa:3", "--tokens", "256")
    assert bad.returncode == 2
    assert bad.stderr.strip() == (f"error: {QKV}: layer 0: 4 kv heads cannot be pooled into 3 groups "
                                  "(expected a divisor of 4)")
    vit = next((DEMO / "vit-k_eq_v-mha-wd0" / "checkpoints").glob("final_step_*.safetensors"))
    bad = run_main(capsys, "whatif", str(vit), "--to", "mqa")
    assert bad.returncode == 2
    assert bad.stderr.strip() == (f"error: {vit}: whatif converts language models: this project's GPT (its own "
                                  "variants, nanoGPT, llama2.c, the papers' models) and Hugging Face causal LMs; "
                                  "image classifiers with --images")
    seen = run_main(capsys, "whatif", str(vit), "--to", "mqa", "--images", "digits", "--tokens", "256")
    assert seen.returncode == 0, seen.stderr
    assert "mqa by mean, 272 tokens in 16 windows" in seen.stdout and "  accuracy baseline: " in seen.stdout
    assert _pooled_pids() == child
    assert run_main(capsys, "whatif", str(QKV), "--to", "mqa", "--tokens", "1").stderr.strip() == \
        "error: --tokens 1: expected at least 2"
