"""Checkpoint container formats (loaders/sources/): every format written in
code, the real-world samples, and every bad input with its exact message."""
from __future__ import annotations

import re

import hashlib
import json
import os
import pickle
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from loaders.errors import CheckpointFormatError, UnsafeCheckpointError
from loaders.sources import (EXPECTED, SafetensorsSource, ShardedSource, TorchSource, ZipSource,
                             content_hash, is_checkpoint_candidate, open_source)

HINT = ("  (qkvscope loads only plain tensors and containers; "
        "re-save the weights with safetensors)")


def small_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "transformer.h.0.attn.c_attn.weight": torch.randn(24, 8, generator=g),
        "transformer.h.0.attn.c_proj.weight": torch.randn(8, 8, generator=g),
        "transformer.h.0.attn.c_attn.bias": torch.randn(24, generator=g),
    }


def st_bytes(header: dict, data: bytes, *, length: int | None = None) -> bytes:
    """A safetensors file by hand: u64 little-endian header length, JSON, data."""
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h) if length is None else length) + h + data


def assert_same(src, sd: dict[str, torch.Tensor]) -> None:
    assert sorted(src.keys()) == sorted(sd)
    for k, v in sd.items():
        assert src.shape(k) == tuple(v.shape)
        assert src.dtype(k) == str(v.dtype).replace("torch.", "")
        torch.testing.assert_close(src.get(k), v, rtol=0, atol=0)


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16,
                     bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


# ----------------------------------------------------------------------------
# safetensors
# ----------------------------------------------------------------------------

def test_safetensors_single_file_keys_shapes_dtypes_metadata(tmp_path):
    sd = {"a": torch.randn(3, 4), "b": torch.randn(2, 5).to(torch.bfloat16),
          "c": torch.arange(6, dtype=torch.int64).reshape(2, 3)}
    p = tmp_path / "w.safetensors"
    save_file(sd, str(p), metadata={"format": "pt", "step": "100"})
    with open_source(p) as src:
        assert isinstance(src, SafetensorsSource)
        assert src.format == "safetensors"
        assert src.path == str(p)
        assert src.config == {}
        assert src.extras == {"safetensors_metadata": {"format": "pt", "step": "100"}}
        assert_same(src, sd)
        assert src.numel("b") == 10


@pytest.mark.parametrize("reader", ["pread", "mmap"])
def test_safetensors_readers_agree(tmp_path, reader):
    sd = {"w": torch.randn(4, 3).to(torch.bfloat16), "scalar": torch.tensor(2.5),
          "empty": torch.zeros(0, 3), "i8": torch.arange(-4, 4, dtype=torch.int8),
          "h": torch.randn(5).half()}
    p = tmp_path / "r.safetensors"
    save_file(sd, str(p))
    src = SafetensorsSource(p, reader=reader)
    assert src.reader == reader
    assert_same(src, sd)
    src.close()
    with pytest.raises(ValueError, match="source is closed"):
        src.get("w")


def test_pread_tensor_is_the_callers_own(tmp_path):
    p = tmp_path / "own.safetensors"
    save_file({"w": torch.ones(3)}, str(p))
    before = p.read_bytes()
    with open_source(p) as src:
        t = src.get("w")
        t.mul_(5)                                 # the caller's copy; the file is untouched
        torch.testing.assert_close(src.get("w"), torch.ones(3))
    assert p.read_bytes() == before


def test_unknown_key(tmp_path):
    p = tmp_path / "k.safetensors"
    save_file({"w": torch.ones(3)}, str(p))
    with open_source(p) as src, pytest.raises(KeyError, match="no tensor named 'v'"):
        src.get("v")


def test_safetensors_detected_by_content_not_suffix(tmp_path):
    sd = {"x": torch.ones(2, 2)}
    p = tmp_path / "weights.bin"                  # wrong suffix, safetensors content
    save_file(sd, str(p))
    with open_source(p) as src:
        assert src.format == "safetensors"
        assert_same(src, sd)


@pytest.mark.parametrize("suffix", [".safetensors", ".bin"])
@pytest.mark.parametrize("header", [640, 896, 1152, 1408])
def test_a_safetensors_header_length_that_starts_like_a_pickle_is_still_safetensors(tmp_path, header, suffix):
    # a header of 896 bytes starts the file with 80 03 00..: a pickle's PROTO 3 to a sniff that
    # looked for pickles first, which sent a 2-layer TinyLlama-shaped bench checkpoint to the
    # unpickler ("refused to unpickle: Unsupported operand 0")
    sd = {"model.layers.0.self_attn.q_proj.weight": torch.ones(4, 4)}
    p = tmp_path / f"model{suffix}"
    for pad in range(header):                                   # metadata that brings the header there
        save_file(sd, str(p), metadata={"pad": "x" * pad})
        if struct.unpack("<Q", p.read_bytes()[:8])[0] == header:
            break
    head = p.read_bytes()[:9]
    assert head[0] == 0x80 and 2 <= head[1] <= 5 and head[8:9] == b"{"
    assert is_checkpoint_candidate(p)
    with open_source(p) as src:
        assert src.format == "safetensors"
        assert_same(src, sd)


def test_safetensors_reads_lazily(tmp_path):
    """Shapes come from the header; tensor data is read at ``get``, not at open:
    bytes rewritten on disk after opening show up in ``get``."""
    a, b = torch.zeros(64, dtype=torch.float32), torch.zeros(64, dtype=torch.float32)
    p = tmp_path / "lazy.safetensors"
    save_file({"a": a, "b": b}, str(p))
    src = open_source(p)
    assert src.shape("b") == (64,) and src.dtype("b") == "float32"
    n = struct.unpack("<Q", p.read_bytes()[:8])[0]
    header = json.loads(p.read_bytes()[8:8 + n])
    begin, end = header["b"]["data_offsets"]
    new_b = torch.arange(64, dtype=torch.float32)
    with open(p, "r+b") as f:                     # same size, in place
        f.seek(8 + n + begin)
        f.write(new_b.numpy().tobytes())
    torch.testing.assert_close(src.get("b"), new_b, rtol=0, atol=0)
    torch.testing.assert_close(src.get("a"), a, rtol=0, atol=0)
    src.close()


F32x2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}

BAD_SAFETENSORS = [
    ("short", b"\x01\x02\x03",
     "safetensors file is 3 bytes, shorter than the 8-byte header length prefix"),
    ("huge_header", struct.pack("<Q", 100_000_001) + b"{}",
     "safetensors header length is 100000001 bytes, over the 100000000-byte limit"),
    ("header_past_end", struct.pack("<Q", 4096) + b"{" + b" " * 99,
     "safetensors header says 4096 bytes but the file has 100 after the length prefix"),
    ("not_json", struct.pack("<Q", 5) + b"{abc}",
     "safetensors header is not valid JSON (Expecting property name enclosed in double quotes "
     "at byte 1 of the header)"),
    ("not_utf8", struct.pack("<Q", 3) + b"{\xff}",
     "safetensors header is not UTF-8 (byte 1 of the header)"),
    ("array", struct.pack("<Q", 2) + b"[]",
     "safetensors header is a JSON list, expected an object"),
    ("bad_metadata", st_bytes({"__metadata__": {"step": 3}}, b""),
     "safetensors __metadata__ must map strings to strings"),
    ("missing_fields", st_bytes({"w": {"dtype": "F32"}}, b""),
     "safetensors tensor 'w': expected an object with dtype, shape and data_offsets, "
     "found {\"dtype\": \"F32\"}"),
    ("unknown_dtype", st_bytes({"w": {**F32x2, "dtype": "F7"}}, b"\0" * 8),
     "safetensors tensor 'w' has unknown dtype 'F7' (known: BF16, BOOL, C64, F16, F32, F64, "
     "F8_E4M3, F8_E5M2, F8_E8M0, I16, I32, I64, I8, U16, U32, U64, U8)"),
    ("bad_shape", st_bytes({"w": {**F32x2, "shape": [2, -1]}}, b"\0" * 8),
     "safetensors tensor 'w' shape [2, -1] is not a list of non-negative integers"),
    ("bad_offsets", st_bytes({"w": {**F32x2, "data_offsets": [8, 0]}}, b"\0" * 8),
     "safetensors tensor 'w' data_offsets [8, 0] is not [begin, end] with 0 <= begin <= end"),
    ("past_data", st_bytes({"w": {**F32x2, "data_offsets": [0, 8]}}, b"\0" * 4),
     "safetensors tensor 'w' data_offsets [0, 8] end beyond the data area of 4 bytes"),
    ("size_mismatch", st_bytes({"w": {**F32x2, "shape": [3]}}, b"\0" * 8),
     "safetensors tensor 'w' has 8 bytes at data_offsets [0, 8] but shape [3] of F32 needs 12"),
    ("overlap", st_bytes({"a": F32x2, "b": {**F32x2, "data_offsets": [4, 12]}}, b"\0" * 12),
     "safetensors tensors 'a' and 'b' overlap (bytes 4..8 of the data area)"),
    ("gap", st_bytes({"a": F32x2, "b": {**F32x2, "data_offsets": [12, 20]}}, b"\0" * 20),
     "safetensors data area bytes 8..12 belong to no tensor (gap before 'b')"),
    ("trailing", st_bytes({"a": F32x2}, b"\0" * 16),
     "safetensors data area has 16 bytes but the tensors end at byte 8"),
]


@pytest.mark.parametrize("name,content,problem", BAD_SAFETENSORS, ids=[c[0] for c in BAD_SAFETENSORS])
def test_bad_safetensors_exact_messages(tmp_path, name, content, problem):
    p = tmp_path / f"{name}.safetensors"
    p.write_bytes(content)
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(p)
    assert str(exc.value) == f"{p}: {problem}"
    assert exc.value.path == str(p) and exc.value.problem == problem


def test_hand_written_safetensors_accepted(tmp_path):
    """The byte layout the bad cases start from is itself valid."""
    p = tmp_path / "ok.safetensors"
    data = torch.tensor([1.5, -2.0]).numpy().tobytes()
    p.write_bytes(st_bytes({"__metadata__": {"k": "v"}, "w": F32x2}, data))
    with open_source(p) as src:
        torch.testing.assert_close(src.get("w"), torch.tensor([1.5, -2.0]))
        assert src.extras["safetensors_metadata"] == {"k": "v"}


# ----------------------------------------------------------------------------
# Sharded sets and Hugging Face folders
# ----------------------------------------------------------------------------

@pytest.fixture
def hf_sharded(tmp_path):
    model = tiny_gpt2()
    out = tmp_path / "hf"
    model.save_pretrained(out, max_shard_size="20KB")
    return model, out


def test_hf_folder_sharded_safetensors(hf_sharded):
    model, out = hf_sharded
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2
    with open_source(out) as src:
        assert isinstance(src, ShardedSource)
        assert src.format == "safetensors-sharded"
        assert src.path == str(out)
        assert src.config == json.loads((out / "config.json").read_text())
        assert src.extras["shards"] == shards
        assert src.extras["folder_file"] == "model.safetensors.index.json"
        sd = model.state_dict()
        assert sorted(src.keys()) == sorted(index["weight_map"])
        for k in src.keys():
            assert src.shape(k) == tuple(sd[k].shape)
            torch.testing.assert_close(src.get(k), sd[k], rtol=0, atol=0)


def test_index_file_opened_directly(hf_sharded):
    _, out = hf_sharded
    with open_source(out / "model.safetensors.index.json") as src:
        # opened by itself, the index takes the model's config.json beside it
        assert src.config == json.loads((out / "config.json").read_text())
        assert src.extras["config_file"] == "config.json"
        assert "transformer.h.0.attn.c_attn.weight" in src


def test_hf_folder_single_safetensors(tmp_path):
    model = tiny_gpt2()
    model.save_pretrained(tmp_path / "hf")
    with open_source(tmp_path / "hf") as src:
        assert src.format == "safetensors"
        assert src.config["n_layer"] == 2
        assert src.extras["folder_file"] == "model.safetensors"
        sd = model.state_dict()
        torch.testing.assert_close(src.get("transformer.h.1.attn.c_attn.weight"),
                                   sd["transformer.h.1.attn.c_attn.weight"])


def write_bin_shards(folder: Path, sd: dict[str, torch.Tensor], n: int) -> None:
    """Hugging Face's pytorch_model-0000k-of-0000n.bin + index layout."""
    folder.mkdir(parents=True, exist_ok=True)
    keys = sorted(sd)
    weight_map = {}
    for i in range(n):
        name = f"pytorch_model-{i + 1:05d}-of-{n:05d}.bin"
        part = {k: sd[k] for k in keys[i::n]}
        torch.save(part, folder / name)
        weight_map.update({k: name for k in part})
    (folder / "pytorch_model.bin.index.json").write_text(
        json.dumps({"metadata": {"total_size": 123}, "weight_map": weight_map}))


def test_hf_folder_sharded_pytorch_bin(tmp_path):
    model = tiny_gpt2()
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    out = tmp_path / "hfbin"
    write_bin_shards(out, sd, 3)
    model.config.to_json_file(out / "config.json")
    with open_source(out) as src:
        assert src.format == "pytorch-sharded"
        assert src.extras["index_metadata"] == {"total_size": 123}
        assert src.config["n_embd"] == 32
        assert_same(src, sd)


def test_hf_folder_single_pytorch_bin(tmp_path):
    model = tiny_gpt2()
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    out = tmp_path / "hfbin1"
    out.mkdir()
    torch.save(sd, out / "pytorch_model.bin")
    model.config.to_json_file(out / "config.json")
    with open_source(out) as src:
        assert src.format == "pytorch-zip"
        assert src.config["model_type"] == "gpt2"
        assert_same(src, sd)


def test_sharded_missing_shards_listed_sorted(hf_sharded):
    _, out = hf_sharded
    index = out / "model.safetensors.index.json"
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    (out / shards[2]).unlink()
    (out / shards[0]).unlink()
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(out)
    assert str(exc.value) == (f"{index}: shard index names 2 missing shard file(s): "
                              f"{shards[0]}, {shards[2]}")


def test_sharded_index_names_tensor_shard_lacks(tmp_path):
    save_file({"a": torch.ones(2)}, str(tmp_path / "s1.safetensors"))
    idx = tmp_path / "model.safetensors.index.json"
    idx.write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}}))
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(idx)
    assert str(exc.value) == f"{idx}: shard index maps 1 tensor(s) to s1.safetensors that it does not hold: b"


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd"])
def test_sharded_index_outside_folder_refused(tmp_path, shard):
    idx = tmp_path / "model.safetensors.index.json"
    idx.write_text(json.dumps({"weight_map": {"a": shard}}))
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(idx)
    assert str(exc.value) == (f"{idx}: shard index names '{shard}', outside the index's folder; "
                              f"expected plain file names")


def test_sharded_index_without_weight_map(tmp_path):
    idx = tmp_path / "model.safetensors.index.json"
    idx.write_text(json.dumps({"metadata": {}}))
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(idx)
    assert str(exc.value) == (f"{idx}: shard index has no weight_map; expected "
                              f"{{\"weight_map\": {{tensor name: shard file}}}}")


def test_config_json_beside_other_checkpoint_file(tmp_path):
    sd = small_state_dict()
    torch.save(sd, tmp_path / "weights.pt")
    (tmp_path / "config.json").write_text(json.dumps({"n_layer": 1}))
    with open_source(tmp_path) as src:
        assert src.config == {"n_layer": 1}
        assert src.extras["folder_file"] == "weights.pt"
        assert_same(src, sd)
    torch.save(nanogpt_ckpt(sd), tmp_path / "weights.pt")      # its own model_args win
    with open_source(tmp_path) as src:
        assert src.config["query_mode"] == "identity"
    assert is_checkpoint_candidate(tmp_path)


def test_hf_folder_bad_config_json(tmp_path):
    save_file({"a": torch.ones(2)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(tmp_path)
    assert str(exc.value) == f"{tmp_path / 'config.json'}: config is a JSON list, expected an object"


# ----------------------------------------------------------------------------
# PyTorch files
# ----------------------------------------------------------------------------

def nanogpt_ckpt(sd):
    model = {f"_orig_mod.{k}": v for k, v in sd.items()}
    return {"model": model, "optimizer": {"state": {0: {"exp_avg": torch.ones(3)}}, "param_groups": []},
            "model_args": {"n_layer": 1, "n_head": 2, "n_embd": 8, "query_mode": "identity"},
            "iter_num": 500, "best_val_loss": torch.tensor(2.25), "config": {"weight_decay": 0.03125}}


def paper_ckpt(sd):
    return {"model_state_dict": sd, "model_config": {"variant": "Q-K=V", "n_layer": 1},
            "train_config": {"lr": 3e-4}, "step": 1000, "tokens_seen": torch.tensor(65536),
            "val_metrics": {"loss": torch.tensor(3.5), "ppl": 33.1}}


def ddp_ckpt(sd):
    return {"state_dict": {f"module._orig_mod.{k}": v for k, v in sd.items()}, "epoch": 3}


def nested_ckpt(sd):
    tree: dict = {}
    for k, v in sd.items():
        head, rest = k.split(".", 1)
        tree.setdefault(head, {})[rest] = v
    return {"model": tree}


PT_LAYOUTS = [
    ("plain", lambda sd: dict(sd), {}, {}),
    ("nanogpt", nanogpt_ckpt,
     {"n_layer": 1, "n_head": 2, "n_embd": 8, "query_mode": "identity"},
     {"model_args": {"n_layer": 1, "n_head": 2, "n_embd": 8, "query_mode": "identity"},
      "iter_num": 500, "best_val_loss": 2.25, "config": {"weight_decay": 0.03125}}),
    ("projection_sharing", paper_ckpt, {"variant": "Q-K=V", "n_layer": 1},
     {"model_config": {"variant": "Q-K=V", "n_layer": 1}, "train_config": {"lr": 3e-4},
      "step": 1000, "tokens_seen": 65536.0, "val_metrics": {"loss": 3.5, "ppl": 33.1}}),
    ("ddp_compiled", ddp_ckpt, {}, {"epoch": 3}),
    ("nested", nested_ckpt, {}, {}),
]


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize("name,build,config,extras", PT_LAYOUTS, ids=[c[0] for c in PT_LAYOUTS])
def test_pytorch_layouts(tmp_path, name, build, config, extras, legacy):
    sd = small_state_dict()
    p = tmp_path / f"{name}.pt"
    torch.save(build(sd), p, _use_new_zipfile_serialization=not legacy)
    with open_source(p) as src:
        assert isinstance(src, TorchSource)
        assert src.format == ("pytorch-legacy" if legacy else "pytorch-zip")
        assert src.config == config
        assert src.extras == extras
        assert_same(src, sd)


def test_numpy_scalars_beside_weights_are_numbers(tmp_path):
    p = tmp_path / "np.pt"
    torch.save({"model": small_state_dict(), "best_val_loss": np.float64(1.5), "iter_num": np.int64(7)}, p)
    with open_source(p) as src:
        assert src.extras == {"best_val_loss": 1.5, "iter_num": 7}


def test_prefix_collision_is_an_error(tmp_path):
    p = tmp_path / "clash.pt"
    torch.save({"module.w": torch.ones(2), "w": torch.zeros(2)}, p)
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(p)
    assert str(exc.value) == (f"{p}: tensor names 'module.w' and 'w' both become 'w' after "
                              f"removing the '_orig_mod.' and 'module.' prefixes")


@pytest.mark.parametrize("suffix", [".pt", ".pth", ".ckpt", ".bin"])
def test_pytorch_suffixes(tmp_path, suffix):
    sd = small_state_dict(1)
    p = tmp_path / f"w{suffix}"
    torch.save(sd, p)
    with open_source(p) as src:
        assert_same(src, sd)


def test_single_tensor_pt_is_not_a_state_dict(tmp_path):
    p = tmp_path / "tensor.pt"
    torch.save(torch.zeros(5, 3), p)
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(p)
    assert str(exc.value) == (f"{p}: holds a single tensor, not a state dict (shape [5, 3], float32); "
                              f"expected a mapping of names to tensors (training-log tensors are read "
                              f"by the log readers)")
    assert is_checkpoint_candidate(p)


def test_list_pt_is_not_a_state_dict(tmp_path):
    p = tmp_path / "list.pt"
    torch.save([torch.zeros(2)], p)
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(p)
    assert str(exc.value) == f"{p}: holds a list, not a state dict; expected a mapping of names to tensors"


def test_dict_without_tensors(tmp_path):
    p = tmp_path / "meta.pt"
    torch.save({"step": 3, "config": {"a": 1}}, p)
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(p)
    assert str(exc.value) == (f"{p}: holds no weight tensors (top-level keys: config, step); expected a "
                              f"state dict or a dict with 'model', 'model_state_dict' or 'state_dict'")


class Payload:
    """Unpickling this runs ``touch MARKER``: what a malicious checkpoint does."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _torch_zip(path, obj):
    torch.save(obj, path)


def _torch_legacy(path, obj):
    torch.save(obj, path, _use_new_zipfile_serialization=False)


def _pickle2(path, obj):
    path.write_bytes(pickle.dumps(obj, protocol=2))


def _pickle4(path, obj):
    path.write_bytes(pickle.dumps(obj, protocol=4))


@pytest.mark.parametrize("writer", [_torch_zip, _torch_legacy, _pickle2, _pickle4],
                         ids=["torch_zip", "torch_legacy", "pickle2", "pickle4"])
def test_pickle_payload_refused_and_never_run(tmp_path, writer):
    marker = tmp_path / "MARKER"
    p = tmp_path / "evil.pt"
    writer(p, {"model": {"w": torch.ones(2)}, "x": Payload(marker)})
    with pytest.raises(UnsafeCheckpointError) as exc:
        open_source(p)
    assert not marker.exists()
    func = f"{os.system.__module__}.system"
    assert str(exc.value) == (f"{p}: refused to unpickle: the pickle calls {func}, which is not a "
                              f"tensor or container{HINT}")
    assert not marker.exists()


def test_payload_in_a_folder_and_zip_never_runs(tmp_path):
    marker = tmp_path / "MARKER"
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"model": {"w": torch.ones(2)}, "x": Payload(marker)}, run / "ckpt.pt")
    zp = tmp_path / "run.zip"
    with zipfile.ZipFile(zp, "w") as zf:
        zf.write(run / "ckpt.pt", "run/ckpt.pt")
    with pytest.raises(UnsafeCheckpointError):
        open_source(run)
    with pytest.raises(UnsafeCheckpointError) as exc:
        open_source(zp)
    assert str(exc.value).startswith(f"{zp}: run/ckpt.pt: refused to unpickle: ")
    assert not marker.exists()


def test_truncated_zip_pt(tmp_path):
    p = tmp_path / "trunc.pt"
    torch.save(small_state_dict(), p)
    p.write_bytes(p.read_bytes()[:300])
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(p)
    assert str(exc.value) == (f"{p}: starts like a zip file (PyTorch or upload) but its directory cannot "
                              f"be read (File is not a zip file); the file is truncated or corrupt")


def test_truncated_legacy_pt(tmp_path):
    p = tmp_path / "trunc_legacy.pt"
    torch.save(small_state_dict(), p, _use_new_zipfile_serialization=False)
    data = p.read_bytes()
    p.write_bytes(data[:len(data) - 100])
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(p)
    assert type(exc.value) is CheckpointFormatError
    # torch reports how many bytes it wanted next, which depends on where its
    # reader stood (it varies with what else ran in the process): check the rest.
    assert re.fullmatch(re.escape(f"{p}: PyTorch file cannot be read: unexpected EOF, expected ")
                        + r"\d+" + re.escape(" more bytes. The file might be corrupted."), str(exc.value))


def test_pickle_cut_short_is_truncated_not_unsafe(tmp_path):
    p = tmp_path / "cut.pt"
    torch.save(small_state_dict(), p)
    q = tmp_path / "cut2.pt"
    with zipfile.ZipFile(p) as zin, zipfile.ZipFile(q, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            zout.writestr(info, data[:len(data) // 2] if info.filename.endswith("data.pkl") else data)
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(q)
    assert type(exc.value) is CheckpointFormatError
    assert str(exc.value) == (f"{q}: PyTorch file is truncated or corrupt (its pickle data ends early "
                              f"or is malformed)")


# ----------------------------------------------------------------------------
# Unrecognised input
# ----------------------------------------------------------------------------

def test_empty_file(tmp_path):
    p = tmp_path / "empty.pt"
    p.write_bytes(b"")
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(p)
    assert str(exc.value) == f"{p}: the file is empty (0 bytes); {EXPECTED}"


def test_unknown_magic(tmp_path):
    p = tmp_path / "weights.ckpt"
    p.write_bytes(b"GGUF\x03\x00\x00\x00rest of a gguf file")
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(p)
    assert str(exc.value) == f"{p}: unrecognised content (first bytes 4747554603000000); {EXPECTED}"
    assert not is_checkpoint_candidate(p)


def test_missing_path(tmp_path):
    p = tmp_path / "nope.safetensors"
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(p)
    assert str(exc.value) == f"{p}: no such file or folder; {EXPECTED}"


def test_folder_without_weights(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(tmp_path)
    assert str(exc.value) == f"{tmp_path}: folder holds no checkpoint file (found: notes.txt); {EXPECTED}"


def test_folder_with_two_checkpoints(tmp_path):
    torch.save(small_state_dict(), tmp_path / "a.pt")
    torch.save(small_state_dict(), tmp_path / "b.pt")
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(tmp_path)
    assert str(exc.value) == (f"{tmp_path}: folder holds 2 checkpoint files (a.pt, b.pt); expected "
                              f"exactly one (open one of them by its path)")


# ----------------------------------------------------------------------------
# Run folders (nanoGPT / query-free, projection-sharing paper)
# ----------------------------------------------------------------------------

def test_query_free_run_folder_skips_log_tensors(tmp_path):
    sd = small_state_dict()
    torch.save(nanogpt_ckpt(sd), tmp_path / "ckpt.pt")
    torch.save(torch.randn(10), tmp_path / "tensor.pt")
    torch.save(torch.randn(4), tmp_path / "eval_val_tensor.pt")
    with open_source(tmp_path) as src:
        assert src.path == str(tmp_path)
        assert src.extras["folder_file"] == "ckpt.pt"
        assert src.extras["folder_note"] == "skipped tensor-only files: eval_val_tensor.pt, tensor.pt"
        assert src.config["query_mode"] == "identity"
        assert_same(src, sd)


def test_paper_folder_model_config_yaml(tmp_path):
    sd = small_state_dict()
    torch.save({"model_state_dict": sd, "step": 5}, tmp_path / "final_model.pt")
    torch.save({"model_state_dict": sd, "step": 2}, tmp_path / "checkpoint_step_2.pt")
    (tmp_path / "model_config.yaml").write_text("variant: Q-K=V\nn_layer: 1\nn_kv_head: 2\n")
    with open_source(tmp_path) as src:
        assert src.config == {"variant": "Q-K=V", "n_layer": 1, "n_kv_head": 2}
        assert src.extras["step"] == 5
        assert src.extras["folder_note"] == "chose final_model.pt over checkpoint_step_2.pt"


def test_paper_folder_pt_model_config_wins_over_yaml(tmp_path):
    torch.save(paper_ckpt(small_state_dict()), tmp_path / "final_model.pt")
    (tmp_path / "model_config.yaml").write_text("variant: other\n")
    with open_source(tmp_path) as src:
        assert src.config == {"variant": "Q-K=V", "n_layer": 1}


def test_paper_folder_bad_yaml(tmp_path):
    torch.save({"model_state_dict": small_state_dict()}, tmp_path / "final_model.pt")
    (tmp_path / "model_config.yaml").write_text("- just\n- a list\n")
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(tmp_path)
    assert str(exc.value) == f"{tmp_path / 'model_config.yaml'}: model config is a YAML list, expected a mapping"


# ----------------------------------------------------------------------------
# Zip uploads
# ----------------------------------------------------------------------------

def zip_folder(folder: Path, zp: Path, arc_root: str) -> None:
    with zipfile.ZipFile(zp, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(folder.rglob("*")):
            zf.write(f, f"{arc_root}/{f.relative_to(folder).as_posix()}")


def test_zip_of_hf_folder_and_cleanup(hf_sharded, tmp_path):
    model, out = hf_sharded
    zp = tmp_path / "upload.zip"
    zip_folder(out, zp, "my-model")
    src = open_source(zp)
    assert isinstance(src, ZipSource)
    assert src.format == "zip/safetensors-sharded"
    assert src.path == str(zp)
    assert src.extras["zip_member"] == "my-model"
    assert src.config["n_layer"] == 2
    tmp = src.extracted_to
    assert tmp.is_dir()
    sd = model.state_dict()
    torch.testing.assert_close(src.get("transformer.h.0.attn.c_attn.weight"),
                               sd["transformer.h.0.attn.c_attn.weight"])
    src.close()
    assert not tmp.exists()
    assert src.extracted_to is None


def test_zip_of_single_pt(tmp_path):
    sd = small_state_dict()
    torch.save(nanogpt_ckpt(sd), tmp_path / "ckpt.pt")
    zp = tmp_path / "ckpt.zip"
    with zipfile.ZipFile(zp, "w") as zf:
        zf.write(tmp_path / "ckpt.pt", "ckpt.pt")
    with open_source(zp) as src:
        assert src.format == "zip/pytorch-zip"
        assert src.extras["zip_member"] == "ckpt.pt"
        assert src.config["n_head"] == 2
        assert_same(src, sd)


def test_torch_zip_with_zip_suffix_is_a_checkpoint(tmp_path):
    sd = small_state_dict()
    p = tmp_path / "weights.zip"
    torch.save(sd, p)
    with open_source(p) as src:
        assert isinstance(src, TorchSource)
        assert_same(src, sd)


def test_zip_inner_error_names_zip_and_entry(tmp_path):
    zp = tmp_path / "bad.zip"
    with zipfile.ZipFile(zp, "w") as zf:
        zf.writestr("model/model.safetensors", struct.pack("<Q", 4096) + b"{" + b" " * 99)
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(zp)
    assert str(exc.value) == (f"{zp}: model/model.safetensors: safetensors header says 4096 bytes but "
                              f"the file has 100 after the length prefix")


def _symlink_info(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = (0o120777 << 16)
    return info


ZIP_ATTACKS = [
    ("traversal", lambda zf: zf.writestr("../evil.pt", b"x"),
     "zip entry '../evil.pt' climbs out of the folder with '..'; refused"),
    ("traversal_inner", lambda zf: zf.writestr("run/../../evil.pt", b"x"),
     "zip entry 'run/../../evil.pt' climbs out of the folder with '..'; refused"),
    ("absolute", lambda zf: zf.writestr(zipfile.ZipInfo("/etc/evil.pt"), b"x"),
     "zip entry '/etc/evil.pt' has an absolute path; refused"),
    ("symlink", lambda zf: zf.writestr(_symlink_info("run/model.safetensors"), "/etc/passwd"),
     "zip entry 'run/model.safetensors' is a symbolic link; refused"),
    ("bomb", lambda zf: zf.writestr("bomb.bin", b"\0" * (4 << 20), compress_type=zipfile.ZIP_DEFLATED),
     None),
    ("duplicate", lambda zf: (zf.writestr("a.pt", b"x"), zf.writestr("a.pt", b"y")),
     "zip entry 'a.pt' appears twice; refused"),
]


@pytest.mark.parametrize("name,build,problem", ZIP_ATTACKS, ids=[c[0] for c in ZIP_ATTACKS])
def test_zip_attacks_refused(tmp_path, name, build, problem, monkeypatch):
    zp = tmp_path / f"{name}.zip"
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                 # zipfile warns about the duplicate name
        with zipfile.ZipFile(zp, "w") as zf:
            build(zf)
    made = []
    real_mkdtemp = __import__("tempfile").mkdtemp

    def spy(*a, **k):
        made.append(real_mkdtemp(*a, **k))
        return made[-1]
    monkeypatch.setattr("loaders.sources.zip_upload.tempfile.mkdtemp", spy)
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(zp)
    if name == "bomb":
        with zipfile.ZipFile(zp) as zf:
            info = zf.getinfo("bomb.bin")
        ratio = info.file_size / info.compress_size
        problem = (f"zip entry 'bomb.bin' expands {ratio:.0f}x ({info.file_size} bytes from "
                   f"{info.compress_size}), over the 200x limit; refused as a zip bomb")
    assert str(exc.value) == f"{zp}: {problem}"
    assert not (tmp_path / "evil.pt").exists()
    assert made and not any(Path(m).exists() for m in made)   # temp folder removed on error


def test_nested_zip_refused(tmp_path):
    inner = tmp_path / "inner.zip"
    with zipfile.ZipFile(inner, "w") as zf:
        zf.writestr("x.txt", "x")
    zp = tmp_path / "outer.zip"
    with zipfile.ZipFile(zp, "w") as zf:
        zf.write(inner, "inner.zip")
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(zp)
    assert str(exc.value) == f"{zp}: zip entry 'inner.zip' is another zip; nested zips are not opened"


def test_empty_zip(tmp_path):
    zp = tmp_path / "empty.zip"
    with zipfile.ZipFile(zp, "w"):
        pass
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(zp)
    assert str(exc.value) == f"{zp}: zip is empty; {EXPECTED}"


def test_zip_entry_limit(tmp_path, monkeypatch):
    monkeypatch.setattr("loaders.sources.zip_upload._ZIP_MAX_ENTRIES", 3)
    zp = tmp_path / "many.zip"
    with zipfile.ZipFile(zp, "w") as zf:
        for i in range(4):
            zf.writestr(f"f{i}.txt", "x")
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(zp)
    assert str(exc.value) == f"{zp}: zip has 4 entries, over the 3-entry limit"


# ----------------------------------------------------------------------------
# content_hash and is_checkpoint_candidate
# ----------------------------------------------------------------------------

def test_content_hash_of_file_is_sha256(tmp_path):
    p = tmp_path / "w.safetensors"
    save_file(small_state_dict(), str(p))
    assert content_hash(p) == hashlib.sha256(p.read_bytes()).hexdigest()


def test_content_hash_of_folder_covers_weights_and_config_only(hf_sharded):
    _, out = hf_sharded
    h0 = content_hash(out)
    assert content_hash(out) == h0
    (out / "README.md").write_text("not read by open_source")
    assert content_hash(out) == h0
    shard = sorted(out.glob("model-*.safetensors"))[1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    h1 = content_hash(out)
    assert h1 != h0
    cfg = json.loads((out / "config.json").read_text())
    cfg["n_layer"] = 3
    (out / "config.json").write_text(json.dumps(cfg))
    assert content_hash(out) not in (h0, h1)


def test_content_hash_of_index_covers_shards(hf_sharded):
    _, out = hf_sharded
    idx = out / "model.safetensors.index.json"
    h0 = content_hash(idx)
    shard = sorted(out.glob("model-*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes() + b"")
    assert content_hash(idx) == h0
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    assert content_hash(idx) != h0


def test_is_checkpoint_candidate(tmp_path, hf_sharded):
    _, out = hf_sharded
    st = tmp_path / "w.safetensors"
    save_file({"a": torch.ones(1)}, str(st))
    pt = tmp_path / "w.pt"
    torch.save({"a": torch.ones(1)}, pt)
    legacy = tmp_path / "old.bin"
    torch.save({"a": torch.ones(1)}, legacy, _use_new_zipfile_serialization=False)
    zp = tmp_path / "u.zip"
    with zipfile.ZipFile(zp, "w") as zf:
        zf.writestr("a.txt", "x")
    txt = tmp_path / "notes.pt"
    txt.write_text("hello world, not a checkpoint")
    json_file = tmp_path / "w.json"
    json_file.write_text("{}")
    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    (plain_dir / "config.json").write_text("{}")
    assert [is_checkpoint_candidate(p) for p in (st, pt, legacy, zp, out)] == [True] * 5
    assert [is_checkpoint_candidate(p) for p in (txt, json_file, plain_dir, tmp_path / "missing.pt")] == [False] * 4


# ----------------------------------------------------------------------------
# Real-world samples
# ----------------------------------------------------------------------------

def test_realworld_nanogpt_checkpoint(realworld):
    p = realworld / "checkpoints/nanogpt-gpt-by-hand/ckpt.pt"
    with open_source(p) as src:
        assert src.format == "pytorch-zip"
        assert len(src.keys()) == 16
        assert src.shape("transformer.h.0.attn.c_attn.weight") == (48, 16)
        assert src.config == {"vocab_size": 32, "seq_length": 8, "num_layers": 2, "num_heads": 2,
                              "dim_embedding": 16, "dropout_rate": 0.0, "use_bias": False}
        assert src.extras["iter_num"] == 2000
        assert src.extras["best_val_loss"] == pytest.approx(1.5051857, abs=1e-6)
        assert "optimizer" not in src.extras
        assert src.extras["config"]["INIT_FROM_SCRATCH"] == "scratch"


def test_realworld_llama2c_checkpoint(realworld):
    p = realworld / "checkpoints/llama2c-train-llama2xs/ckpt.pt"
    with open_source(p) as src:
        assert len(src.keys()) == 48
        assert src.shape("layers.0.attention.wq.weight") == (64, 64)
        assert src.shape("layers.0.attention.wk.weight") == (32, 64)    # 4 kv heads of 8
        assert src.dtype("layers.0.attention.wk.weight") == "float32"
        assert src.config["n_kv_heads"] == 4 and src.config["n_heads"] == 8
        assert src.extras["config"]["weight_decay"] == 0.1
        assert src.extras["iter_num"] == 500
        assert src.get("layers.4.attention.wo.weight").shape == (64, 64)


def test_zip_total_size_limit(tmp_path, monkeypatch):
    monkeypatch.setattr("loaders.sources.zip_upload._ZIP_MAX_TOTAL", 100)
    zp = tmp_path / "big.zip"
    with zipfile.ZipFile(zp, "w") as zf:
        zf.writestr("a.bin", b"x" * 60)
        zf.writestr("b.bin", b"y" * 60)
    with pytest.raises(CheckpointFormatError) as exc:
        open_source(zp)
    assert str(exc.value) == f"{zp}: zip expands to 120 bytes, over the 100-byte limit"
