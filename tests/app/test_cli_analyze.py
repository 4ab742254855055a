"""`python -m app analyze` and `python -m app wd-sensitivity`: the JSON contracts."""
from __future__ import annotations

import json
import math

import pytest
import torch

from analysis.registry import names
from app.cli import main
from loaders.store import Store, refresh_run_stats


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


def _synthetic_store(path) -> Store:
    """Two variants x 4 weight decays; final val loss = 3 + slope * log10(wd)."""
    store = Store(path)
    slopes = {"qkv": 0.2, "k_eq_v": -0.1}
    rid = 0
    with store.transaction() as con:
        for variant, slope in slopes.items():
            for wd in (1e-3, 1e-2, 1e-1, 1.0):
                rid += 1
                final = 3 + slope * math.log10(wd)
                con.execute("INSERT INTO runs (id, name, source, format, variant, weight_decay, config) "
                            "VALUES (?, ?, 'mem', 'test', ?, ?, ?)",
                            [rid, f"r{rid}", variant, wd, json.dumps({"lr": 1e-3, "seed": rid, "weight_decay": wd})])
                for step, val in ((0, final + 2), (100, final + 1), (200, final)):
                    con.execute("INSERT INTO points (run_id, step, metric, value) VALUES (?, ?, 'val/loss', ?)",
                                [rid, step, val])
        # one lone run: no slope can be fitted
        con.execute("INSERT INTO runs (id, name, source, format, variant, weight_decay, config) "
                    "VALUES (99, 'lone', 'mem', 'test', 'wq_identity', 0.1, '{\"save_steps\": [5]}')")
        con.execute("INSERT INTO points (run_id, step, metric, value) VALUES (99, 10, 'val/loss', 4.0)")
        refresh_run_stats(con, [r[0] for r in con.execute("SELECT id FROM runs").fetchall()])
    return store


def test_wd_sensitivity_json_known_slopes(tmp_path, capsys):
    store = _synthetic_store(tmp_path / "wd.duckdb")
    assert main(["wd-sensitivity", "--db", str(store.path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    by_variant = {o["variant"]: o for o in out}
    assert set(by_variant) == {"qkv", "k_eq_v", "wq_identity"}
    lone = by_variant["wq_identity"]
    assert (lone["slope"], lone["curvature"], lone["best_weight_decay"], lone["n_runs"]) == (None, None, None, 1)
    for variant, slope, best in (("qkv", 0.2, 1e-3), ("k_eq_v", -0.1, 1.0)):
        o = by_variant[variant]
        assert {"variant", "weight_decays", "final_val_loss", "slope", "best_weight_decay", "n_runs"} <= set(o)
        assert o["slope"] == pytest.approx(slope, abs=1e-6)
        assert o["best_weight_decay"] == best and o["n_runs"] == 4
        assert o["weight_decays"] == [1e-3, 1e-2, 1e-1, 1.0]
        assert o["group"] == "all" and o["spikes"] == [0] * 4 and o["diverged"] == [False] * 4
