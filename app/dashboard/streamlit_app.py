"""The dashboard's entry point: ``python -m app serve`` runs this with Streamlit.

``app`` is imported as installed, or from the checkout that ``python -m app`` found
it in (the server keeps its working directory and ``PYTHONPATH``: ``app.commands.serve``).
It lives in its own folder because Streamlit treats a ``pages/`` folder beside
the entry script as old-style pages, which made a deep link such as
``/kv-cost`` flash a "Page not found" dialog before ``st.navigation`` ran.

Pages are the modules of ``app.pages``; each declares ``TITLE``, ``ICON``,
``ORDER``, ``URL_PATH`` and ``render()``, and the navigation is built from
them, so a page exists exactly when its module does.
"""
from __future__ import annotations

import streamlit as st

from app.figures import format_switch
from app.pages import page_modules
from app.paths import LOGO
from app.state import show_errors


st.set_page_config(page_title="qkvscope", page_icon=str(LOGO), layout="wide")
st.logo(str(LOGO))

pages = [
    st.Page(lambda m=mod: show_errors(m.render), title=mod.TITLE, icon=mod.ICON,
            url_path=mod.URL_PATH, default=(i == 0))
    for i, mod in enumerate(page_modules())
]
page = st.navigation(pages)
format_switch()          # below the navigation: what each chart's camera button downloads (app.figures)
page.run()
