"""``pip install .`` into a new virtual environment gives a ``qkvscope`` command that works from any
directory: ``--help``, ``info`` on a checkpoint, ``demo`` (the bundled demo found inside the installed
package) and ``serve`` (the default database in the user data folder, and the dashboard's health
endpoint answering).

``serve`` starts on a user data folder that already holds the demo database (``tests/demo_db.py``,
built once per test run for the pages' tests), so it builds nothing: that a first start ingests
the bundled demo into an empty database is ``tests/faults/test_serve_demo.py``'s job, and the
installed package's demo is the one a first start reads (``app.paths.DEMO_DIR``, checked here).
The package is built with ``--no-build-isolation`` (the test environment's setuptools) rather
than in a throwaway environment pip fills with setuptools first: what is tested is the package.

The new venv sees the test environment's packages through a ``.pth`` file, pip among them (it is
made ``--without-pip``: copying pip into it cost more than the install), and installs qkvscope
alone (``--no-deps``): what is tested is the package (its modules, the bundled files, the entry
point, no checkout on the path), in seconds instead of the minutes torch takes to unpack again.
That the package declares every dependency is ``tests/test_requirements.py``'s job (the packaging
reads the requirements files that ``scripts/setup.sh`` installs).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.app.browser import free_port
from tests.demo_db import demo_db

ROOT = Path(__file__).resolve().parents[1]
CKPT = ROOT / "data" / "demo" / "qkv-mha-wd0" / "checkpoints" / "final_step_004000.safetensors"

pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_pip_install_gives_a_command_that_works_from_another_directory(tmp_path, tmp_path_factory):
    venv, elsewhere, home = tmp_path / "venv", tmp_path / "elsewhere", tmp_path / "home"
    elsewhere.mkdir()
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("QKVSCOPE_DB", "PYTHONPATH", "VIRTUAL_ENV", "QKVSCOPE_PLUGINS")}
    env |= {"HOME": str(home), "XDG_DATA_HOME": str(home / ".local" / "share"), "PIP_NO_INPUT": "1"}
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], elsewhere, env, 120)
    site = _run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                elsewhere, env, 60).stdout.strip()
    import sysconfig
    Path(site, "test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
          str(ROOT)], elsewhere, env, 600)
    qkvscope = str(venv / "bin" / "qkvscope")

    help_text = _run([qkvscope, "--help"], elsewhere, env, 120).stdout
    assert help_text.startswith("usage: qkvscope ") and "serve" in help_text and "analyze" in help_text

    info = json.loads(_run([qkvscope, "info", str(CKPT), "--json"], elsewhere, env, 300).stdout)
    assert (info["variant"], info["n_layers"], info["n_heads"], info["d_model"]) == ("qkv", 4, 4, 64)

    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import app, app.paths; print(app.__file__); print(app.paths.DEMO_DIR)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60).stdout.splitlines()
    assert where[0].startswith(str(venv))                               # the installed copy, not the checkout
    assert where[1].startswith(str(venv)) and Path(where[1], "qkv-mha-wd0", "config.json").is_file()
    demo = json.loads(_run([qkvscope, "demo", "--json"], elsewhere, env, 300).stdout)
    assert sorted(r["name"] for r in demo) == sorted(p.parent.name for p in (ROOT / "data" / "demo").glob("*/config.json"))

    data = home / ".local" / "share" / "qkvscope" / "qkvscope.duckdb"        # the user data folder
    demo_db(tmp_path_factory, data)
    port = free_port()
    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen([qkvscope, "serve", "--port", str(port)], cwd=elsewhere, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                    if r.status == 200 and r.read() == b"ok":
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.5)
    finally:
        server.terminate()
        server.wait(30)
    said = (tmp_path / "serve.log").read_text()
    assert f"(database {data}; " in said and "First start" not in said, said   # its database, not rebuilt
    assert not (elsewhere / ".streamlit").exists() and not list(elsewhere.iterdir())
