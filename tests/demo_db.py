"""Databases built once per test run and copied for each test (or module) that reads them.

``built_once(tmp_path_factory, name, build)``: the first caller of a run calls ``build(path)``
under an exclusive ``flock``; every pytest-xdist worker of the same run
(``PYTEST_XDIST_TESTRUNUID``) reuses the file, and each caller copies it, so no test sees
another's writes. Two are built so:

* ``demo_db``: the bundled demo ingested (``ingest_paths`` over data/demo, what ``ensure_demo``
  does on ``python -m app serve``'s first start: 15-50 s); the tests that read it are not about
  building it (``tests/app/test_serve*``/``test_dashboard_script.py`` test the build itself);
* ``tests/projects_db.py``'s database of several projects (the demo plus six log folders).
"""
from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import Callable


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """``<run folder>/<name>/<name>.duckdb``, built by ``build(path)`` once per test run; the
    folder also holds whatever ``build`` wrote beside the database (files it ingested)."""
    base = tmp_path_factory.getbasetemp()
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    root = (base.parent / f"{name}-{run}" if run else base / name) / name   # shared by one run's workers only
    root.mkdir(parents=True, exist_ok=True)
    built = root / f"{name}.duckdb"
    with open(root.parent / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root.parent / "done").exists():
            built.unlink(missing_ok=True)        # a build that died part-way
            build(built)
            (root.parent / "done").touch()
    return built


def _build_demo(path: Path) -> None:
    from app.paths import DEMO_DIR
    from loaders.ingest import ingest_paths
    from loaders.store import Store

    if not any(DEMO_DIR.glob("*/metrics.jsonl")):
        raise FileNotFoundError(f"{DEMO_DIR}: the bundled demo is not there")
    report = ingest_paths(Store(path), [DEMO_DIR])          # what ensure_demo does on a first start
    assert report.count("error") == 0, report.to_json()


def copy_to(built: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(built, dest)
    return dest


def demo_db(tmp_path_factory, dest: Path) -> Path:
    """A fresh copy of the demo database at ``dest`` (a ``.duckdb`` path); returns ``dest``."""
    return copy_to(built_once(tmp_path_factory, "demo-db", _build_demo), dest)
