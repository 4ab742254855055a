"""Fixtures shared by the page tests."""
from __future__ import annotations

import pytest

from loaders.store import Store


@pytest.fixture
def empty_db(tmp_path, monkeypatch):
    """A migrated, empty database file that the pages open (``QKVSCOPE_DB``)."""
    db = tmp_path / "empty.duckdb"
    Store(db).migrate()
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    return db


@pytest.fixture(scope="module")
def chromium_browser():
    """One Chromium for every browser test of a test file: each opens a session of its own
    (``tests.app.browser.session``), so none sees another's state. Per file, not per process:
    Playwright's sync API runs one instance at a time in a thread, and other files (and folders)
    start their own with ``chromium()``."""
    from tests.app.browser import chromium

    with chromium() as browser:
        yield browser
