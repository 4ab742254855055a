"""Shared test setup: thread counts that fit the cores (pytest-xdist workers included), GPU tier skipping."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
REALWORLD = SHARED / "realworld"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Chance levels drawn once per geometry for the whole run (loaders/chance_cache.py), shared by
# every worker and child process, and never in the user's own cache folder; an entry is keyed
# by the code that draws it, so one left by a run of other code is never read.
os.environ.setdefault("QKVSCOPE_CHANCE_CACHE", str(Path(tempfile.gettempdir()) / f"qkvscope-test-chance-{os.getuid()}"))
# One torch thread per core in all: with N pytest-xdist workers (scripts/test.sh runs three), each
# worker and each process it starts gets cores // N threads (at least one). More threads than cores
# spin in each other's batched eigen-decompositions (10-400x slower measured on a busy two-core box,
# see tests/analysis/_threads.py); subprocesses inherit OMP_NUM_THREADS, which OpenMP, MKL and
# OpenBLAS read. The controller of a ``-n`` run sets nothing (``pytest_configure``): its workers
# inherit its environment, and a count it set for itself would be theirs and their children's.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
THREADS = max(1, min(2, (os.cpu_count() or 1) // _WORKERS))
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))   # before torch loads numpy's OpenBLAS here

import torch  # noqa: E402  (after the count above)

torch.set_num_threads(THREADS)


def pytest_collection_finish(session):
    """What is alive once the tests are collected (torch, Streamlit, pandas and the project, imported
    by the test modules) is moved out of the cyclic collector's generations (``gc.freeze``): each
    full collection in a worker walked all of it again (8% of the CPU of a run of the page and
    analysis test files)."""
    import gc

    gc.freeze()


def pytest_configure(config):
    if getattr(config.option, "numprocesses", None) and not os.environ.get("PYTEST_XDIST_WORKER"):
        return                                          # the controller of a -n run: see above
    os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))


def _scan_installed_components_once() -> None:
    """Streamlit's AppTest scans the metadata of every installed distribution for v2 components
    each time a new ``AppTest`` runs (``streamlit.components.v2.manifest_scanner``: about 330
    packages, about 0.1 CPU-s, at every new AppTest of a run); the installed packages do not change during a
    test run, so one scan per process serves every AppTest. A server the tests start scans once at
    its start, as it does for a user."""
    import functools

    try:
        from streamlit.components.v2 import manifest_scanner
    except ImportError:                 # another Streamlit: each AppTest scans, only slower
        return
    manifest_scanner.scan_component_manifests = functools.cache(manifest_scanner.scan_component_manifests)


_scan_installed_components_once()


#: Test folders whose every test is of the system tier: fault injection (kills, servers, full
#: disks) and the hostile corpus.
SYSTEM_FOLDERS = ("tests/faults/", "tests/hostile/")
#: What in a test file's text makes its tests integration tests at least: they open a database
#: file, start a process, drive the CLI or a page.
INTEGRATION_SIGNS = ("Store(", "duckdb", "subprocess", "page_test", "AppTest", "sandbox",
                     "from app.cli import main", "ingest_paths", "ingest_checkpoint", "jobs.analyze")
#: ... and what makes them system tests: a browser, a server, Ray.
SYSTEM_SIGNS = ("import ray", "ray.init", "chromium", "playwright", "serve_demo", "start_server")


def tier_of(item, text: str) -> str:
    """``unit``, ``integration`` or ``system``: the tier of a collected test (its marker, added
    by ``pytest_collection_modifyitems``, so ``-m unit`` picks seconds of pure tests). A test
    marked ``browser`` or ``system`` (one that starts Ray or a server through a command it runs),
    under ``SYSTEM_FOLDERS``, or in a file whose text has a ``SYSTEM_SIGNS`` entry, is ``system``;
    else one whose file has an ``INTEGRATION_SIGNS`` entry or is marked ``slow`` is
    ``integration``; else ``unit``."""
    path = item.nodeid.split("::", 1)[0]
    if (item.get_closest_marker("browser") or item.get_closest_marker("system") or path.startswith(SYSTEM_FOLDERS)
            or any(s in text for s in SYSTEM_SIGNS)):
        return "system"
    if item.get_closest_marker("slow") or any(s in text for s in INTEGRATION_SIGNS):
        return "integration"
    return "unit"


def _mark_tiers(items) -> None:
    texts: dict[str, str] = {}
    for item in items:
        path = str(item.path)
        if path not in texts:
            texts[path] = item.path.read_text(errors="replace")
        item.add_marker(tier_of(item, texts[path]))


def pytest_collection_modifyitems(config, items):
    _mark_tiers(items)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _slow_files_first(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA; none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


#: Each file's seconds in a whole run (``scripts/test_durations.py`` writes it from the run's JUnit XML).
DURATIONS = ROOT / "tests" / "durations.json"


def _slow_files_first(items: list) -> None:
    """Under pytest-xdist (``--dist loadfile``, scripts/test.sh) the longest files go first, each
    file's tests in their own order: a worker takes whole files in collection order, and a long
    file handed out last runs alone for minutes while the other workers idle (the last 5% of the
    suite took 14 of its 47 min). Longest: the seconds ``tests/durations.json`` measured (a whole
    run's files), then for files it does not list their count of ``slow``/``browser`` tests."""
    import json

    try:
        measured = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        measured = {}
    weight: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        heavy = item.get_closest_marker("slow") or item.get_closest_marker("browser")
        weight[path] = weight.get(path, 0) + (1 if heavy else 0)
    order = sorted(weight, key=lambda p: (-float(measured.get(p, 0)), -weight[p]))   # stable
    rank = {path: i for i, path in enumerate(order)}
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])


@pytest.fixture
def realworld() -> Path:
    if not REALWORLD.exists():
        pytest.skip(f"real-world samples not found at {REALWORLD}")
    return REALWORLD
