"""The SQL page: a query from a link fills the editor and waits for Run; every
edited query runs as typed (every other one used to run the last). In Chromium:
``tests/app/test_browser_frame.py``."""
from __future__ import annotations

from tests.app.apptest import page_test, shown


def run_button(at):
    return next(b for b in at.button if b.label == "Run")


def test_a_query_in_the_link_waits_for_a_click(empty_db):
    at = page_test("sql", {"q": "SELECT 41 + 1 AS answer"}).run()
    assert not at.exception
    assert at.text_area[0].value == "SELECT 41 + 1 AS answer"
    assert len(at.dataframe) == 1  # the schema panel only: nothing ran
    assert any("press Run" in i.value for i in at.info)
    run_button(at).click().run()
    assert at.dataframe[-1].value["answer"].tolist() == [42]


def test_every_edited_query_runs_as_typed(empty_db):
    at = page_test("sql").run()
    for n in (42, 7, 8, 9, 10):
        at.text_area[0].input(f"SELECT {n} AS answer").run()
        run_button(at).click().run()
        assert not at.exception
        assert at.text_area[0].value == f"SELECT {n} AS answer"
        assert at.dataframe[-1].value["answer"].tolist() == [n], n
        assert at.query_params["q"] in ([f"SELECT {n} AS answer"], f"SELECT {n} AS answer")


def test_limits_survive_the_url_round_trip(empty_db):
    at = page_test("sql", {"timeout": "5", "rows": "20"}).run()
    assert [at.number_input[0].value, at.number_input[1].value] == [5, 20]
    at.number_input[1].set_value(30).run()
    at.text_area[0].input("SELECT * FROM range(100)").run()
    run_button(at).click().run()
    at.text_area[0].input("SELECT * FROM range(200)").run()
    run_button(at).click().run()
    assert at.number_input[1].value == 30
    assert len(at.dataframe[-1].value) == 30
    assert any("first 30 shown" in c.value for c in at.caption)


def test_link_values_it_cannot_use_are_named(empty_db):
    at = page_test("sql", {"timeout": "abc", "rows": "5"}).run()
    assert not at.exception
    assert "Ignored in the URL: timeout='abc' (expected an integer); rows=5 (expected 10..1000000)." in [
        shown(c.value) for c in at.caption]
    assert at.number_input[1].value == 10_000          # the default, not the link's 5


def test_a_refused_query_is_one_message(empty_db):
    at = page_test("sql", {"q": "DELETE FROM runs"}).run()
    assert not at.error
    run_button(at).click().run()
    assert not at.exception
    assert at.error[0].value == ("only SELECT queries are allowed here (got DELETE); "
                                 "the SQL page never changes the database")


def test_a_text_over_its_budget_is_refused_before_the_url(empty_db):
    """The URL keeps the last query that was run: Streamlit url-encodes it in the server."""
    at = page_test("sql").run()
    at.text_area[0].input("SELECT 1 AS one").run()
    run_button(at).click().run()
    text = "SELECT 1 WHERE 1 IN (" + "1," * 40_000 + "1)"
    at.text_area[0].input(text).run()
    run_button(at).click().run()
    assert not at.exception
    assert at.error[0].value == ("query text of 80,023 bytes is over 64 KB (QKVSCOPE_SQL_MAX_QUERY_KB; "
                                 "set it in the environment to raise it)")
    assert at.query_params["q"] in (["SELECT 1 AS one"], "SELECT 1 AS one")


def test_the_result_stays_while_the_page_reruns(empty_db):
    at = page_test("sql").run()
    at.text_area[0].input("SELECT 5 AS answer").run()
    run_button(at).click().run()
    at.number_input[0].set_value(20).run()  # any other rerun
    assert at.dataframe[-1].value["answer"].tolist() == [5]


def test_a_result_dropped_for_another_sessions_says_so_and_runs_again(empty_db, monkeypatch):
    """Two sessions under a 1 MB budget for all results: the second's result drops the first's,
    which says so in its place and comes back on Run."""
    monkeypatch.setenv("QKVSCOPE_SQL_HELD_MB", "1")
    query = "SELECT repeat('x', 700) AS s FROM range(1000)"     # ~0.7 MB as pandas holds it
    first, second = page_test("sql", {"q": query}).run(), page_test("sql", {"q": query}).run()
    run_button(first).click().run()
    assert len(first.dataframe[-1].value) == 1000
    run_button(second).click().run()
    assert len(second.dataframe[-1].value) == 1000
    first.run()                                                 # any rerun of the first session
    assert not first.exception
    assert len(first.dataframe) == 1                            # the schema panel only
    assert first.warning[0].value == (
        "this result (1 MB) was dropped to make room for another session's: the server keeps 1 MB of "
        "results for all sessions (QKVSCOPE_SQL_HELD_MB; set it in the environment to raise it); "
        "press Run to run the query again")
    run_button(first).click().run()
    assert len(first.dataframe[-1].value) == 1000 and not first.warning
