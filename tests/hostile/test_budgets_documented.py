"""Every budget for untrusted files, and the server's allow-list setting, is in
the security page with its default (datasette: an undocumented setting fails
a test)."""
from __future__ import annotations

import re
from pathlib import Path

from loaders.budgets import BUDGETS

ROOT = Path(__file__).resolve().parents[2]


def _section() -> str:
    return (ROOT / "docs" / "security.md").read_text()


def test_every_budget_has_a_row_with_its_default():
    rows = dict(re.findall(r"^\* `(QKVSCOPE_[A-Z_]+)` \(default ([^)]+)\)", _section(), flags=re.M))
    missing = [name for name in BUDGETS if name not in rows]
    assert not missing, missing
    for name in ("QKVSCOPE_PARSE_MEMORY_MB", "QKVSCOPE_PARSE_TIMEOUT_S", "QKVSCOPE_SIDE_DEPTH"):
        assert rows[name].replace(",", "") == str(BUDGETS[name][0]), (name, rows[name])


def test_the_allow_list_setting_is_documented():
    section = _section()
    for words in ("QKVSCOPE_ALLOWED_HOSTS", "--allow-host", "403", "Origin"):
        assert words in section, words
