"""Every budget for untrusted files, and the server's allow-list setting, is in
the README's security section with its default (datasette: an undocumented
setting fails a test)."""
from __future__ import annotations

from pathlib import Path

from loaders.budgets import BUDGETS

ROOT = Path(__file__).resolve().parents[2]


def _section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Security: untrusted files")
    end = readme.find("\n## ", start + 1)
    return readme[start:end if end > 0 else None]


def test_every_budget_has_a_row_with_its_default():
    section = _section()
    rows = {line.split("|")[1].strip(" `"): line.split("|")[2].strip()
            for line in section.splitlines() if line.startswith("| `QKVSCOPE_")}
    missing = [name for name in BUDGETS if name not in rows]
    assert not missing, missing
    for name in ("QKVSCOPE_PARSE_MEMORY_MB", "QKVSCOPE_PARSE_TIMEOUT_S", "QKVSCOPE_SIDE_DEPTH"):
        assert rows[name].replace(",", "") == str(BUDGETS[name][0]), (name, rows[name])


def test_the_allow_list_setting_is_documented():
    section = _section()
    for words in ("QKVSCOPE_ALLOWED_HOSTS", "--allow-host", "403", "Origin"):
        assert words in section, words
