"""The three surfaces that say which projections are tied read the same ties and word a
disagreement the same way: ``analyze`` (its JSON's ``tied`` and its note), ``info`` (its JSON's
``tied`` and its note) and the Inspector (the sandbox's job ``ties`` and its warning).

Each surface is called as its process calls it, in this process: ``analyze``'s child body
(``app.jobs.compute_jobs``), ``info``'s child body (``app.commands.info.describe``) and the
function the sandbox's table names for the Inspector's job ``ties``. The checkpoints are the
bundled demo's tied variants, an untied one, and the untied one with ``v = k`` copied into one
of its four layers (its layout still reads ``qkv``: every surface must say so, in one wording).
"""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from analysis.tie_names import disagreement
from app.commands.info import describe
from app.commands.info import disagreement as info_note
from app.jobs import compute_jobs
from app.pages.inspector import tie_message
from app.sandbox_jobs import JOBS

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"


def _demo(run: str) -> Path:
    return DEMO / run / "checkpoints" / "final_step_004000.safetensors"


def _v_is_k_in_layer_1(tmp_path: Path) -> Path:
    """The demo's ``qkv-mha-wd0.1`` with layer 1's ``v`` replaced by its ``k`` (metadata kept)."""
    src = _demo("qkv-mha-wd0.1")
    with safe_open(str(src), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata()
    tensors["blocks.1.attn.v.weight"] = tensors["blocks.1.attn.k.weight"].clone()
    out = tmp_path / "qkv-v-is-k-in-layer-1.safetensors"
    save_file(tensors, str(out), metadata=meta)
    return out


def _inspector_ties(path: str) -> list[dict]:
    """What the Inspector's job ``ties`` returns: the function the sandbox's table names."""
    module, function = JOBS["ties"]
    return getattr(importlib.import_module(module), function)(path)


def _layers(n: int, **ties: bool) -> list[dict]:
    row = {"q_identity": False, "q_eq_k": False, "k_eq_v": False, "q_eq_v": False, **ties}
    return [{"layer": i, **row} for i in range(n)]


MIXED = ("the layout reads variant qkv, but the tensors read mixed (W_V = W_K in layer 1, to float tolerance; "
         "by layer: qkv in layers 0, 2-3, k_eq_v in layer 1)")
CASES = [   # (checkpoint, layout variant, tensors' variant, per-layer ties, disagreement)
    ("q_eq_k-mha-wd0.1", "q_eq_k", "q_eq_k", _layers(4, q_eq_k=True), None),
    ("k_eq_v-mha-wd0.1", "k_eq_v", "k_eq_v", _layers(4, k_eq_v=True), None),
    ("q_eq_k_eq_v-mha-wd0.1", "q_eq_k_eq_v", "q_eq_k_eq_v", _layers(4, q_eq_k=True, k_eq_v=True, q_eq_v=True), None),
    ("wq_identity-mha-wd0.1", "wq_identity", "wq_identity", _layers(4, q_identity=True), None),
    ("qkv-mha-wd0.1", "qkv", "qkv", _layers(4), None),
    ("v-is-k-in-layer-1", "qkv", "mixed", [{**t, "k_eq_v": t["layer"] == 1} for t in _layers(4)], MIXED),
]


@pytest.mark.parametrize("run, layout, variant, layers, note", CASES, ids=[c[0] for c in CASES])
def test_analyze_info_and_the_inspector_read_the_same_ties(tmp_path, run, layout, variant, layers, note):
    path = str(_v_is_k_in_layer_1(tmp_path) if run == "v-is-k-in-layer-1" else _demo(run))
    torch.manual_seed(0)
    analysed = compute_jobs(path, kinds=["weights"], device="cpu")[0]["tied"]
    described = describe(path)
    inspected = _inspector_ties(path)

    assert analysed == {"variant": variant, "layout_variant": layout, "agree": variant == layout, "layers": layers}
    assert described["variant"] == layout
    assert described["tied"] == {"variant": variant, "layers": layers}
    assert inspected == layers
    # one wording: analyze's note, info's note and the Inspector's warning
    assert disagreement(analysed["layout_variant"], analysed["layers"]) == note
    assert info_note(described["variant"], described["tied"]) == note
    warned = tie_message(layout, inspected)
    if note is None:
        assert warned is None
    else:
        assert warned.startswith(note[0].upper() + note[1:] + ". The metrics are computed from the tensors")
