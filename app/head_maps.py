"""The Inspector's cross-head map: a kv head x kv head heatmap of one layer, and the best groupings beside it.

``pair_metrics(results)``: the stored pair metrics over heads (axes ``head_pair`` and
``kv_head_pair``: ``xhead_sim_k``, ``xhead_sim_k_aligned``, ``xhead_sim_v_aligned``, and any
plugin's), in registry order. ``head_map_figure(results, metric, layer)``: that layer's
``[n, n]`` matrix from its rows ``(layer, head, head2)``; the diagonal (a head with itself, no
pair) is blank; with a chance level the colours diverge from it as on the layer x head heatmap
(white at chance, the range at least the null band), pairs called above chance starred.
``grouping_frame(rows)``: ``analysis.head_grouping.table`` rows (from the reading child,
``app.inspect_child.head_groupings``) as the table shown beside it: for ``G = n/2, n/4, 1``
the contiguous and the best free grouping with their mean and largest mean-pool residual.
``section(results, row)``: the whole section (one call from ``app.pages.inspector``), opening on the
layer of the page's ``layer`` URL value (the spectra's) where it has pairs.
"""
from __future__ import annotations


import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from analysis.registry import BY_NAME, METRICS, PAIR_AXES
from app import charts, figures
from app.attempts import attempt, file_stamp, show_failure
from app.state import query_param

#: The axes whose pairs are heads of one layer.
HEAD_PAIR_AXES = tuple(a for a in PAIR_AXES if a != "layer_pair")


def pair_metrics(results: pd.DataFrame) -> list[str]:
    """The head-pair metrics stored in ``results``, in registry order."""
    stored = set(results["metric"].unique()) if len(results) else set()
    return [m.name for m in METRICS if m.axis in HEAD_PAIR_AXES and m.name in stored]


def pair_rows(results: pd.DataFrame, metric: str, layer: int) -> pd.DataFrame:
    """``metric``'s rows of ``layer`` that are pairs (``head`` and ``head2`` set)."""
    if "head2" not in results.columns:
        return results.iloc[0:0]
    return results[(results["metric"] == metric) & (results["layer"] == layer) & results["head"].notna()
                   & results["head2"].notna()]


def pair_layers(results: pd.DataFrame, metric: str) -> list[int]:
    """The layers with pair rows of ``metric``."""
    if "head2" not in results.columns:
        return []
    rows = results[(results["metric"] == metric) & results["head2"].notna()]
    return sorted(int(x) for x in rows["layer"].unique())


def _chance_col(rows: pd.DataFrame) -> pd.Series:
    return rows["chance"] if "chance" in rows.columns else pd.Series(np.nan, index=rows.index)


def head_map_figure(results: pd.DataFrame, metric: str, layer: int) -> go.Figure:
    """Head x head heatmap of ``metric`` in ``layer`` (module docstring)."""
    rows = pair_rows(results, metric, layer)
    if rows.empty:
        return charts.empty_figure(f"{metric}: no head pairs stored for layer {layer}")
    kv = BY_NAME[metric].axis == "kv_head_pair" if metric in BY_NAME else False
    tag = "KV" if kv else "H"
    n = int(max(rows["head"].max(), rows["head2"].max())) + 1
    z = np.full((n, n), np.nan)
    star = np.zeros((n, n), dtype=bool)
    _, above = charts.flags_of(rows)
    hover = [["" for _ in range(n)] for _ in range(n)]
    for (h, h2, v, c), a in zip(zip(rows["head"], rows["head2"], rows["value"], _chance_col(rows)), above):
        h, h2 = int(h), int(h2)
        z[h, h2] = v
        star[h, h2] = bool(a)
        hover[h][h2] = (f"L{layer} {tag}{h}-{tag}{h2}<br>{metric} " + charts.value_text(v, c)
                        + ("<br>above chance (outside the null band, 5% false discovery rate)" if a else ""))
    labels = [f"{tag}{h}" for h in range(n)]
    fig = charts.pair_heatmap(z, star, labels, hover, rows, metric, text_up_to=16)
    fig.update_yaxes(title_text=f"{'kv ' if kv else ''}head")
    fig.update_xaxes(title_text=f"{'kv ' if kv else ''}head")
    side = max(300, min(800, 28 * n + 160))
    fig.update_layout(title=f"Layer {layer}: {metric}", height=side, margin=dict(l=60, r=20, t=50, b=50))
    return fig


def grouping_frame(rows: list[dict]) -> pd.DataFrame:
    """The groupings table (module docstring): ``G``, ``kind``, ``mean residual``, ``max residual``,
    ``groups`` (as ``{0,2} {1,3}``), ``search`` (exhaustive or greedy + swaps)."""
    return pd.DataFrame({
        "G": [r["groups"] for r in rows],
        "kind": [r["kind"] for r in rows],
        "mean residual": [r["cost"] for r in rows],
        "max residual": [r["max_residual"] for r in rows],
        "groups": [" ".join("{" + ",".join(map(str, g)) + "}" for g in r["grouping"]) for r in rows],
        "search": ["exhaustive" if r["exact"] else "greedy + swaps" for r in rows],
    })


@st.cache_data(show_spinner=False, max_entries=32)
def _groupings(path: str, stamp: str, layer: int) -> list[dict]:
    """``analysis.head_grouping.table`` of one layer's W_K, from ``app.inspect_child.head_groupings``
    in the reading child (``stamp``: the file's, so a changed file is read again)."""
    from app.sandbox_jobs import call  # here: only when a checkpoint is read

    return call("head_groupings", path, pooled=True, layer=int(layer))


def section(results: pd.DataFrame, row: pd.Series) -> None:
    """The cross-head section of the Inspector: a pair metric and layer picked, the heatmap, and
    beside it that layer's ``gqa_pool_residual`` and best groupings (read from the weights)."""
    metrics = pair_metrics(results)
    if not metrics:
        return
    st.subheader("Cross-head maps")
    c1, c2 = st.columns(2)
    metric = c1.selectbox("Pair metric", metrics, key="insp_pair_metric",
                          help="; ".join(f"{m}: {BY_NAME[m].help}" for m in metrics))
    layers = pair_layers(results, metric)
    chosen = query_param("layer")                 # the layer the spectra and attention maps show, if any
    start = layers.index(int(chosen)) if chosen is not None and chosen.isdigit() and int(chosen) in layers else 0
    layer = int(c2.selectbox("Layer", layers, index=start, key="insp_pair_layer"))
    left, right = st.columns([3, 2])
    figures.show(head_map_figure(results, metric, layer), key="insp_head_map", where=left)
    pool = results[(results["metric"] == "gqa_pool_residual") & (results["layer"] == layer)]
    if not pool.empty:
        p = pool.iloc[0]
        right.metric("gqa_pool_residual", f"{p['value']:.3f}",
                     help=f"{BY_NAME['gqa_pool_residual'].help}. Chance: {charts.value_text(p['value'], p['chance'])}")
    path = str(row["path"])
    stamp = file_stamp(path)
    got, failure = attempt("head_groupings", (path, stamp, layer), lambda: _groupings(path, stamp, layer))
    if failure:
        show_failure("head_groupings", failure, slot=right)
    elif got:
        right.caption("Mean-pool residual ||W_K[h] - mean_group||_F / ||W_K[h]||_F of each grouping into G "
                      "groups (`whatif --to gqa:G --grouping best` pools the free one)")
        right.dataframe(grouping_frame(got), hide_index=True)
    else:
        right.caption("One kv head: nothing to group.")
