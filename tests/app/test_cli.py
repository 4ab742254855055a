"""The CLI frame and the foundation commands: the frame run as a user runs it (``python -m app``),
the commands through the same entry point in this process (``run_main``)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def run_main(capsys, *args: str) -> subprocess.CompletedProcess:
    """``args`` through ``app.cli.main`` in this process, reported as ``cli`` reports a run: the exit
    status, stdout and stderr of the same entry point that ``python -m app`` calls, without a fresh
    interpreter's seconds of imports (the tests above run the interpreter itself)."""
    from app.cli import main

    capsys.readouterr()
    rc = main(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(["python", "-m", "app", *args], rc, out.out, out.err)


def tiny_gpt2(folder: Path, n_layer: int = 2, seed: int = 0) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=n_layer, n_head=4, n_embd=32, vocab_size=64, n_positions=64)
    GPT2LMHeadModel(cfg).save_pretrained(folder)
    return folder


def test_help_lists_the_contract_commands():
    out = cli("--help")
    assert out.returncode == 0
    for name in ("info", "ingest", "checkpoints", "serve"):
        assert name in out.stdout


def _subparser(parser, name):
    [action] = [a for a in parser._actions if a.dest == "command"]
    return action.choices[name]


def test_a_named_command_gets_the_same_parser_from_its_own_module_alone():
    """``main`` imports only the command it runs; that command's parser (usage, help, defaults)
    is the one the full parser has for it."""
    from app.cli import build_parser, command_module, command_modules

    full = build_parser()
    names = [m.NAME for m in command_modules()]
    assert {"analyze", "info", "kv-cost", "wd-sensitivity"} <= set(names)
    for name in names:
        mod = command_module(name)
        assert mod is not None and mod.NAME == name
        alone = _subparser(build_parser(mod), name)
        assert alone.format_help() == _subparser(full, name).format_help()
        assert alone.get_default("_run") is mod.run
    assert command_module("nope") is None and command_module("_common") is None
    assert command_module("kv_cost") is None                  # the file's name is not the command's


def test_a_light_command_imports_no_other_command():
    code = ("import sys; from app.cli import main; rc = main(['kv-cost', '--preset', 'gpt2', '--json']); "
            "print(rc, sorted(m for m in sys.modules if m.startswith('app.commands.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "0 ['app.commands._common', 'app.commands.kv_cost']"


def test_ingest_of_logs_imports_neither_pandas_nor_torch_in_the_command_or_its_child(tmp_path):
    """The parent of ``ingest`` walks folders and reads JSON answers: no pandas, no torch; its
    reading child imports the log readers (pandas) and, with no checkpoint among the files,
    never torch (1.3 CPU-s and 120 MiB a command)."""
    logs = tmp_path / "logs" / "run1"
    logs.mkdir(parents=True)
    (logs / "metrics.csv").write_text("step,train_loss\n0,2.5\n1,2.4\n")
    code = ("import sys; from app.cli import main; from loaders.sandbox import POOL; "
            f"rc = main(['ingest', {str(tmp_path / 'logs')!r}, '--db', {str(tmp_path / 'db.duckdb')!r}]); "
            "[(_, box)] = POOL._idle; maps = open(f'/proc/{box.pid}/maps').read(); "      # the child, still idle
            "print(rc, 'pandas' in sys.modules, 'torch' in sys.modules, 'libtorch' in maps, 'pandas/' in maps)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "0 False False False True"
    assert "1 added" in out.stdout


def test_no_or_an_unknown_command_gets_the_whole_parser():
    out = cli()
    assert out.returncode == 2 and out.stderr.endswith("error: the following arguments are required: COMMAND\n")
    for argv in (["nope"], ["--help"]):
        out = cli(*argv)
        text = out.stdout + out.stderr
        assert out.returncode == (0 if argv == ["--help"] else 2)
        assert "analyze" in text and "wd-sensitivity" in text, argv


def test_output_piped_into_a_reader_that_stops_early_ends_quietly():
    """``python -m app kv-cost ... --json | head -3``: no "error: Broken pipe" line."""
    proc = subprocess.Popen([sys.executable, "-m", "app", "kv-cost", "--preset", "gpt2", "--json"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()                       # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(120) == 141 and err == ""


def test_info_json_on_a_transformers_checkpoint(tmp_path, capsys):
    folder = tiny_gpt2(tmp_path / "gpt2")
    out = run_main(capsys, "info", str(folder), "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["architecture"] == "gpt2"
    assert info["variant"] == "qkv"
    assert (info["n_layers"], info["n_heads"], info["n_kv_heads"], info["d_model"], info["d_head"]) == (2, 4, 4, 32, 8)
    assert info["params"]["attention"] == 2 * (32 * 96 + 96 + 32 * 32 + 32)
    assert info["params"]["total"] > info["params"]["attention"]
    assert info["kv_bytes_per_token"] == 2 * 2 * 4 * 8 * 4  # layers * (K,V) * kv heads * d_head * fp32


def test_info_failure_is_one_line_without_traceback(tmp_path, capsys):
    bad = tmp_path / "broken.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    out = run_main(capsys, "info", str(bad), "--json")
    assert out.returncode == 2
    assert out.stdout == ""
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {bad}: ")


def test_ingest_then_checkpoints_json_and_idempotence(tmp_path, capsys):
    db = tmp_path / "my.duckdb"
    runs = tmp_path / "runs"
    tiny_gpt2(runs / "a")
    save_file({"weight": torch.zeros(3)}, str(runs / "not_a_model.safetensors"))
    (runs / "notes.txt").write_text("lr sweep ideas\n")

    first = run_main(capsys, "ingest", str(runs), "--db", str(db), "--json")
    assert first.returncode == 2, first.stderr               # one file failed: exit 2
    report = json.loads(first.stdout)
    assert report["added"] == 1
    statuses = {Path(f["path"]).name: f["status"] for f in report["files"]}
    assert statuses["a"] == "added"
    assert statuses["notes.txt"] == "skipped"
    assert statuses["not_a_model.safetensors"] == "error"

    listed = json.loads(run_main(capsys, "checkpoints", "--db", str(db), "--json").stdout)
    assert len(listed) == 1
    row = listed[0]
    assert {"id", "path", "sha256", "architecture", "variant", "n_layers", "n_heads",
            "n_kv_heads", "d_model", "d_head", "params", "kv_bytes_per_token"} <= set(row)
    assert row["architecture"] == "gpt2" and row["n_layers"] == 2 and len(row["sha256"]) == 64

    again = json.loads(run_main(capsys, "ingest", str(runs), "--db", str(db), "--json").stdout)
    assert again["added"] == 0
    assert len(json.loads(run_main(capsys, "checkpoints", "--db", str(db), "--json").stdout)) == 1


def test_ingest_of_a_missing_path_names_it(tmp_path, capsys):
    out = run_main(capsys, "ingest", str(tmp_path / "nope"), "--db", str(tmp_path / "db.duckdb"))
    assert out.returncode == 2
    assert out.stderr.strip() == f"error: {tmp_path / 'nope'}: no such file or folder"
