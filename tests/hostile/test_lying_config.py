"""A config.json that lies (``vocab_size`` 1e12, ``rope_scaling`` junk) fails only the
activation metrics, which build the model from it, with one note; the weight metrics,
read from the tensors alone, are computed and kept."""
from __future__ import annotations

import json

import pytest

from app.jobs import compute_jobs
from tests.faults.data import gpt2_folder


def lie(folder, **fields):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(fields)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def jobs_of(folder) -> dict:
    return {j["kind"]: j for j in compute_jobs(str(folder), kinds=["weights", "activations"], device="cpu",
                                               tokens=128)}


def test_a_vocab_size_of_1e12_skips_the_forward_pass_with_a_note(tmp_path):
    folder = lie(gpt2_folder(tmp_path / "m", seed=1), vocab_size=10**12)
    jobs = jobs_of(folder)
    assert len(jobs["weights"]["rows"]) == 150 and jobs["activations"]["rows"] == []   # every weight row
    assert jobs["activations"]["notes"]["kv_cka_act"] == (
        f"{folder}: config.json's vocab_size 1,000,000,000,000 x hidden_size 16 makes a 59,604.6 GiB "
        "embedding, over QKVSCOPE_PARSE_MEMORY_MB (4,096 MB); weight-level metrics only")


def test_junk_rope_scaling_skips_the_forward_pass_with_a_note(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    folder = tmp_path / "llama"
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    lie(folder, rope_scaling={"rope_type": "junk", "factor": "x"})
    jobs = jobs_of(folder)
    assert len(jobs["weights"]["rows"]) > 0 and jobs["activations"]["rows"] == []
    assert jobs["activations"]["notes"]["kv_cka_act"] == (
        f"{folder}: transformers cannot build this model ('junk'); weight-level metrics only")
