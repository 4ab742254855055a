"""Numbers a researcher can trust, end to end: real `transformers` models built in
code, analysed through `python -m app analyze --activations --json` as a user would."""
from __future__ import annotations

import json

import pytest
import torch

from analysis.registry import BY_NAME, names
from app.cli import main


def _word_tokenizer(vocab: int = 8000):
    """A word-level tokenizer trained in code on the bundled corpus: real LLMs have thousands of
    distinct tokens (fed as bytes, a random model's layer-0 input spans only ~70 directions, and
    any fit of d_head >= 70 columns is exact by construction, at chance too)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from loaders.text_corpus import read_text_sample

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([read_text_sample().text],
                            trainers.WordLevelTrainer(vocab_size=vocab, special_tokens=["[UNK]"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def _llama(folder, *, hidden=512, heads=4, kv_heads=4, layers=2, tie=None, seed=0, tokenizer=False):
    """A random-init Llama (head_dim = hidden / heads) saved as safetensors; ``tie`` sets
    every layer's q_proj to the identity ("wq_identity") or v_proj to k_proj ("k_eq_v");
    ``tokenizer`` saves a word-level tokenizer beside it (vocabulary 8,000)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=8000 if tokenizer else 256, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=512)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            att = layer.self_attn
            if tie == "wq_identity":
                att.q_proj.weight.copy_(torch.eye(hidden))
            elif tie == "k_eq_v":
                att.v_proj.weight.copy_(att.k_proj.weight)
    model.save_pretrained(folder)
    if tokenizer:
        _word_tokenizer().save_pretrained(folder)
    return folder


def _run(capsys, *args) -> dict:
    assert main(["analyze", *map(str, args), "--device", "cpu", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_random_llama_head_dim_128_reads_chance_not_one(tmp_path, capsys):
    # one layer: its input is the (normalised) embeddings of the corpus' words; deeper layers of a
    # random model read averaged, more anisotropic inputs, where the chance level itself rises
    # (0.74 at layer 1), and the value stays at it
    folder = _llama(tmp_path / "llama", layers=1, tokenizer=True)
    out = _run(capsys, folder, "--db", tmp_path / "a.duckdb", "--activations")
    rows = out["metrics"]
    assert all("chance" in r for r in rows)
    weights = set(names("weights"))
    # every row of a metric that has a chance level carries one (norms are scale: none)
    assert all(r["chance"] is not None for r in rows if not r["metric"].startswith("norm_"))
    acts = [r for r in rows if r["metric"] not in weights]
    assert acts and all({"n_tokens", "ci_low", "ci_high"} <= set(r) for r in acts)
    pair = {"head_pair": {"head2"}, "kv_head_pair": {"head2"}, "layer_pair": {"layer2"}}
    assert all(set(r) == {"layer", "head", "metric", "value", "chance", "chance_low", "chance_high", "above_chance",
                          "degenerate"} | pair.get(BY_NAME[r["metric"]].axis, set())
               for r in rows if r["metric"] in weights)
    assert out["sample"]["n_tokens"] >= 8 * 128 and out["sample"]["text"] == "bundled"
    assert out["sample"]["tokenizer"] == "tokenizer"
    share = [r for r in acts if r["metric"] == "kv_share_r2_act"]
    assert len(share) == 4
    for r in share:
        assert r["n_tokens"] == out["sample"]["n_tokens"]
        assert r["value"] < 0.6, r                          # was 1.0 on 64 tokens
        assert r["ci_low"] <= r["value"] <= r["ci_high"]
        # the random model reads chance: its interval reaches the chance level
        assert r["ci_low"] <= r["chance"] <= r["ci_high"], r
    assert out["tied"]["variant"] == "qkv" and out["tied"]["agree"] is True


@pytest.mark.slow
@pytest.mark.parametrize("tie, variant", [("wq_identity", "wq_identity"), ("k_eq_v", "k_eq_v")])
def test_tied_tensors_in_a_standard_layout(tmp_path, capsys, tie, variant):
    folder = _llama(tmp_path / tie, hidden=64, heads=4, tie=tie)
    out = _run(capsys, folder, "--db", tmp_path / "t.duckdb")
    assert out["tied"]["layout_variant"] == "qkv"
    assert out["tied"]["variant"] == variant and out["tied"]["agree"] is False
    assert len(out["tied"]["layers"]) == 2
    assert main(["analyze", str(folder), "--db", str(tmp_path / "t.duckdb"), "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert f"  note: the layout reads variant qkv, but the tensors read {variant} (" in text


@pytest.mark.slow
def test_sample_is_part_of_the_cache_key(tmp_path, capsys):
    folder = _llama(tmp_path / "small", hidden=64, heads=4)
    db = tmp_path / "c.duckdb"
    text = tmp_path / "mine.txt"
    text.write_text("Every layer reads the residual stream and mixes the values of earlier tokens. " * 200)
    first = _run(capsys, folder, "--db", db, "--activations", "--tokens", 512)
    again = _run(capsys, folder, "--db", db, "--activations", "--tokens", 512)
    other = _run(capsys, folder, "--db", db, "--activations", "--tokens", 512, "--text", text)
    assert first["cached"] is False and again["cached"] is True and other["cached"] is False
    assert first["sample"]["tokens"] == 512 and other["sample"]["text"].startswith("sha256:")
    n = {r["n_tokens"] for r in other["metrics"] if r["metric"] == "kv_cka_act"}
    assert n == {other["sample"]["n_tokens"]} and other["sample"]["n_tokens"] >= 512


def test_bad_text_is_a_one_line_error_before_anything_runs(tmp_path, capsys):
    bad = tmp_path / "notes.bin"
    bad.write_bytes(b"\xff\xfe\x00x")
    assert main(["analyze", "1", "--db", str(tmp_path / "e.duckdb"), "--activations", "--text", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}: not a text file") and err.count("\n") == 1
    assert not (tmp_path / "e.duckdb").exists()              # the text is read before the database opens
