"""The bundled demo ingested once per test run and copied for each test that reads it.

``ingest_paths`` over data/demo (``ensure_demo``: what ``python -m app serve`` does on a first start) takes
15-50 s; three test files read that database and none of them is about building it
(``tests/app/test_serve*``/``test_dashboard_script.py`` test the build itself). The first
caller of a run builds it under an exclusive ``flock``, every pytest-xdist worker of the same
run (``PYTEST_XDIST_TESTRUNUID``) reuses it, and each test gets its own copy, so no test sees
another's writes.
"""
from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path


def demo_db(tmp_path_factory, dest: Path) -> Path:
    """A fresh copy of the demo database at ``dest`` (a ``.duckdb`` path); returns ``dest``."""
    from app.paths import DEMO_DIR
    from loaders.ingest import ingest_paths
    from loaders.store import Store

    base = tmp_path_factory.getbasetemp()
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    root = base.parent / f"demo-db-{run}" if run else base / "demo-db"   # shared by one run's workers only
    root.mkdir(parents=True, exist_ok=True)
    built = root / "demo.duckdb"
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "done").exists():
            built.unlink(missing_ok=True)        # a build that died part-way
            if not any(DEMO_DIR.glob("*/metrics.jsonl")):
                raise FileNotFoundError(f"{DEMO_DIR}: the bundled demo is not there")
            report = ingest_paths(Store(built), [DEMO_DIR])          # what ensure_demo does on a first start
            assert report.count("error") == 0, report.to_json()
            (root / "done").touch()
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(built, dest)
    return dest
