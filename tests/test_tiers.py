"""Every collected test has exactly one tier (tests/conftest.py ``tier_of``)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import tier_of


class _Item(SimpleNamespace):
    def get_closest_marker(self, name):
        return name if name in self.markers else None


@pytest.mark.parametrize("nodeid, markers, text, tier", [
    ("tests/analysis/test_x.py::t", (), "import torch\n", "unit"),
    ("tests/analysis/test_x.py::t", ("slow",), "import torch\n", "integration"),
    ("tests/loaders/test_x.py::t", (), "store = Store(tmp_path / 'x.duckdb')", "integration"),
    ("tests/app/test_x.py::t", (), "at = page_test('results')", "integration"),
    ("tests/app/test_x.py::t", ("browser",), "", "system"),
    ("tests/app/test_x.py::t", ("slow", "system"), "subprocess.run([...])", "system"),
    ("tests/app/test_x.py::t", (), "import ray\n", "system"),
    ("tests/hostile/test_x.py::t", (), "", "system"),
    ("tests/faults/test_x.py::t", (), "", "system"),
])
def test_tier_rule(nodeid, markers, text, tier):
    assert tier_of(_Item(nodeid=nodeid, markers=markers), text) == tier


def test_every_collected_test_has_one_tier(request):
    items = request.session.items
    assert items
    for item in items:
        tiers = [t for t in ("unit", "integration", "system") if item.get_closest_marker(t)]
        assert len(tiers) == 1, (item.nodeid, tiers)
