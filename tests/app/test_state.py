"""app.state: the URL is written once per change (one browser-history entry per user action)."""
from __future__ import annotations

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
    at = AppTest.from_string(_SCRIPT.format(root=str(ROOT)))
    at.query_params["keep"] = "1"
    at.run()
    assert not at.exception, at.exception
    assert at.session_state["writes"] == [{"keep": "1", "a": "1", "b": ["x", "y"]}]
    at.run()                                         # a rerun with the URL as it is writes nothing
    assert at.session_state["writes"] == [{"keep": "1", "a": "1", "b": ["x", "y"]}]
