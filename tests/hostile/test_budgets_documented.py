"""Every budget for untrusted files is in the generated settings reference with
its default, and the server's allow-list setting is on the security page
(datasette: an undocumented setting fails a test)."""
from __future__ import annotations

from pathlib import Path

from loaders.budgets import BUDGETS

ROOT = Path(__file__).resolve().parents[2]


def test_every_budget_has_a_row_with_its_default():
    page = (ROOT / "docs" / "reference" / "settings.md").read_text()
    rows = {line.split("|")[1].strip(" `"): line.split("|")[2].strip()
            for line in page.splitlines() if line.startswith("| `QKVSCOPE_")}
    missing = [name for name in BUDGETS if name not in rows]
    assert not missing, missing
    for name in ("QKVSCOPE_PARSE_MEMORY_MB", "QKVSCOPE_PARSE_TIMEOUT_S", "QKVSCOPE_SIDE_DEPTH"):
        assert rows[name].replace(",", "") == str(BUDGETS[name][0]), (name, rows[name])
    assert rows["QKVSCOPE_SIDE_BYTES"] == "1,048,576 (1 MiB)"


def test_the_allow_list_setting_is_documented():
    section = (ROOT / "docs" / "security.md").read_text()
    for words in ("QKVSCOPE_ALLOWED_HOSTS", "--allow-host", "403", "Origin"):
        assert words in section, words
