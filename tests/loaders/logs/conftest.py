"""Fixtures of the log tests."""
from __future__ import annotations

import pytest

from loaders.store import Store


@pytest.fixture
def store(tmp_path):
    """An empty store in the test's temp folder."""
    return Store(tmp_path / "db.duckdb")
