"""Papers: every quantitative claim of the two papers beside the same quantity on this database.

The catalogue is ``analysis.paper_claims.CLAIMS``; the measurements come from
``loaders.papers.paper_inputs`` through ``analysis.paper_claims.measure``.
URL keys: ``paper`` (a, b or both), ``ckpts`` (``latest``: each run's latest
checkpoint; ``all``), ``loss`` (the loss whose final values are compared).
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from analysis.paper_claims import PAPER_A, PAPER_B, PAPERS, Inputs, measure
from analysis.registry import METRIC_VERSION
from app import tables
from app.attempts import analyse_each, show_batch
from app.state import (current_notes, data_version, get_store, project_filter, query_param, set_query_params,
                       cached_read)
from loaders import papers

TITLE = "Papers"
ICON = ":material/menu_book:"
ORDER = 70
URL_PATH = "papers"

_PAPER_KEYS = {"both": None, "a": PAPER_A, "b": PAPER_B}
_PAPER_LABELS = {"both": "Both papers", "a": f"Query-free attention ({PAPER_A})",
                 "b": f"Projection sharing ({PAPER_B})"}
_SCOPE_LABELS = {"latest": "each run's latest checkpoint", "all": "every stored checkpoint"}


@cached_read
def _table(store, scope: str, loss: str, projects: tuple) -> pd.DataFrame:
    return measure(Inputs(**papers.paper_inputs(store, metric_version=METRIC_VERSION, scope=scope,
                                                loss_metric=loss, projects=list(projects))))


def _choice(name: str, options, default: str) -> str:
    raw = query_param(name)
    return raw if raw in options else default


def _analyse_button(store, scope: str, projects: list[str]) -> None:
    ids = papers.compared_checkpoints(store, scope, projects)["id"].tolist()
    version = data_version(store)
    # the staleness rule analyze applies (app.state.current_notes): a job of another metric
    # version, or without a metric registered since, counts as not analysed
    todo = [c for c in ids if current_notes(str(store.path), version, int(c), ("weights",)) is None]
    show_batch("papers_analysed")
    if not todo:
        return
    st.info(f"{len(todo)} of {len(ids)} compared checkpoints have no stored weight analysis yet, so the K/V "
            "similarity and rank rows stay empty until they are analysed.", icon=":material/info:")
    if st.button(f"Analyse {len(todo)} checkpoints (weights)", icon=":material/play_arrow:", key="papers_analyse"):
        # one checkpoint that fails does not stop the others (app.attempts.analyse_each)
        st.session_state["papers_analysed"] = analyse_each(store, [(int(c), f"checkpoint {c}") for c in todo])
        st.rerun()


def render() -> None:
    st.title(TITLE)
    st.caption("Every number the two papers state, where it is stated, and beside it the same quantity "
               "measured on this database, with its chance level and how many heads, runs or checkpoints "
               "stand behind it.")
    st.markdown("\n".join(f"* **{p['short']}**: arXiv [{a}](https://arxiv.org/abs/{a}), {p['title']}; code "
                          f"`{p['code']}`" for a, p in PAPERS.items()))
    store = get_store()
    if not store.path.exists():
        st.info(f"No database at {store.path} yet: run `python -m app serve` (builds the demo) or "
                f"`python -m app ingest PATH --db {store.path}`.", icon=":material/inbox:")
        return
    version = data_version(store)
    chosen = project_filter(store, version)
    losses = papers.loss_metrics(store) or ["val/loss"]
    c1, c2, c3 = st.columns([2, 2, 1])
    keys = list(_PAPER_KEYS)
    paper = c1.radio("Paper", keys, index=keys.index(_choice("paper", keys, "both")),
                     format_func=_PAPER_LABELS.get, horizontal=True, key="papers_paper")
    scopes = list(papers.SCOPES)
    scope = c2.radio("Checkpoints compared", scopes, index=scopes.index(_choice("ckpts", scopes, "latest")),
                     format_func=_SCOPE_LABELS.get, horizontal=True, key="papers_ckpts")
    loss = c3.selectbox("Loss compared", losses, index=losses.index(_choice("loss", losses, losses[0])),
                        key="papers_loss")
    set_query_params(paper=None if paper == "both" else paper, ckpts=None if scope == "latest" else scope,
                     loss=None if loss == losses[0] else loss)
    _analyse_button(store, scope, chosen)

    table = _table(str(store.path), version, scope, loss, tuple(chosen))
    wanted = _PAPER_KEYS[paper]
    if wanted is not None:
        table = table[table["source"] == wanted]
    shown = table.assign(measured=table["measured"].fillna("not measured here"),
                         paper_value=table["paper_value"] + " " + table["units"])
    columns = {"claim": "claim", "model": "paper's model", "paper_value": "paper", "where": "where stated",
               "measured": "on this database",
               "chance": "chance level", "n": "n", "reading": "how to read it"}
    for arxiv, part in shown.groupby("source", sort=True):
        st.subheader(f"{PAPERS[arxiv]['short']} (arXiv {arxiv})")
        # a static table: long texts wrap instead of hiding behind a scrollbar
        st.table(part[list(columns)].rename(columns=columns).set_index("claim"))
    st.caption("Flat K/V cosine is basis-dependent: rotating a head's Q and K output bases together, or its V "
               "basis with W_O to match, changes no attention output but changes cos(vec K, vec V), so a near-0 flat cosine does not "
               "mean K and V read different input directions; linear CKA is invariant to such rotations. "
               "The projection-sharing authors' own figures are per whole layer, all heads at once, averaged over "
               "the layers (their kv_similarity_llm.py): the rows citing it measure exactly that, with the per-head "
               "figures beside. "
               "Perplexity changes are exp(loss_variant - loss_qkv) - 1 at matched weight decay, within one project "
               "and geometry, and set against the paper's per-token figures only where the runs' loss is per token "
               "(a tokenizer or a vocabulary over 256); a claim is compared only with runs of its head-sharing "
               "class (MHA, GQA-g with g KV heads, MQA). "
               "Units: MB = 10^6 bytes, MiB = 2^20 bytes.")
    st.download_button("Download CSV", tables.csv_bytes(table.drop(columns=["source"])),
                       file_name="paper-claims.csv", mime="text/csv", icon=":material/download:",
                       key="papers_csv")
