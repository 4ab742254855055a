"""Property-based fuzzing: mutate valid checkpoints, configs and logs; the only
exceptions that may come out are qkvscope's typed errors
(``loaders.errors.QkvscopeError``), and ingest never raises at all (it turns
typed errors into report rows). A bounded number of examples per property
keeps this in the normal test run."""
from __future__ import annotations

import json
import struct
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loaders.checkpoints import inspect_checkpoint
from loaders.errors import QkvscopeError
from loaders.ingest import ingest_file
from loaders.logs import detect_log
from loaders.sources import open_source
from loaders.store import Store

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# JSON values a hostile header may put anywhere.
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


def gpt2_weights(d: int = 8, n_layer: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = {}
    for i in range(n_layer):
        out[f"h.{i}.attn.c_attn.weight"] = torch.randn(d, 3 * d, generator=g)
        out[f"h.{i}.attn.c_proj.weight"] = torch.randn(d, d, generator=g)
    return out


def st_file(header: dict, data: bytes) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


VALID_HEADER = {"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                "b": {"dtype": "F16", "shape": [4], "data_offsets": [16, 24]},
                "__metadata__": {"format": "pt"}}


def must_be_typed(fn, *args) -> None:
    """Run ``fn``; success and ``QkvscopeError`` pass, anything else fails the test."""
    try:
        fn(*args)
    except QkvscopeError as exc:
        assert str(args[0]) in str(exc), f"error does not name the file: {exc}"


def open_and_read(path: Path) -> None:
    src = open_source(path)
    try:
        for k in src.keys():
            src.get(k)
    finally:
        src.close()


@FUZZ
@given(name=st.sampled_from(["a", "b", "__metadata__"]),
       field=st.sampled_from(["dtype", "shape", "data_offsets", None]),
       value=JSONISH)
def test_safetensors_header_fields_replaced(name, field, value):
    header = json.loads(json.dumps(VALID_HEADER))
    if field is None or name == "__metadata__":
        header[name] = value
    else:
        header[name][field] = value
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "m.safetensors"
        p.write_bytes(st_file(header, bytes(24)))
        must_be_typed(open_and_read, p)


@FUZZ
@given(data=st.data())
def test_safetensors_bytes_flipped_or_cut(data):
    raw = bytearray(st_file(VALID_HEADER, bytes(range(24))))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "m.safetensors"
        p.write_bytes(bytes(raw[:cut]))
        must_be_typed(open_and_read, p)


@pytest.fixture(scope="module")
def torch_bytes(tmp_path_factory):
    p = tmp_path_factory.mktemp("pt") / "ckpt.pt"
    torch.save({"model": gpt2_weights(), "model_args": {"n_layer": 1, "n_head": 2, "n_embd": 8}, "iter_num": 5}, p)
    legacy = p.with_suffix(".bin")
    torch.save({"model": gpt2_weights()}, legacy, _use_new_zipfile_serialization=False)
    return {"zip": p.read_bytes(), "legacy": legacy.read_bytes()}


@FUZZ
@given(data=st.data(), kind=st.sampled_from(["zip", "legacy"]))
def test_pytorch_files_bytes_flipped_or_cut(torch_bytes, data, kind):
    raw = bytearray(torch_bytes[kind])
    for _ in range(data.draw(st.integers(0, 6))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(len(raw) // 2, len(raw)))
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "ckpt.pt"
        p.write_bytes(bytes(raw[:cut]))
        must_be_typed(inspect_checkpoint, p)


def hf_folder_with(d: str, key: str, value) -> Path:
    from safetensors.torch import save_file
    folder = Path(d) / "model"
    folder.mkdir()
    save_file(gpt2_weights(n_layer=2), folder / "model.safetensors")
    cfg = {"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 8, key: value}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


CONFIG_KEYS = st.sampled_from(["n_layer", "n_head", "n_embd", "num_attention_heads", "vocab_size",
                               "n_inner", "scale_attn_weights", "tie_word_embeddings"])


@FUZZ
@given(key=CONFIG_KEYS, value=st.integers(-2**65, 2**65) | st.sampled_from([0, 1, 3, 7, 16, -1]))
def test_hf_config_numbers_replaced(key, value):
    with tempfile.TemporaryDirectory() as d:
        folder = hf_folder_with(d, key, value)
        must_be_typed(inspect_checkpoint, folder)


@FUZZ
@given(key=CONFIG_KEYS | st.just("architectures"), value=JSONISH)
def test_hf_config_values_of_any_json_type(key, value):
    """Found TypeError/ValueError/OverflowError from int() of lists, strings and
    Infinity in loaders/layouts (fixed there since)."""
    with tempfile.TemporaryDirectory() as d:
        folder = hf_folder_with(d, key, value)
        must_be_typed(inspect_checkpoint, folder)


LOGS = {
    "metrics.csv": "step,metric,value\n0,train_loss,4.0\n10,train_loss,3.5\n10,val_loss,3.7\n",
    "wide.csv": "step,train_loss,val_loss,lr\n0,4.0,,0.001\n10,3.5,3.7,0.001\n",
    "metrics.jsonl": '{"step": 0, "loss": 4.0}\n{"step": 10, "loss": 3.5, "val_loss": 3.7}\n',
    "train.log": "iter 0: loss 4.0000, time 10.00ms, mfu 1.00%\nstep 10: train loss 3.5, val loss 3.7\n"
                 "iter 10: loss 3.5000, time 10.00ms, mfu 1.00%\n",
    "llmc.log": "s:0 trl:4.0\ns:10 trl:3.5\ns:10 tel:3.7\n",
    "trainer_state.json": json.dumps({"log_history": [{"step": 10, "loss": 3.5}, {"step": 20, "eval_loss": 3.1}]}),
}

NASTY = st.sampled_from(["", ",", "\n", "\"", "nan", "-inf", "1e309", "\x00", "\xff", "\r\n", "{", "}",
                         "step", "-1", "99999999999999999999999", ":", "NaN", "[", "]", " ", "é"])


@FUZZ
@given(name=st.sampled_from(sorted(LOGS)), data=st.data())
def test_logs_mutated_never_raise_through_ingest(name, data):
    text = LOGS[name]
    for _ in range(data.draw(st.integers(1, 5))):
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 4)))
        text = text[:i] + data.draw(NASTY | st.text(max_size=4)) + text[j:]
    raw = text.encode("utf-8", "surrogatepass") if data.draw(st.booleans()) else text.encode("latin-1", "replace")
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "run" / name
        p.parent.mkdir()
        p.write_bytes(raw)
        store = Store(Path(d) / "db.duckdb")
        detect_log(p)
        reports = ingest_file(store, p)            # typed errors become report rows
        for r in reports:
            assert r.status in ("added", "skipped", "error", "unchanged"), r
            if r.status == "error":
                assert str(p) in r.reason
        if any(r.status == "added" for r in reports):
            with store.connect(read_only=True) as con:
                n = con.execute("SELECT count(*) FROM points").fetchone()[0]
            assert n == sum(r.n_points for r in reports)
