"""The dashboard's entry point: ``python -m app serve`` runs this with Streamlit.

It lives in its own folder because Streamlit treats a ``pages/`` folder beside
the entry script as old-style pages, which made a deep link such as
``/kv-cost`` flash a "Page not found" dialog before ``st.navigation`` ran.

Pages are the modules of ``app.pages``; each declares ``TITLE``, ``ICON``,
``ORDER``, ``URL_PATH`` and ``render()``, and the navigation is built from
them, so a page exists exactly when its module does.

At its first page the server also starts the process that reads checkpoint
files, in the background (``app/dashboard/prestart.py``; off with
``QKVSCOPE_PRESTART=0``).
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # streamlit puts the script's folder on the path; we import from the root
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from app.dashboard.prestart import prestart_reader  # noqa: E402
from app.pages import page_modules  # noqa: E402
from app.state import show_errors  # noqa: E402


@st.cache_resource(show_spinner=False)
def _reader_prestarted() -> bool:
    """Once per server, at its first page: the process that reads checkpoint files started in
    the background, so that the first checkpoint opened does not wait for it (``prestart``)."""
    return prestart_reader() is not None


_reader_prestarted()
st.set_page_config(page_title="qkvscope", page_icon=str(ROOT / "assets" / "logo.png"),
                   layout="wide")
st.logo(str(ROOT / "assets" / "logo.png"))

pages = [
    st.Page(lambda m=mod: show_errors(m.render), title=mod.TITLE, icon=mod.ICON,
            url_path=mod.URL_PATH, default=(i == 0))
    for i, mod in enumerate(page_modules())
]
st.navigation(pages).run()
