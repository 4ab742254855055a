"""The README and the pages under docs/ as a reader meets them: a short README
that starts with the commands a newcomer runs, links that lead somewhere, and
no page that dates a measurement run or names an issue (git keeps history)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").rglob("*.md"))
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_short_and_starts_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300
    assert lines[2:6] == [
        "```bash",
        "bash scripts/dashboard.sh   # installs into .venv, opens the dashboard on the bundled demo experiments",
        "bash scripts/test.sh        # installs into .venv (plus Debian's chromium), runs every test that needs no GPU",
        "```"]


def test_no_page_dates_a_run_or_names_an_issue():
    dated = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\bissues? #?\d+\b", re.IGNORECASE)
    code = re.compile(r"``.*?``|`[^`]*`")   # a path or name in code (a repository's dated folder) is not a date
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in [README, *PAGES]
             for i, line in enumerate(p.read_text().splitlines(), 1) if dated.search(code.sub("", line))]
    assert found == []


def test_links_to_the_guide_reference_assets_and_owned_pages_resolve():
    """Links into docs/guide, docs/reference and assets/, and to the pages this folder
    always holds, lead to a file (pages other parts of the project add are not checked here)."""
    always = {"index.md", "security.md", "contributing.md", "performance.md"}
    broken = []
    for page in [README, *PAGES]:
        for target in _LINK.findall(page.read_text()):
            if "://" in target:
                continue
            path = (page.parent / target).resolve()
            inside = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else target
            checked = (inside.startswith(("docs/guide/", "docs/reference/", "assets/"))
                       or inside in {f"docs/{n}" for n in always} or inside == "README.md")
            if checked and not path.is_file():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == []


def test_the_screenshots_are_small_pngs():
    for name in ("inspector.png", "results.png"):
        data = (ROOT / "assets" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 100_000, name
