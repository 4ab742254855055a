"""app.state: the URL is written once per change (one browser-history entry per user action)."""
from __future__ import annotations

from app.plain import md

from streamlit.testing.v1 import AppTest

from tests.app.apptest import ROOT

_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
import streamlit as st
from app.state import set_query_params

writes = st.session_state.setdefault("writes", [])
cls = type(st.query_params)
real = cls.from_dict
def counting(self, params):
    writes.append(dict(params))
    return real(self, params)
cls.from_dict = counting
try:
    set_query_params(a=1, b=["x", "y"], c=None)      # one change: one write
    set_query_params(a=1)                            # the same again: nothing written
    set_query_params(b=["x", "y"], gone=None)        # nothing changes
finally:
    cls.from_dict = real
"""


def test_a_change_is_written_once_and_no_change_not_at_all():
    at = AppTest.from_string(_SCRIPT.format(root=str(ROOT)), default_timeout=60)
    at.query_params["keep"] = "1"
    at.run()
    assert not at.exception, at.exception
    assert at.session_state["writes"] == [{"keep": "1", "a": "1", "b": ["x", "y"]}]
    at.run()                                         # a rerun with the URL as it is writes nothing
    assert at.session_state["writes"] == [{"keep": "1", "a": "1", "b": ["x", "y"]}]


def test_a_cached_read_runs_once_per_file_version_and_arguments(tmp_path):
    from app.state import cached_read

    calls = []

    def first(store, n):
        calls.append(("first", store.path.name, n))
        return n * 2

    def second(store, n):
        calls.append(("second", store.path.name, n))
        return -n

    read_first, read_second = cached_read(first), cached_read(second, max_entries=2)
    db = str(tmp_path / "a.duckdb")
    assert [read_first(db, (1, 2), 3), read_first(db, (1, 2), 3), read_second(db, (1, 2), 3)] == [6, 6, -3]
    assert read_first(db, (1, 3), 3) == 6                        # the file changed: read again
    assert read_first(str(tmp_path / "b.duckdb"), (1, 3), 3) == 6
    assert calls == [("first", "a.duckdb", 3), ("second", "a.duckdb", 3), ("first", "a.duckdb", 3),
                     ("first", "b.duckdb", 3)]
    assert read_first.__name__ == "first"


def test_url_values_a_page_cannot_use_are_named_once():
    script = """
import sys
sys.path.insert(0, {root!r})
from app.state import show_errors, url_choice, url_float, url_int, url_ints, url_notes, url_subset

def page():
    got = [url_int("a", 1), url_int("b", 2, 0, 9), url_float("c", 0.5, 0.0, 1.0), url_choice("d", ["x", "y"], "x"),
           url_ints("e"), url_subset("f", ["p", "q"], "no such thing"), url_int("absent", 7)]
    import streamlit as st
    st.session_state["got"] = got
    url_notes()
    url_notes()                                        # nothing left to say

show_errors(page)
"""
    at = AppTest.from_string(script.format(root=str(ROOT)), default_timeout=60)
    for key, value in {"a": "abc", "b": "12", "c": "nan", "d": "z", "e": "1,two,3", "f": "p,r"}.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, at.exception
    assert at.session_state["got"] == [1, 2, 0.5, "x", [1, 3], ["p"], 7]
    notes = ["a='abc' (expected an integer)", "b=12 (expected 0..9)", "c=nan (expected 0..1)",
             "d='z' (one of x, y)", "e='two' (expected an integer)", "f='r' (no such thing)"]
    assert [c.value for c in at.caption] == ["Ignored in the URL: " + "; ".join(map(md, notes)) + "."]
