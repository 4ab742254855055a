"""llama2.c exports (v0, v1, v2) and tokenizer.bin, every file built in code
(tests/loaders/llama2c_files.py writes karpathy/llama2.c export.py's byte order)."""
from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from loaders.checkpoints import open_checkpoint
from loaders.errors import CheckpointFormatError, UnsafeCheckpointError
from loaders.llama2c import Llama2cTokenizer, exported_from, read_tokenizer
from loaders.sources import is_checkpoint_candidate, load_plain_pickle, open_source
from tests.loaders.llama2c_files import llama_state, toy_pieces, write_bin, write_tokenizer

GEOM = dict(n_heads=4, n_kv=2, seq_len=32)


def q80(t: torch.Tensor, g: int) -> torch.Tensor:
    """export.py's quantize_q80 round trip in numpy float32 (what a v2 file holds)."""
    w = t.numpy().reshape(-1, g).astype(np.float32)
    s = np.abs(w).max(axis=1) / np.float32(127.0)
    q = np.round(w / s[:, None]).astype(np.int8)
    return torch.from_numpy((q.astype(np.float32) * s[:, None]).reshape(t.shape))


@pytest.mark.parametrize("version", [0, 1, 2])
@pytest.mark.parametrize("shared", [True, False])
def test_every_tensor_reads_back(tmp_path, version, shared):
    sd = llama_state(shared=shared)
    path = write_bin(tmp_path / "model.bin", sd, version=version, group_size=8, **GEOM)
    src = open_source(path)
    try:
        assert src.format == f"llama2c-v{version}"
        assert src.config == {"dim": 16, "hidden_dim": 40, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                              "vocab_size": 300, "max_seq_len": 32, "shared_classifier": shared}
        keys = set(src.keys())
        assert ("output.weight" in keys) == (not shared)
        assert ({"freqs_cos", "freqs_sin"} <= keys) == (version == 0)
        for k in keys - {"freqs_cos", "freqs_sin"}:
            quantized = version == 2 and k.endswith(("wq.weight", "wk.weight", "wv.weight", "wo.weight",
                                                     "w1.weight", "w2.weight", "w3.weight",
                                                     "tok_embeddings.weight", "output.weight"))
            assert src.dtype(k) == ("int8" if quantized else "float32")
            want = q80(sd[k], 8) if quantized else sd[k]
            assert src.shape(k) == tuple(sd[k].shape)
            torch.testing.assert_close(src.get(k), want, rtol=0, atol=0)
        if version == 0:
            hs = 4
            ang = torch.outer(torch.arange(32.0), 1.0 / 10000 ** (torch.arange(0, hs, 2) / hs))
            torch.testing.assert_close(src.get("freqs_cos"), ang.cos())
    finally:
        src.close()
    with open_checkpoint(path) as ckpt:
        m = ckpt.meta
        assert (m.architecture, m.norm, m.positions, m.n_heads, m.n_kv_heads, m.d_head) == (
            "llama_meta", "rmsnorm", "rotary", 4, 2, 4)
        # 300x16 embedding, per layer 2 norms + 16x16 q, o + 8x16 k, v + 3 x 40x16 MLP, final norm
        per_layer = 2 * 16 + 2 * 256 + 2 * 128 + 3 * 640
        assert m.params_total == 300 * 16 * (1 if shared else 2) + 2 * per_layer + 16
        assert m.params_attention == 2 * (2 * 256 + 2 * 128)
        assert m.dtype == ("int8" if version == 2 else "float32")
        torch.testing.assert_close(ckpt.layer(1).W_K[1], sd["layers.1.attention.wk.weight"][4:8].T
                                   if version != 2 else q80(sd["layers.1.attention.wk.weight"], 8)[4:8].T)


def test_detected_by_content_not_by_name(tmp_path):
    path = write_bin(tmp_path / "weights.model", llama_state(), version=1, **GEOM)
    with open_checkpoint(path) as ckpt:
        assert ckpt.meta.architecture == "llama_meta"
    assert is_checkpoint_candidate(write_bin(tmp_path / "m.bin", llama_state(), version=0, **GEOM))
    # a nanoGPT data file (uint16 token ids) named .bin is not a checkpoint
    data = tmp_path / "train.bin"
    np.arange(1000, dtype=np.uint16).tofile(data)
    assert not is_checkpoint_candidate(data)


def test_truncated_v0_names_the_file_and_sizes(tmp_path):
    path = write_bin(tmp_path / "model.bin", llama_state(), version=0, **GEOM)
    full = path.stat().st_size
    os.truncate(path, full - 100)
    with pytest.raises(CheckpointFormatError) as e:
        open_source(path)
    assert str(e.value) == (
        f"{path}: llama2.c v0 header (dim 16, hidden_dim 40, n_layers 2, n_heads 4, n_kv_heads 2, "
        f"vocab_size 300, seq_len 32) implies {full:,} bytes but the file has {full - 100:,}: truncated")


def test_v1_header_errors(tmp_path):
    path = write_bin(tmp_path / "model.bin", llama_state(), version=1, **GEOM)
    raw = bytearray(path.read_bytes())
    bad = tmp_path / "bad.bin"
    bad.write_bytes(bytes(raw[:200]))
    with pytest.raises(CheckpointFormatError) as e:
        open_source(bad)
    assert str(e.value) == (f"{bad}: llama2.c v1 export is 200 bytes, shorter than its 256-byte header; "
                            "the file is truncated")
    struct.pack_into("<i", raw, 24, 3)                            # n_kv_heads 3 of 4 heads
    bad.write_bytes(bytes(raw))
    with pytest.raises(CheckpointFormatError) as e:
        open_source(bad)
    assert str(e.value) == f"{bad}: llama2.c v1 header is inconsistent: n_kv_heads 3 does not divide n_heads 4"
    struct.pack_into("<i", raw, 4, 7)
    bad.write_bytes(bytes(raw))
    with pytest.raises(CheckpointFormatError) as e:
        open_source(bad)
    assert str(e.value) == (f"{bad}: llama2.c export (magic \"ak42\") of version 7; qkvscope reads "
                            "versions 0, 1 and 2")
    assert is_checkpoint_candidate(bad)                           # shown as an error, not skipped


def test_v2_group_size_must_divide(tmp_path):
    path = write_bin(tmp_path / "model.bin", llama_state(), version=2, group_size=8, **GEOM)
    raw = bytearray(path.read_bytes())
    struct.pack_into("<i", raw, 37, 7)
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointFormatError) as e:
        open_source(path)
    assert str(e.value) == f"{path}: llama2.c v2 group_size 7 does not divide the size of tok_embeddings.weight"


def test_output_folder_skips_the_tokenizer(tmp_path):
    write_bin(tmp_path / "model.bin", llama_state(), version=0, **GEOM)
    write_tokenizer(tmp_path / "tokenizer.bin", *toy_pieces(300))
    src = open_source(tmp_path)
    try:
        assert src.extras["folder_file"] == "model.bin"
        assert src.extras["folder_note"] == "skipped llama2.c tokenizer: tokenizer.bin"
    finally:
        src.close()
    torch.save({"model": llama_state(), "model_args": {"dim": 16, "n_layers": 2, "n_heads": 4,
                                                       "n_kv_heads": 2}}, tmp_path / "ckpt.pt")
    src = open_source(tmp_path)
    try:
        assert src.extras["folder_file"] == "ckpt.pt"
        assert src.extras["folder_note"] == ("skipped llama2.c tokenizer: tokenizer.bin; chose ckpt.pt over "
                                             "its llama2.c export model.bin")
    finally:
        src.close()


def test_tokenizer_encode_known_answer(tmp_path):
    pieces, scores = toy_pieces(300)
    tok = read_tokenizer(write_tokenizer(tmp_path / "tokenizer.bin", pieces, scores))
    assert len(tok) == 300 and tok.pieces_[259] == " "
    ids = tok.encode("the cat,é")
    # dummy prefix " the" / " cat" merged by score; ',' and 'é' (not pieces) as <0xXX> bytes (id b + 3)
    assert tok.pieces(ids) == [" the", " cat", "<0x2C>", "<0xC3>", "<0xA9>"]
    assert ids[2:] == [0x2C + 3, 0xC3 + 3, 0xA9 + 3]
    # the merge order follows the scores: " t"+"h" needs " th" (score -6) before " the" (-8)
    assert Llama2cTokenizer(pieces, scores).encode("th") == [pieces.index(" th")]


def test_truncated_tokenizer(tmp_path):
    path = write_tokenizer(tmp_path / "tokenizer.bin", *toy_pieces(300))
    os.truncate(path, path.stat().st_size - 3)
    with pytest.raises(CheckpointFormatError) as e:
        read_tokenizer(path)
    assert "truncated" in str(e.value) and str(e.value).startswith(f"{path}: llama2.c tokenizer token 299")


def test_plain_pickle_loads_and_code_is_refused(tmp_path):
    meta = tmp_path / "meta.pkl"
    with open(meta, "wb") as f:
        pickle.dump({"vocab_size": 3, "itos": {0: "a", 1: "b", 2: "\n"}, "stoi": {"a": 0, "b": 1, "\n": 2}}, f)
    assert load_plain_pickle(meta) == {"vocab_size": 3, "itos": {"0": "a", "1": "b", "2": "\n"},
                                       "stoi": {"a": 0, "b": 1, "\n": 2}}
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    bad = tmp_path / "evil.pkl"
    bad.write_bytes(pickle.dumps({"stoi": Evil()}))
    with pytest.raises(UnsafeCheckpointError) as e:
        load_plain_pickle(bad)
    assert str(e.value) == (f"{bad}: refused to unpickle: the pickle calls posix.system, which is not a plain "
                            "value (a vocabulary pickle holds only dicts, strings and numbers)")
    assert not marker.exists()
    cut = tmp_path / "cut.pkl"
    cut.write_bytes(meta.read_bytes()[:-5])
    with pytest.raises(CheckpointFormatError) as e:
        load_plain_pickle(cut)
    assert str(e.value).startswith(f"{cut}: pickle cannot be read (")


def test_ingest_of_an_output_folder_stores_the_model_and_names_the_tokenizer(tmp_path):
    from loaders.ingest import ingest_paths
    from loaders.store import Store

    out = tmp_path / "out"
    out.mkdir()
    write_bin(out / "model.bin", llama_state(), version=0, **GEOM)
    write_tokenizer(out / "tokenizer.bin", *toy_pieces(300))
    rep = ingest_paths(Store(tmp_path / "db.duckdb"), [out])
    got = {f.path.rsplit("/", 1)[1]: (f.kind, f.status, f.reason) for f in rep.files}
    assert got["model.bin"][:2] == ("checkpoint", "added")
    assert got["tokenizer.bin"] == ("unknown", "skipped", "llama2.c tokenizer: read as the vocabulary of the "
                                                          "checkpoint beside it, not a checkpoint")


# ---- a model.bin exported from the ckpt.pt beside it: one checkpoint ----------------------

def _export_legacy(ckpt_path: Path, out: Path) -> Path:
    """karpathy/llama2.c ``export.py --version 0`` (``legacy_export``) of a train.py ``ckpt.pt``,
    reimplemented: its ``load_checkpoint`` (``model_args``, ``model`` without ``_orig_mod.``),
    then ``write_bin``'s v0 byte order (header, embeddings, per-kind layer tensors, norm, rotary
    tables; the classifier only when unshared)."""
    ck = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    sd = {k.removeprefix("_orig_mod."): v for k, v in ck["model"].items()}
    args = ck["model_args"]
    return write_bin(out, sd, version=0, n_heads=args["n_heads"], n_kv=args["n_kv_heads"] or args["n_heads"],
                     seq_len=args["max_seq_len"])


def _train_checkpoint(path: Path, seed: int = 0) -> Path:
    sd = llama_state(seed=seed)
    torch.save({"model": {"_orig_mod." + k: v for k, v in sd.items()}, "optimizer": {},
                "model_args": {"dim": 16, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 300,
                               "multiple_of": 8, "max_seq_len": 32, "dropout": 0.0},
                "iter_num": 500, "best_val_loss": 2.5, "config": {"weight_decay": 0.1}}, path)
    return path


def _ingest_folder(tmp_path, folder):
    from loaders.ingest import ingest_paths
    from loaders.store import Store

    store = Store(tmp_path / "q.duckdb")
    report = ingest_paths(store, [folder])
    return store, {Path(f.path).name: f for f in report.files}


def test_export_beside_its_checkpoint_is_one_checkpoint(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    _export_legacy(_train_checkpoint(out / "ckpt.pt"), out / "model.bin")
    assert exported_from(out / "model.bin") == out / "ckpt.pt"
    store, files = _ingest_folder(tmp_path, out)
    assert files["ckpt.pt"].status == "added"
    assert (files["model.bin"].status, files["model.bin"].checkpoint_id, files["model.bin"].reason) == (
        "unchanged", files["ckpt.pt"].checkpoint_id,
        "the llama2.c export of ckpt.pt beside it: the same weights, stored once as ckpt.pt")
    assert len(store.checkpoints()) == 1
    # a second scan finds it in the journal
    _, again = _ingest_folder(tmp_path, out)
    assert (again["model.bin"].status, again["model.bin"].checkpoint_id) == (
        "unchanged", files["ckpt.pt"].checkpoint_id)


def test_export_of_other_weights_is_a_checkpoint_of_its_own(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    _train_checkpoint(out / "ckpt.pt")
    _export_legacy(_train_checkpoint(tmp_path / "other.pt", seed=1), out / "model.bin")
    assert exported_from(out / "model.bin") is None
    store, files = _ingest_folder(tmp_path, out)
    assert (files["ckpt.pt"].status, files["model.bin"].status) == ("added", "added")
    assert len(store.checkpoints()) == 2


def test_q8_export_is_not_the_same_weights(tmp_path):
    sd = llama_state()
    _train_checkpoint(tmp_path / "ckpt.pt")
    write_bin(tmp_path / "model.bin", sd, version=2, n_heads=4, n_kv=2, seq_len=32)
    assert exported_from(tmp_path / "model.bin") is None


def test_realworld_ckpt_and_its_legacy_export(tmp_path, realworld):
    """saltyduckegg/llama2xs.c's out/ckpt.pt (MIT, tests/../shared/realworld) and its v0 export."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "ckpt.pt").write_bytes((realworld / "checkpoints/llama2c-train-llama2xs/ckpt.pt").read_bytes())
    _export_legacy(out / "ckpt.pt", out / "model.bin")
    assert exported_from(out / "model.bin") == out / "ckpt.pt"
    store, files = _ingest_folder(tmp_path, out)
    assert (files["model.bin"].status, files["model.bin"].checkpoint_id) == (
        "unchanged", files["ckpt.pt"].checkpoint_id)
    [row] = store.checkpoints()
    assert (row["architecture"], row["n_layers"], row["n_heads"], row["n_kv_heads"]) == ("llama_meta", 5, 8, 4)
