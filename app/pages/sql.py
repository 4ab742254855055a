"""SQL: read-only queries against the database, for users who want their own cut."""
from __future__ import annotations

import streamlit as st

from app.state import get_store, query_param, set_query_params
from loaders.sql_console import run_readonly_query, schema

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


def render() -> None:
    store = get_store()
    st.title("SQL")
    st.caption("Read-only: one SELECT at a time; no files, no ATTACH, no writes. "
               "The database is DuckDB, so its whole SQL dialect is here.")
    with st.expander("Tables and columns"):
        st.dataframe(schema(store), hide_index=True, width="stretch")
    sql = st.text_area("Query", value=query_param("q", EXAMPLE), height=180)
    c1, c2, _ = st.columns([1, 1, 3])
    timeout = c1.number_input("Time limit (s)", min_value=1, max_value=120,
                              value=int(query_param("timeout", "10")))
    max_rows = c2.number_input("Row limit", min_value=10, max_value=1_000_000,
                               value=int(query_param("rows", "10000")), step=1000)
    if not st.button("Run", type="primary", icon=":material/play_arrow:") and "q" not in st.query_params:
        return
    set_query_params(q=sql, timeout=int(timeout), rows=int(max_rows))
    result = run_readonly_query(store, sql, timeout_s=float(timeout), max_rows=int(max_rows))
    note = f", first {max_rows:,} shown" if result.truncated else ""
    n = len(result.frame)
    st.caption(f"{n:,} row{'' if n == 1 else 's'} in {result.seconds:.3f} s{note}")
    st.dataframe(result.frame, hide_index=True, width="stretch")
    st.download_button("Download CSV", result.frame.to_csv(index=False).encode(),
                       file_name="qkvscope-query.csv", mime="text/csv", icon=":material/download:")
