"""Checkpoints of diverged runs and of dtypes no metric reads: a NaN or Inf
weight makes its layer's values null with a note, every finite layer keeps its
metrics; integer, bool, complex and float8_e8m0 weights are refused with one line,
and an ``analyze`` of several checkpoints reports each and carries on."""
from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from app.cli import main
from app.jobs import weight_frame
from loaders.checkpoints import open_checkpoint
from loaders.errors import CheckpointFormatError
from loaders.store import Store
from tests.faults.data import gpt2_folder
from tests.hostile.corpus import errors_only


def rewritten(folder, change):
    """``folder`` (a GPT-2 of two layers) with its weights passed through ``change(weights)``."""
    w = load_file(folder / "model.safetensors")
    change(w)
    save_file(w, folder / "model.safetensors")
    return folder


def one_nan_in_layer_1(w):
    w["h.1.attn.c_attn.weight"][3, 5] = float("nan")      # a query weight (columns 0..15 are W_Q)


def all_inf_f16(w):
    for k in w:
        w[k] = torch.full_like(w[k], float("inf")).half()


def e4m3_nan_in_layer_0(w):
    for k in w:
        w[k] = w[k].to(torch.float8_e4m3fn)
    w["h.0.attn.c_attn.weight"][0, 0] = float("nan")


@pytest.mark.parametrize("change, null_layers, note", [
    (one_nan_in_layer_1, {1}, "null at layers with non-finite weights: layer 1 (1 NaN in W_Q)"),
    (all_inf_f16, {0, 1}, "null at layers with non-finite weights: layer 0 (256 Inf in W_Q; 256 Inf in W_K; "
                          "256 Inf in W_V; 256 Inf in W_O); layer 1 (256 Inf in W_Q; 256 Inf in W_K; "
                          "256 Inf in W_V; 256 Inf in W_O)"),
    (e4m3_nan_in_layer_0, {0}, "null at layers with non-finite weights: layer 0 (1 NaN in W_Q)"),
])
def test_non_finite_layers_are_null_with_a_note_and_the_others_computed(tmp_path, change, null_layers, note):
    folder = rewritten(gpt2_folder(tmp_path / "m", seed=1), change)
    with open_checkpoint(folder) as ckpt:
        frame, notes = weight_frame(ckpt, device="cpu")
    pairs = frame[frame["layer2"].notna()]                 # a pair of layers is null where either layer is
    assert (pairs["value"].isna() == (pairs["layer"].isin(null_layers) | pairs["layer2"].isin(null_layers))).all()
    for layer, rows in frame[frame["layer2"].isna()].groupby("layer"):
        values = [v for v in rows["value"] if v is not None and not math.isnan(v)]
        if layer in null_layers:
            assert values == []
        else:   # kv_cka of random 16-wide projections is never 0; every metric has a value
            assert len(values) == len(rows) > 0
    assert notes["kv_cka"] == note


@pytest.mark.parametrize("dtype, name", [
    (torch.int32, "int32"), (torch.bool, "bool"), (torch.complex64, "complex64"),
    (torch.float8_e8m0fnu, "float8_e8m0fnu"), (torch.uint64, "uint64"),
])
def test_weights_of_a_dtype_no_metric_reads_are_refused_with_one_line(tmp_path, dtype, name):
    def cast(w):
        for k in w:
            w[k] = w[k].abs().mul(4).to(dtype)
    folder = rewritten(gpt2_folder(tmp_path / "m", seed=1), cast)
    with open_checkpoint(folder) as ckpt, pytest.raises(CheckpointFormatError) as exc:
        weight_frame(ckpt, device="cpu")
    assert str(exc.value) == (f"{folder}: expected floating-point attention weights, found layer 0's W_Q is "
                              f"{name}: no metric is computed from such weights")


def test_analyze_of_several_checkpoints_reports_each_and_carries_on(tmp_path, capsys):
    def to_u64(w):
        for k in w:
            w[k] = w[k].abs().mul(4).to(torch.uint64)
    bad = rewritten(gpt2_folder(tmp_path / "u64", seed=1), to_u64)
    nan = rewritten(gpt2_folder(tmp_path / "nan", seed=2), one_nan_in_layer_1)
    db = tmp_path / "db.duckdb"
    assert main(["analyze", str(bad), str(nan), "--db", str(db)]) == 2
    err = errors_only(capsys.readouterr().err)
    assert [l for l in err.splitlines() if l.startswith("error")] == [
        f"error: {bad}: expected floating-point attention weights, found layer 0's W_Q is uint64: "
        "no metric is computed from such weights"]
    with Store(db).connect(read_only=True) as con:
        rows = con.execute("SELECT r.layer, count(r.value) FROM analysis_results r JOIN checkpoints c "
                           "ON c.id = r.checkpoint_id WHERE c.path = ? GROUP BY r.layer ORDER BY 1",
                           [str(nan)]).fetchall()
    assert rows[1] == (1, 0) and rows[0][0] == 0 and rows[0][1] > 0
