"""Text from a user or a file, shown as text: never as Markdown, HTML or a link.

Run and metric names come from logs, checkpoint paths from uploads, link values
from whoever wrote the link. Streamlit renders the strings of ``st.caption``,
``st.warning``, ``st.info``, ``st.error`` and ``st.markdown`` as Markdown, so
``![x](https://host/pixel)`` draws a remote image and ``[text](https://host)`` a
link; plotly renders a subset of HTML in legends, tooltips and titles, so
``<a href="...">`` is a link there. Every such string goes through one of:

* ``md(s)``: for Streamlit Markdown: every ASCII punctuation character
  backslash-escaped (CommonMark renders an escaped character as itself, so
  ``\\[`` starts no link, ``\\<`` no HTML, ``\\:`` no ``:material/...:`` icon,
  ``\\$`` no formula), line breaks as spaces;
* ``html(s)``: for plotly text: ``&``, ``<``, ``>`` as entities, which plotly
  shows as the characters themselves.

``app.figures.show`` passes every figure's trace names and legend group titles
through ``html``; tooltips, built with ``<br>``, escape the names where they are
built.
"""
from __future__ import annotations

import html as _html
import re
import string

_PUNCT = re.compile("([" + re.escape(string.punctuation) + "])")


def md(text: object) -> str:
    """``text`` as Streamlit Markdown that renders exactly that text, on one line."""
    return _PUNCT.sub(r"\\\1", " ".join(str(text).splitlines()))


def html(text: object) -> str:
    """``text`` for plotly's HTML-subset text: ``&``, ``<``, ``>`` as entities."""
    return _html.escape(str(text), quote=False)
