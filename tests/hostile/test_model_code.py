"""Model code beside a checkpoint never runs (issue "Files and links built to attack").

A Hugging Face folder whose config.json names code (``auto_map``) with a
``configuration_*.py``/``modeling_*.py`` beside it: without an explicit
``trust_remote_code=False`` transformers asks "Do you wish to run the custom
code? [y/N]" on stdin and runs the file on "y". The attack answers "y" and
checks that the file's marker never appears, while the weights are analysed.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from tests.forked_cli import ForkedCli, module_driver

ROOT = Path(__file__).resolve().parents[2]
_CLI: list[ForkedCli] = []


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """``python -m app`` forked from one process that imported the CLI (tests/forked_cli.py)."""
    yield from module_driver(_CLI, tmp_path_factory)

# Writes a marker next to itself when imported.
_PAYLOAD = """import pathlib
pathlib.Path(__file__).with_name("MARKER-RAN").write_text("model code ran")
from transformers import GPT2Config
class EvilConfig(GPT2Config):
    model_type = "evil-gpt2"
"""


def _gpt2_folder(root: Path, *, auto_map: bool, model_type: bool = True, py: bool = True) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    folder = root / "evil"
    GPT2LMHeadModel(GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=2, n_head=4)
                    ).save_pretrained(folder)
    cfg = json.loads((folder / "config.json").read_text())
    if auto_map:
        cfg["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig",
                           "AutoModel": "configuration_evil.EvilConfig"}
    if not model_type:
        cfg.pop("model_type", None)
    (folder / "config.json").write_text(json.dumps(cfg))
    if py:
        (folder / "configuration_evil.py").write_text(_PAYLOAD)
    return folder


def _analyze(folder: Path, db: Path, stdin: str) -> subprocess.CompletedProcess:
    """``python -m app analyze FOLDER --activations`` with ``stdin`` on its standard input."""
    return _CLI[-1].run("analyze", str(folder), "--activations", "--json", "--db", str(db), "--device", "cpu",
                        env={"HF_HUB_OFFLINE": "1"}, input=stdin, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("case", [
    {"auto_map": True},                                  # config names the code, the file is there
    {"auto_map": True, "model_type": False},             # no model_type: would be read through auto_map
    {"auto_map": False},                                 # only a .py file beside the weights
])
def test_analyze_with_yes_on_stdin_runs_no_model_code(cli, tmp_path, case):
    folder = _gpt2_folder(tmp_path, **case)
    proc = _analyze(folder, tmp_path / "a.duckdb", "y\ny\ny\n")
    assert not (folder / "MARKER-RAN").exists(), proc.stdout + proc.stderr
    assert "custom code" not in proc.stdout + proc.stderr            # nothing asked on stdin
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    results = out if isinstance(out, list) else [out]
    weights = [r for r in results[0]["metrics"] if r["metric"] == "kv_cka"]
    assert len(weights) == 2 * 4                                     # weight metrics of every kv head
    notes = {k: v for r in results for k, v in r["notes"].items()}
    reason = notes["kv_cka_act"]
    assert "model code beside the checkpoint is never run" in reason
    assert "weight-level metrics only" in reason
    assert ("config.json has auto_map" in reason) == case["auto_map"]
    assert "configuration_evil.py beside it" in reason


def test_model_code_reason_names_what_it_found(tmp_path):
    from experiments.runnable import model_code_reason

    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert model_code_reason(plain) is None
    (plain / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["x.Tok", None]}}))
    for i in range(4):
        (plain / f"m{i}.py").write_text("")
    assert model_code_reason(plain) == (
        f"{plain}: model code beside the checkpoint is never run (tokenizer_config.json has auto_map; "
        "m0.py, m1.py, m2.py ... beside it); weight-level metrics only")
