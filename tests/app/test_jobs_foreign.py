"""Forward passes through app.jobs for llama2.c exports and checkpoints, character-level
nanoGPT, and zips of Hugging Face folders; every file built in code."""
from __future__ import annotations

import pickle
import zipfile

import pytest
import torch

from analysis.registry import names
from app import jobs
from experiments import activation_runs, attention_maps, runnable
from loaders.checkpoints import open_checkpoint
from loaders.ingest import ingest_checkpoint
from loaders.store import Store
from tests.experiments.test_foreign_llama import llama_forward
from tests.loaders.llama2c_files import llama_state, toy_pieces, write_bin, write_tokenizer

GEOM = dict(n_heads=4, n_kv=2, seq_len=32)


def _reference_attention(sd, ids, layer, *, n_heads=4, n_kv=2) -> torch.Tensor:
    """Layer ``layer``'s attention probabilities [H, T, T] of llama2.c's model, float64."""
    maps = {}
    orig_softmax = torch.Tensor.softmax

    def spy(self, dim):
        out = orig_softmax(self, dim)
        maps[len(maps)] = out
        return out

    torch.Tensor.softmax = spy
    try:
        llama_forward(sd, ids[None], n_heads=n_heads, n_kv=n_kv)
    finally:
        torch.Tensor.softmax = orig_softmax
    return maps[layer][0]


def test_llama2c_folder_attention_maps_are_the_models(tmp_path):
    sd = llama_state(shared=True)
    write_bin(tmp_path / "model.bin", sd, version=1, **GEOM)
    write_tokenizer(tmp_path / "tokenizer.bin", *toy_pieces(300))
    with open_checkpoint(tmp_path) as ckpt:
        cap = attention_maps.capture_activations(ckpt, text="the cat sat on the mat", device="cpu")
    assert cap.tokenizer == "tokenizer.bin"
    assert cap.tokens[:2] == [" the", " cat"]
    ids = torch.tensor(toy_tokenizer_ids("the cat sat on the mat"))
    for i, lc in enumerate(cap.layers):
        assert lc.logits is None and lc.k.shape == (2, len(ids), 4)
        torch.testing.assert_close(lc.attn.double(), _reference_attention(sd, ids, i), atol=1e-5, rtol=1e-4)


def toy_tokenizer_ids(text):
    from loaders.llama2c import Llama2cTokenizer

    return Llama2cTokenizer(*toy_pieces(300)).encode(text)


@pytest.mark.parametrize("version", [0, 2])
def test_llama2c_bin_activations(tmp_path, version):
    write_bin(tmp_path / "model.bin", llama_state(), version=version, group_size=8, **GEOM)
    write_tokenizer(tmp_path / "tokenizer.bin", *toy_pieces(300))
    store = Store(tmp_path / "l2c.duckdb")
    cid = ingest_checkpoint(store, tmp_path / "model.bin").checkpoint_id   # in this process: own file
    w, a = jobs.analyze(store, cid, device="cpu", activations=True, sample=activation_runs.SampleSpec(tokens=512))
    assert jobs.checkpoint_row(store, cid)["architecture"] == "llama_meta"
    assert set(a.frame.metric) == set(names("activations")) - {"logit_symmetry"}
    assert set(a.notes) == {"logit_symmetry"}
    assert (a.sample["tokenizer"], a.sample["window"]) == ("tokenizer.bin", 32)   # seq_len caps windows


def test_llama2c_without_tokenizer_samples_ids(tmp_path):
    write_bin(tmp_path / "model.bin", llama_state(), version=0, **GEOM)
    with open_checkpoint(tmp_path / "model.bin") as ckpt:
        run = activation_runs.corpus_activations(ckpt, device="cpu", sample=activation_runs.SampleSpec(tokens=256))
    assert run.sample["tokenizer"] == "sampled ids"
    note = run.notes["kv_cka_act"]
    assert note == ("inputs are token ids drawn uniformly from the vocabulary of 300, not the text: no "
                    "vocabulary found (a llama2.c tokenizer.bin / tok{vocab}.bin, a stoi or a meta.pkl)")


def _char_nanogpt(folder, vocab=40):
    """A character-level nanoGPT ckpt.pt (vocab < 256) and, in data/<dataset>/, its meta.pkl."""
    from tests.experiments.test_foreign import D, H, L, query_free_sd

    sd = query_free_sd("original")
    g = torch.Generator().manual_seed(5)
    sd["transformer.wte.weight"] = torch.randn(vocab, D, generator=g) * 0.3
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    args = {"n_layer": L, "n_head": H, "n_embd": D, "block_size": 12, "bias": True, "vocab_size": vocab}
    out = folder / "out"
    out.mkdir(parents=True)
    torch.save({"model": sd, "model_args": args, "iter_num": 5,
                "config": {"dataset": "shakespeare_char"}}, out / "ckpt.pt")
    chars = sorted(set("the quick brown fox jumps over a lazy dog.,;'\n"))[:vocab]
    meta = {"vocab_size": vocab, "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}
    data = folder / "data" / "shakespeare_char"
    data.mkdir(parents=True)
    with open(data / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)
    return out / "ckpt.pt", meta


def test_char_level_nanogpt_reads_its_meta_pkl(tmp_path):
    path, meta = _char_nanogpt(tmp_path)
    with open_checkpoint(path) as ckpt:
        cap = attention_maps.capture_activations(ckpt, text="the lazy dog", device="cpu")
        run = activation_runs.corpus_activations(ckpt, device="cpu", sample=activation_runs.SampleSpec(tokens=256))
    assert cap.tokenizer == "meta.pkl characters"
    assert "".join(cap.tokens) == "the lazy dog"[:12]
    assert run.sample["tokenizer"] == "meta.pkl characters"
    text = activation_runs.SampleSpec(tokens=256).read().text[: 256 * 16]          # what the job tokenised
    dropped = sum(c not in meta["stoi"] for c in text)
    assert dropped > 0 and run.notes == {m: f"{dropped} characters of the text are not in the meta.pkl "
                                            "characters vocabulary and were left out"
                                         for m in names("activations")}
    assert set(run.frame.metric) == set(names("activations"))


def test_char_level_meta_pkl_with_code_is_refused_and_ids_sampled(tmp_path):
    import os

    path, _ = _char_nanogpt(tmp_path)
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    meta = tmp_path / "data" / "shakespeare_char" / "meta.pkl"
    meta.write_bytes(pickle.dumps({"stoi": Evil()}))
    with open_checkpoint(path) as ckpt:
        run = activation_runs.corpus_activations(ckpt, device="cpu", sample=activation_runs.SampleSpec(tokens=256))
    assert not marker.exists()
    assert run.sample["tokenizer"] == "sampled ids"
    assert run.notes["kv_cka_act"] == (
        "inputs are token ids drawn uniformly from the vocabulary of 40, not the text: no vocabulary found "
        f"(a stoi in the checkpoint or a meta.pkl beside it: {meta}: refused to unpickle: the pickle calls "
        "posix.system, which is not a plain value (a vocabulary pickle holds only dicts, strings and numbers))")


def test_stoi_in_the_checkpoint(tmp_path):
    path, meta = _char_nanogpt(tmp_path)
    (tmp_path / "data" / "shakespeare_char" / "meta.pkl").unlink()
    ck = torch.load(path, weights_only=True)
    ck["stoi"] = meta["stoi"]
    torch.save(ck, path)
    with open_checkpoint(path) as ckpt:
        cap = attention_maps.capture_activations(ckpt, text="a fox", device="cpu")
    assert cap.tokenizer == "stoi of the checkpoint" and cap.tokens == list("a fox")


# ---- zips of Hugging Face folders ----------------------------------------------------------

@pytest.fixture
def tiny_gpt2_zip(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    folder = tmp_path / "gpt2-tiny"
    GPT2LMHeadModel(GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=2, n_head=4)
                    ).save_pretrained(folder)
    zp = tmp_path / "gpt2-tiny.zip"
    with zipfile.ZipFile(zp, "w") as zf:
        for f in sorted(folder.iterdir()):
            zf.write(f, f"gpt2-tiny/{f.name}")
    return zp, folder


@pytest.mark.slow
def test_hf_zip_runs_the_forward_pass(tiny_gpt2_zip):
    zp, folder = tiny_gpt2_zip
    with open_checkpoint(zp) as ckpt:
        cap = attention_maps.capture_activations(ckpt, device="cpu")
        scale = ckpt.meta.attn_scale
    with open_checkpoint(folder) as ckpt:
        ref = attention_maps.capture_activations(ckpt, device="cpu")
    assert cap.tokenizer == "bytes" and len(cap.layers) == 2
    for lc, lr in zip(cap.layers, ref.layers):
        torch.testing.assert_close(lc.attn, lr.attn)
        T = lc.logits.shape[-1]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        ours = (lc.logits * scale).masked_fill(~mask, float("-inf")).softmax(-1)
        torch.testing.assert_close(ours, lc.attn, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_hf_zip_with_model_code_is_not_run(tmp_path, tiny_gpt2_zip):
    zp, folder = tiny_gpt2_zip
    (folder / "modeling_evil.py").write_text("raise SystemExit('ran')\n")
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as zf:
        for f in sorted(folder.iterdir()):
            zf.write(f, f"gpt2-tiny/{f.name}")
    with open_checkpoint(evil) as ckpt:
        with pytest.raises(runnable.NoForwardPass) as e:
            attention_maps.capture_activations(ckpt, device="cpu")
    assert str(e.value) == (f"{evil} (member gpt2-tiny): {runnable.REMOTE_CODE_NOTE} (modeling_evil.py beside it); "
                            "weight-level metrics only")
