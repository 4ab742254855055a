"""`python -m app analyze`: the JSON contract (wd-sensitivity's: tests/app/test_cli_wd_sensitivity.py)."""
from __future__ import annotations

import json

import pytest
import torch

from analysis.registry import METRICS, names
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
    pairs = {m.name for m in METRICS if m.axis in ("head_pair", "kv_head_pair")}
    layer_pairs = {m.name for m in METRICS if m.axis == "layer_pair"}
    assert all(set(r) == {"layer", "head", "metric", "value", "chance", "chance_low", "chance_high",
                          "above_chance", "degenerate"} | ({"head2"} if r["metric"] in pairs else set())
               | ({"layer2"} if r["metric"] in layer_pairs else set()) for r in rows)
    assert {(r["layer"], r["layer2"]) for r in rows if r["metric"] == "xlayer_cka_wk"} == {(0, 1)}   # two layers
    assert {(r["head"], r["head2"]) for r in rows if r["metric"] == "xhead_sim_k_aligned" and r["layer"] == 0} == {
        (h, h2) for h in range(4) for h2 in range(4) if h != h2}            # a pair of kv heads, never one with itself
    assert all(r["chance_low"] <= r["chance"] <= r["chance_high"] for r in rows if r["chance_low"] is not None
               and not r["metric"].startswith("wq_"))
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


_CHILD_PROBE = """
import json, sys
import loaders.sandbox as sandbox

seen = {"starts": 0}
start = sandbox.Sandbox._start


def counted(self):
    seen["starts"] += 1
    return start(self)


sandbox.Sandbox._start = counted
from app.cli import main
seen["exit"] = main(sys.argv[1:])
seen["children"] = len(sandbox.POOL._idle)
print("PROBE " + json.dumps(seen))
"""


@pytest.mark.slow
def test_analyze_path_ingests_and_analyses_in_one_child(tmp_path, tiny_gpt2):
    """Two processes in all: this one and one sandbox child that ingests and then analyses."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    db = tmp_path / "p.duckdb"
    out = subprocess.run([sys.executable, "-c", _CHILD_PROBE, "analyze", str(tiny_gpt2), "--db", str(db),
                          "--device", "cpu", "--json"], cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    payload, probe = out.stdout.rsplit("PROBE ", 1)
    assert json.loads(probe) == {"starts": 1, "exit": 0, "children": 1}
    assert json.loads(payload)["checkpoint"]["id"] == 1


class _Stream:
    def __init__(self, tty: bool):
        self.tty, self.text = tty, ""

    def isatty(self) -> bool:
        return self.tty

    def write(self, s: str) -> None:
        self.text += s

    def flush(self) -> None:
        pass


def test_the_progress_bar_ends_its_line_and_stays_off_a_log_file():
    """The analysis runs in a child that reports no layers: the bar used to stay at 0/1 without a
    newline, and the table printed next began on the bar's line."""
    from app.commands.analyze import _Bar

    tty = _Stream(True)
    bar = _Bar("checkpoint 4", tty)
    bar(0, 1, "analysing in a child process")
    bar.close(ok=True)
    assert tty.text.endswith("\rcheckpoint 4 [########################] 1/1 done                    \n")
    assert tty.text.count("\n") == 1
    failed = _Stream(True)
    bar = _Bar("checkpoint 5", failed)
    bar(0, 1, "analysing in a child process")
    bar.close(ok=False)                                   # the error's line comes next, on its own line
    assert failed.text == f"\rcheckpoint 5 [{'.' * 24}] 0/1 {'analysing in a child process':<24}\n"
    done = _Stream(True)
    bar = _Bar("checkpoint 6", done)
    bar(2, 2, "layers done")
    bar.close(ok=True)                                    # already ended: nothing more
    assert done.text.count("\n") == 1 and done.text.count("\r") == 1
    log = _Stream(False)
    bar = _Bar("checkpoint 7", log)
    bar(0, 1, "analysing in a child process")
    bar.close(ok=True)
    assert log.text == ""
