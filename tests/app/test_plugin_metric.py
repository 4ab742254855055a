"""A metric added as a plugin (docs/contributing.md, "Adding a metric") reaches the CLI JSON, the store and the Inspector.

``QKVSCOPE_PLUGINS=tests.plugins.toy_metric`` registers ``toy_mean_abs_v`` (mean |W_V[g]| per kv
head) in each process that imports the registry: the `analyze` command, its analysis child process
and the Streamlit page. Neither the command nor the page names the metric. Both run in fresh
processes (the environment is read when the registry is first imported), so this process's
registry stays the built-in one.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from analysis import registry
from app.cli import main

ROOT = Path(__file__).resolve().parents[2]
PLUGIN, TOY = "tests.plugins.toy_metric", "toy_mean_abs_v"
N_LAYER, N_HEAD, N_EMBD = 2, 4, 32

#: The Inspector on checkpoint 1 with the toy metric in the URL, as AppTest sees it (run in a child).
INSPECTOR = """
import json
from tests.app.apptest import page_test
from tests.app.test_page_experiments import arr
at = page_test("inspector", {"ckpt": "1", "metric": "toy_mean_abs_v"}).run()
box = at.selectbox(key="insp_metric")
heat = [json.loads(e.proto.spec) for e in at.get("plotly_chart") if e.key == "insp_heatmap"]
print(json.dumps({"exception": [str(e.value) for e in at.exception], "options": list(box.options),
                  "value": box.value, "captions": [c.value for c in at.caption],
                  "toasts": [t.value for t in at.toast],
                  "y": heat[0]["data"][0]["y"] if heat else None,
                  "z": arr(heat[0]["data"][0]["z"]) if heat else None}))
"""


def _env(db: Path) -> dict[str, str]:
    return dict(os.environ, QKVSCOPE_PLUGINS=PLUGIN, QKVSCOPE_DB=str(db),
                PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))


def _run(args: list[str], db: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=_env(db), capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """A tiny GPT-2 written in code, analysed once by `python -m app analyze --json` with the plugin."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("plugin") / "gpt2-tiny"
    model = GPT2LMHeadModel(GPT2Config(vocab_size=300, n_positions=64, n_embd=N_EMBD, n_layer=N_LAYER,
                                       n_head=N_HEAD))
    model.save_pretrained(folder)
    db = folder.parent / "p.duckdb"
    out = _run(["-m", "app", "analyze", str(folder), "--db", str(db), "--device", "cpu", "--json"], db)
    return model, db, json.loads(out.stdout)


def _reference(model) -> list[list[float]]:
    """mean |W_V[g]| per layer and head, float64, from GPT-2's fused c_attn weight [d, 3d] (q | k | v)."""
    e = N_EMBD // N_HEAD
    out = []
    for block in model.transformer.h:
        v = block.attn.c_attn.weight.detach().double()[:, 2 * N_EMBD:]            # [d, d]: heads side by side
        out.append([float(v[:, g * e:(g + 1) * e].abs().mean()) for g in range(N_HEAD)])
    return out


@pytest.mark.slow
def test_the_plugin_metric_is_in_the_cli_json(analysed):
    model, _, payload = analysed
    rows = [r for r in payload["metrics"] if r["metric"] == TOY]
    assert [(r["layer"], r["head"]) for r in rows] == [(l, g) for l in range(N_LAYER) for g in range(N_HEAD)]
    got = [[r["value"] for r in rows if r["layer"] == l] for l in range(N_LAYER)]
    ref = _reference(model)
    for layer_got, layer_ref in zip(got, ref):
        assert layer_got == pytest.approx(layer_ref, rel=1e-6)
    # chance by the row's rule (monte_carlo): mean |N(0, 1/d_model)| = sqrt(2 / (pi d_model))
    assert {r["chance"] for r in rows} == {rows[0]["chance"]}
    assert rows[0]["chance"] == pytest.approx(math.sqrt(2 / (math.pi * N_EMBD)), rel=0.05)
    assert set(rows[0]) == {"layer", "head", "metric", "value", "chance", "chance_low", "chance_high",
                            "above_chance", "degenerate"} and TOY not in payload["notes"]
    assert rows[0]["chance_low"] < rows[0]["chance"] < rows[0]["chance_high"]     # its null band, as built-ins
    # the built-in metrics are all still there, as without the plugin
    assert {r["metric"] for r in payload["metrics"]} | set(payload["notes"]) == set(registry.names("weights")) | {TOY}


@pytest.mark.slow
def test_the_plugin_metric_is_on_the_inspector(analysed):
    model, db, payload = analysed
    page = json.loads(_run(["-c", INSPECTOR], db).stdout.strip().splitlines()[-1])
    assert page["exception"] == []
    assert TOY in page["options"] and page["value"] == TOY
    assert page["toasts"] == []                       # read from the store: the rows were stored by the CLI
    assert any("mean |W_V[g]|" in c and "per KV head" in c for c in page["captions"])
    assert any("sqrt(2 / (pi d_model))" in c for c in page["captions"])      # its chance_help
    assert page["y"] == ["L0", "L1"]
    stored = [[r["value"] for r in payload["metrics"] if r["metric"] == TOY and r["layer"] == l]
              for l in range(N_LAYER)]
    for row_z, row_stored in zip(page["z"], stored):
        assert row_z == pytest.approx(row_stored, rel=1e-6)


def test_the_list_and_a_broken_plugin(monkeypatch, capsys):
    """`analyze --list` lists a registered plugin; a plugin that failed to import is one line, exit 2."""
    registry.register(registry.Metric("toy_listed", "weights", "layer", "toy", "a toy for --list", "none",
                                      "none", "none: a toy"), lambda layer, meta, device: 1.0)
    try:
        assert main(["analyze", "--list"]) == 0
        listed = capsys.readouterr().out.splitlines()
        assert listed[-1].split() == ["toy_listed", "weights", "layer", "a", "toy", "for", "--list"]
    finally:
        registry.unregister("toy_listed")
    monkeypatch.setitem(registry._state, "error",
                        "QKVSCOPE_PLUGINS: my_metric: ModuleNotFoundError: No module named 'my_metric'")
    assert main(["analyze", "--list"]) == 2
    assert capsys.readouterr().err == ("error: QKVSCOPE_PLUGINS: my_metric: ModuleNotFoundError: "
                                       "No module named 'my_metric'\n")
