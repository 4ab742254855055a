"""The dashboard starts the reading child before the first checkpoint is opened (app/dashboard/prestart.py)."""
from __future__ import annotations

from pathlib import Path

import streamlit as st
from streamlit.testing.v1 import AppTest

from app.dashboard.prestart import READER_MODULES, prestart_reader
from loaders.parse_child import POOL, call

ROOT = Path(__file__).resolve().parents[2]
T = "tests.hostile.parse_targets"


def _wait_started() -> None:
    starting = POOL._starting
    if starting is not None:
        starting.wait(120)


def test_the_dashboards_first_page_prestarts_one_child_with_transformers_imported(empty_db, tmp_path, monkeypatch):
    monkeypatch.delenv("QKVSCOPE_PRESTART", raising=False)
    POOL.close()
    st.cache_resource.clear()                                  # once per server: this test is a new server
    at = AppTest.from_file(str(ROOT / "app" / "dashboard" / "streamlit_app.py"), default_timeout=60)
    at.run()
    assert not at.exception
    _wait_started()
    [(_, child)] = POOL._idle
    for module in READER_MODULES:
        assert call(f"{T}:loaded", tmp_path, pooled=True, module=module) is True, module
    at.run()                                                   # a rerun starts nothing more
    _wait_started()
    assert [r.pid for _, r in POOL._idle] == [child.pid]
    assert call(f"{T}:pid", tmp_path, pooled=True) == child.pid
    POOL.close()


def test_qkvscope_prestart_0_starts_nothing(monkeypatch):
    monkeypatch.setenv("QKVSCOPE_PRESTART", "0")
    POOL.close()
    assert prestart_reader() is None
    assert POOL._idle == [] and POOL._starting is None
