"""Run one dashboard page in Streamlit's AppTest, exactly as the navigation runs it."""
from __future__ import annotations

import re
from pathlib import Path

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
import importlib
from app.state import show_errors
page = importlib.import_module("app.pages.{name}")
show_errors(page.render)
"""


def page_test(name: str, query: dict | None = None, timeout: float = 60) -> AppTest:
    at = AppTest.from_string(_SCRIPT.format(root=str(ROOT), name=name), default_timeout=timeout)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    return at


def shown(markdown: str) -> str:
    """What a reader sees of a Markdown text the pages escaped (``app.plain.md``): the text
    without its backslash escapes."""
    return re.sub(r"\\(.)", r"\1", markdown)
