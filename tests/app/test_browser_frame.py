"""The dashboard as a user meets it: started as the README does, in Debian's Chromium."""
from __future__ import annotations

import urllib.parse

import pytest

from loaders.store import Store
from tests.app.browser import browser_page, dashboard, screenshot, wait_idle

pytestmark = pytest.mark.browser


def test_overview_and_sql_in_a_real_browser(tmp_path):
    db = tmp_path / "browser.duckdb"
    Store(db).migrate()
    folder = tmp_path / "stuff"
    folder.mkdir()
    (folder / "notes.txt").write_text("not a log\n")
    with dashboard(db, "--no-demo") as url, browser_page() as page:
        page.goto(url)
        wait_idle(page)
        page.get_by_text("The database is empty").wait_for(timeout=30_000)
        # Ingest from the page: the report names the skipped file and why.
        page.get_by_label("Path").fill(str(folder))
        page.get_by_role("button", name="Ingest").click()
        page.get_by_text("1 skipped").wait_for(timeout=60_000)
        wait_idle(page)
        assert "path=" in page.url  # the view is in the URL
        screenshot(page, "overview")

        q = urllib.parse.quote("SELECT 6 * 7 AS answer")
        page.goto(f"{url}/sql?q={q}")
        wait_idle(page)
        page.get_by_role("button", name="Run").click()         # a query from a link runs only on a click
        page.get_by_text("1 row in").wait_for(timeout=30_000)
        page.locator("[data-testid='stDataFrame']").last.wait_for(timeout=30_000)
        wait_idle(page)
        screenshot(page, "sql")
