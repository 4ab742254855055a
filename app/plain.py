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
* ``html(s)``: for plotly text (titles, axis titles, annotations, hover lines
  sent as data): ``&``, ``<``, ``>`` as entities, which plotly shows as the
  characters themselves;
* ``hover(s)``: for a name written into a plotly ``hovertemplate``: ``html(s)``,
  and ``%{`` as ``&#37;{``, so that the name is shown as written, not read as
  one of the template's ``%{...}`` fields.

``app.figures.as_text`` (every figure the dashboard draws and the CLI writes)
passes trace names and legend group titles through ``html``; titles, axis
titles and tooltips, built with ``<br>``, escape the names where they are
built (``app.charts``, ``app.page_figures``, the pages' own figures).
Not escaped: what plotly sets as plain text (parallel coordinates' tick texts).
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


def hover(text: object) -> str:
    """``text`` inside a plotly ``hovertemplate``: ``html(text)`` with ``%{`` as ``&#37;{`` (no field)."""
    return html(text).replace("%{", "&#37;{")
