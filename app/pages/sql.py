"""SQL: read-only queries against the database, for users who want their own cut.

A link's ``?q=`` (and ``timeout``, ``rows``) fills the editor; nothing runs
until Run is clicked, so a link alone costs the server nothing. The editor and
the limits are keyed widgets whose state is seeded from the URL once per
session: passing the URL's value as ``value=`` made each Run (which writes the
URL) change the widget's identity, so the next edit was thrown away and the
previous query ran again. The last result is kept in the session and shown on
every rerun until the next Run, within the server's budget for all sessions'
results (``loaders.sql_console.hold``): a result dropped for another session's
says so, and Run runs it again. The previous result is let go before the next
query runs, the grid is sent whole (a lazily served grid would keep an Arrow
copy in the server) and the CSV is built only when Download is clicked.
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from app import tables
from app.state import data_version, get_store, project_filter, query_param, set_query_params, url_int, url_notes
from loaders.errors import QueryError
from loaders.sql_console import (Held, check_query, dropped_message, hold, release, run_readonly_query, schema,
                                 sql_budget)

TITLE = "SQL"
ICON = ":material/terminal:"
ORDER = 90
URL_PATH = "sql"

EXAMPLE = """-- final validation loss of every run, best first
SELECT r.name, r.variant, r.weight_decay, arg_max(p.value, p.step) AS final_val_loss
FROM runs r JOIN points p ON p.run_id = r.id
WHERE p.metric = 'val/loss'
GROUP BY ALL
ORDER BY final_val_loss"""

_QUERY, _TIMEOUT, _ROWS, _RESULT = "sql_query", "sql_timeout", "sql_rows", "sql_result"


def _seed_from_url(max_timeout: int) -> None:
    """Widget state from the URL, once: later reruns keep what the user typed."""
    if _QUERY not in st.session_state:
        st.session_state[_QUERY] = query_param("q", EXAMPLE)
    if _TIMEOUT not in st.session_state:
        st.session_state[_TIMEOUT] = url_int(
            "timeout", min(sql_budget("QKVSCOPE_SQL_TIMEOUT_S"), max_timeout), 1, max_timeout)
    if _ROWS not in st.session_state:
        st.session_state[_ROWS] = url_int("rows", sql_budget("QKVSCOPE_SQL_MAX_ROWS"), 10, 1_000_000)


def render() -> None:
    store = get_store()
    st.title("SQL")
    result_mb = sql_budget("QKVSCOPE_SQL_RESULT_MB")
    st.caption("Read-only: one SELECT at a time; no files, no ATTACH, no writes. "
               "The database is DuckDB, so its whole SQL dialect is here. "
               f"Each query runs in its own process with "
               f"{sql_budget('QKVSCOPE_SQL_MEMORY_MB'):,} MB of memory and results up to "
               f"{result_mb:,} MB (see docs/security.md, section The SQL page, to change them).")
    if store.path.exists():
        chosen = project_filter(store, data_version(store))
        if chosen:          # a query reads every project: say how to narrow it the same way
            names = ", ".join("'" + p.replace("'", "''") + "'" for p in chosen)
            st.caption(f"Queries read every project; to narrow one as the sidebar does: "
                       f"`WHERE project IN ({names})` on `runs` or `checkpoints`.")
    with st.expander("Tables and columns"):
        st.dataframe(schema(store), hide_index=True, width="stretch")
    max_timeout = sql_budget("QKVSCOPE_SQL_MAX_TIMEOUT_S")
    from_link = "q" in st.query_params and _QUERY not in st.session_state
    _seed_from_url(max_timeout)
    url_notes()
    sql = st.text_area("Query", key=_QUERY, height=180)
    c1, c2, _ = st.columns([1, 1, 3])
    timeout = c1.number_input("Time limit (s)", min_value=1, max_value=max_timeout, key=_TIMEOUT)
    max_rows = c2.number_input("Row limit", min_value=10, max_value=1_000_000, step=1000, key=_ROWS)
    if st.button("Run", type="primary", icon=":material/play_arrow:"):
        try:
            # refused before it reaches the URL: Streamlit url-encodes the query parameters byte by
            # byte (a list of one string per byte), and 8 MB of text ran a server out of memory
            check_query(sql)
            set_query_params(q=sql, timeout=int(timeout), rows=int(max_rows))
            previous = st.session_state.pop(_RESULT, None)
            release(previous[1] if isinstance(previous, tuple) else None)
            del previous
            result = run_readonly_query(store, sql, timeout_s=float(timeout), max_rows=int(max_rows))
            st.session_state[_RESULT] = (int(max_rows), hold(result))
            del result
        except QueryError as exc:
            st.session_state[_RESULT] = exc
    elif from_link:
        st.info("Query from the link: press Run to run it.", icon=":material/info:")
    last = st.session_state.get(_RESULT)
    if isinstance(last, QueryError):
        st.error(str(last), icon=":material/error:")
    elif last is not None:
        _show(*last)


def _show(shown: int, held: Held) -> None:
    result = held.result
    if result is None:
        st.warning(dropped_message(held), icon=":material/info:")
        return
    note = f", first {shown:,} shown" if result.truncated else ""
    n = len(result.frame)
    st.caption(f"{n:,} row{'' if n == 1 else 's'} in {result.seconds:.3f} s{note}")
    st.dataframe(result.frame, hide_index=True, width="stretch", lazy=False)
    st.download_button("Download CSV", lambda: _csv(held), file_name="qkvscope-query.csv",
                       mime="text/csv", icon=":material/download:")


def _csv(held: Held) -> bytes:
    """The kept result as CSV, built on click; once dropped, a one-line CSV saying so."""
    if held.result is None:
        return tables.csv_bytes(pd.DataFrame({"message": [dropped_message(held)]}))
    return tables.csv_bytes(held.result.frame)
