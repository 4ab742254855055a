"""scripts/dashboard.sh says what it is doing: its steps, pip's own progress, and what the first start skipped.

Run in a copy of the script's folder layout with a stub ``setup.sh`` and a stub ``.venv/bin/python``
(so nothing is installed and no server starts): the stubs record how they were called.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SETUP_STUB = """#!/usr/bin/env bash
echo "setup PIP_VERBOSE=${PIP_VERBOSE:-unset} PIP_PROGRESS_BAR=${PIP_PROGRESS_BAR:-unset}" >> calls.log
mkdir -p .venv/bin
cp scripts/python-stub .venv/bin/python
chmod +x .venv/bin/python
"""
PYTHON_STUB = """#!/usr/bin/env bash
echo "python $*" >> calls.log
if [ "$1 $2 $3" = "-m app ingest" ]; then
  touch "$6"
  echo "added     qkvscope           data/demo/a/checkpoints/final.safetensors"
  echo "skipped   unknown            data/demo/a/config.json (configuration file: read as metadata of the run beside it)"
  echo "skipped   unknown            data/demo/b/config.json (configuration file: read as metadata of the run beside it)"
  echo "skipped   unknown            data/demo/b/notes.txt (not a checkpoint or a log)"
  echo "1 added, 0 appended, 0 unchanged, 3 skipped, 0 errors"
fi
"""


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "dashboard.sh", tmp_path / "scripts" / "dashboard.sh")
    for name, text in (("setup.sh", SETUP_STUB), ("python-stub", PYTHON_STUB)):
        (tmp_path / "scripts" / name).write_text(text)
        (tmp_path / "scripts" / name).chmod(0o755 | stat.S_IXUSR)
    (tmp_path / "requirements.txt").write_text("streamlit\n")
    (tmp_path / "data" / "demo").mkdir(parents=True)
    return tmp_path


def _run(tree: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("QKVSCOPE_DB", "PIP_VERBOSE")}
    proc = subprocess.run(["bash", "scripts/dashboard.sh", *args], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def test_first_start_says_each_step_lets_pip_speak_and_names_what_was_skipped(tmp_path):
    tree = _tree(tmp_path)
    err = _run(tree, "--port", "8600")
    lines = err.splitlines()
    assert lines[0].startswith("qkvscope [1/3] creating .venv with Python")
    assert lines[1].startswith("qkvscope [1/3] installing requirements.txt into .venv with pip")
    assert "setup PIP_VERBOSE=1 PIP_PROGRESS_BAR=on" in (tree / "calls.log").read_text()  # pip's -q cancelled
    assert "qkvscope [2/3] first start: ingesting the bundled demo (data/demo) into data/qkvscope.duckdb" in lines
    assert "qkvscope [2/3] 1 added, 0 appended, 0 unchanged, 3 skipped, 0 errors" in lines
    assert "qkvscope [2/3]   2 skipped: configuration file: read as metadata of the run beside it" in lines
    assert "qkvscope [2/3]   1 skipped: not a checkpoint or a log" in lines
    assert "qkvscope [2/3] every file and what became of it: .venv/qkvscope-first-start.log" in lines
    assert (tree / ".venv" / "qkvscope-first-start.log").read_text().count("skipped") == 4
    assert lines[-1] == "qkvscope [3/3] starting the dashboard (python -m app serve --port 8600); Ctrl-C stops it"
    assert (tree / "calls.log").read_text().splitlines()[-1] == "python -m app serve --port 8600"


def test_second_start_skips_pip_and_the_demo_and_says_so(tmp_path):
    tree = _tree(tmp_path)
    _run(tree)
    err = _run(tree, "--db", "mine.duckdb")
    assert err.splitlines()[0] == ("qkvscope [1/3] requirements.txt is installed in .venv (unchanged since; "
                                   "delete .venv/.qkvscope-requirements.txt to reinstall)")
    assert (tree / "calls.log").read_text().count("setup ") == 1 and "ingest" not in err
    (tree / "requirements.txt").write_text("streamlit\nduckdb\n")     # changed: installs again
    assert "installing requirements.txt" in _run(tree)
