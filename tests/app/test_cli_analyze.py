"""`python -m app analyze`: the JSON contract (wd-sensitivity's: tests/app/test_cli_wd_sensitivity.py)."""
from __future__ import annotations

import json

import pytest
import torch

from analysis.registry import names
from app.cli import main
from loaders.store import Store


@pytest.fixture
def tiny_gpt2(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    folder = tmp_path / "gpt2-tiny"
    GPT2LMHeadModel(GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=2, n_head=4)
                    ).save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_analyze_json_by_path_then_by_id(tmp_path, tiny_gpt2, capsys):
    db = tmp_path / "a.duckdb"
    assert main(["analyze", str(tiny_gpt2), "--db", str(db), "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"checkpoint", "metrics", "notes", "cached", "tied"}
    assert out["checkpoint"]["id"] == 1 and out["cached"] is False
    assert out["tied"]["variant"] == out["tied"]["layout_variant"] == "qkv"
    rows = out["metrics"]
    assert all(set(r) == {"layer", "head", "metric", "value", "chance"} for r in rows)
    assert {r["metric"] for r in rows} | set(out["notes"]) == set(names("weights"))
    layer_sym = [r for r in rows if r["metric"] == "qk_symmetry" and r["head"] is None]
    assert [r["layer"] for r in layer_sym] == [0, 1]
    assert out["notes"]["wq_absorb_error"].startswith("model uses layernorm")

    assert main(["analyze", "1", str(tiny_gpt2), "--db", str(db), "--device", "cpu", "--json",
                 "--activations"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert isinstance(both, list) and len(both) == 2
    assert {r["metric"] for r in both[0]["metrics"]} >= set(names("activations"))
    assert both[0]["cached"] is False            # activations were new
    assert main(["analyze", "1", "--db", str(db), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cached"] is True


def test_analyze_unknown_id_is_a_one_line_error(tmp_path, capsys):
    db = tmp_path / "b.duckdb"
    Store(db).migrate()
    assert main(["analyze", "3", "--db", str(db), "--json"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {db}: no checkpoint with id 3 (stored ids: none)\n"


def test_analyze_list_shows_every_metric(capsys):
    assert main(["analyze", "--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == names()


@pytest.mark.parametrize("sample, line", [
    ({"text": "builtin", "tokens": 4096}, "  activations: none computed (see the notes below)"),
    ({"text": "builtin", "n_tokens": 4096, "windows": 4, "window": 1024},
     "  activations on 4096 tokens (4 windows of 1024, text builtin)"),
    ({"images": "digits", "n_tokens": 1700, "windows": 100, "window": 17},
     "  activations on 1700 tokens (100 images of 17 tokens, images digits)"),
])
def test_table_output_says_what_the_activations_ran_on(capsys, sample, line):
    """The table printer takes every sample the jobs store, including one where no forward pass ran
    (it raised KeyError: 'n_tokens' there)."""
    from app.commands.analyze import _print_table

    _print_table({"checkpoint": {"id": 3, "path": "/x/ckpt.pt"}, "cached": False, "sample": sample,
                  "metrics": [], "notes": {"kv_cka_act": "no forward pass for a gpt2 checkpoint"}})
    out = capsys.readouterr().out.splitlines()
    assert out == ["checkpoint 3: /x/ckpt.pt", line, "  kv_cka_act: no forward pass for a gpt2 checkpoint"]
