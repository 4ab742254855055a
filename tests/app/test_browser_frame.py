"""The dashboard as a user meets it: started as the README does, in Debian's Chromium; one
server on an empty database for this file's tests (the Overview's ingest of a folder with
nothing to read stores nothing), each a browser session of its own."""
from __future__ import annotations

import urllib.parse

import pytest

from loaders.store import Store
from tests.app.browser import dashboard, screenshot, session, wait_idle

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def served(tmp_path_factory, chromium_browser):
    db = tmp_path_factory.mktemp("browser") / "browser.duckdb"
    Store(db).migrate()
    with dashboard(db, "--no-demo") as url:
        yield url, chromium_browser


def test_overview_and_sql_in_a_real_browser(served, tmp_path):
    folder = tmp_path / "stuff"
    folder.mkdir()
    (folder / "notes.txt").write_text("not a log\n")
    with session(served) as (url, page):
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


def test_sql_link_and_edits_in_a_real_browser(served):
    """In Chromium: a link with ?q= shows the query and no result until Run;
    then type, Run, type, Run: each result is the query just typed."""
    with session(served) as (url, page):
        page.goto(f"{url}/sql?q={urllib.parse.quote('SELECT 6 * 7 AS answer')}")
        wait_idle(page)
        page.get_by_text("Query from the link: press Run to run it.").wait_for(timeout=30_000)
        assert page.get_by_text("1 row in").count() == 0
        editor = page.get_by_label("Query")
        assert editor.input_value() == "SELECT 6 * 7 AS answer"
        page.get_by_role("button", name="Run").click()
        page.get_by_text("1 row in").wait_for(timeout=30_000)
        for n in (43, 44, 45):
            editor.fill(f"SELECT {n} AS answer_{n}")
            editor.press("Control+Enter")  # commit the text area, as a click elsewhere does
            wait_idle(page)
            page.get_by_role("button", name="Run").click()
            wait_idle(page)
            page.locator("[data-testid='stDataFrame']").last.wait_for(timeout=30_000)
            page.wait_for_function(f"() => window.location.search.includes('answer_{n}')",
                                   timeout=30_000)
            assert editor.input_value() == f"SELECT {n} AS answer_{n}"
        screenshot(page, "sql_edits")
