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
