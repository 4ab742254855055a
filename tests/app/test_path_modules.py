"""How many of the project's modules ``python -m app analyze PATH`` loads: the path a newcomer
reads (docs/contributing.md, "From `analyze PATH` to the Inspector heatmap").

The command runs as a user runs it, on a demo safetensors checkpoint and an empty database,
with a ``sitecustomize.py`` on ``PYTHONPATH`` (both processes load it: the CLI and the reading
child, which gets the CLI's ``PYTHONPATH``). It adds an audit hook that writes the file of every
code object ``exec`` runs, which is every module body an import runs. A module of ``app/``,
``analysis/``, ``loaders/`` or ``experiments/`` counts once however many processes load it.

What the bound holds: a safetensors file loads its own reader and layout only (not the pickle,
zip or llama2.c readers, nor the other layouts), a weights job loads no activation engine nor
forward pass, ``analyze`` no batch package or figure export, and the CLI process no torch.
Run again on the same database, the command starts no reading child at all: the ingest journal
knows the file unchanged (``loaders.ingest.journalled``) and its job is current.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "data" / "demo" / "q_eq_k-mha-wd0.1" / "checkpoints" / "final_step_004000.safetensors"
PACKAGES = ("app", "analysis", "loaders", "experiments")
#: The project's modules on the path, both processes together.
MAX_MODULES = 78

SITECUSTOMIZE = '''
import os, sys
_log = open(os.path.join(os.environ["MODULE_LOG_DIR"], f"{os.getpid()}.log"), "a", buffering=1)

def _hook(event, args):
    if event == "exec":
        name = getattr(args[0], "co_filename", "")
        if name.endswith(".py"):
            _log.write(name + "\\n")

sys.addaudithook(_hook)
'''


def _loaded(log_dir: Path) -> dict[int, set[str]]:
    """Per process: the project modules whose bodies ran, as paths relative to the checkout."""
    out = {}
    for f in log_dir.glob("*.log"):
        files = {Path(line) for line in f.read_text().splitlines()}
        out[int(f.stem)] = {p.relative_to(ROOT).as_posix() for p in files
                            if p.is_relative_to(ROOT) and p.relative_to(ROOT).parts[0] in PACKAGES}
    return out


def _analyze(tmp_path: Path, hook: Path, logs: Path) -> str:
    """``analyze DEMO --json`` into ``tmp_path/a.duckdb``, each process logging to ``logs``; its stdout."""
    logs.mkdir()
    env = dict(os.environ, MODULE_LOG_DIR=str(logs),
               PYTHONPATH=os.pathsep.join([str(hook), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    out = subprocess.run([sys.executable, "-m", "app", "analyze", str(DEMO), "--db", str(tmp_path / "a.duckdb"),
                          "--device", "cpu", "--json"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_analyze_path_loads_at_most_max_modules_of_the_project(tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    logs = tmp_path / "logs"
    out = _analyze(tmp_path, hook, logs)
    assert json.loads(out)["tied"]["variant"] == "q_eq_k"

    per_process = _loaded(logs)
    assert len(per_process) == 2                    # the CLI and the one reading child
    cli = next(mods for mods in per_process.values() if "app/cli.py" in mods)
    child = next(mods for mods in per_process.values() if "app/cli.py" not in mods)
    union = cli | child
    assert len(union) <= MAX_MODULES, f"{len(union)} modules on the path:\n" + "\n".join(sorted(union))
    # what the path leaves out
    assert not any(m.startswith(("app/batch/", "app/pages/", "loaders/logs/")) for m in union)
    assert {m for m in union if m.startswith("loaders/layouts/") and not m.endswith("__init__.py")} <= {
        "loaders/layouts/qkvscope.py", "loaders/layouts/_common.py"}
    assert not {"loaders/sources/pickles.py", "loaders/sources/torch_file.py", "loaders/sources/zip_upload.py",
                "loaders/llama2c.py", "analysis/activations.py", "experiments/activation_runs.py",
                "app/figures.py"} & union
    # the CLI process reads and stores results; torch loads in the reading child only
    torch_dir = Path(__import__("torch").__file__).parent
    cli_files = {Path(line) for line in next(f for f in logs.glob("*.log") if "app/cli.py" in f.read_text())
                 .read_text().splitlines()}
    assert not any(p.is_relative_to(torch_dir) for p in cli_files)

    # the same file again: the journal knows it and its job is current, so no reading child starts
    again = json.loads(_analyze(tmp_path, hook, tmp_path / "logs-again"))
    assert again["cached"] is True and again["tied"]["variant"] == "q_eq_k"
    assert len(_loaded(tmp_path / "logs-again")) == 1
