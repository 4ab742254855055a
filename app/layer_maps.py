"""The Inspector's cross-layer map: a layer x layer heatmap of one ``layer_pair`` metric, the pairs
that would share best, and what cross-layer KV sharing would save, linked to the KV calculator.

* ``pair_grid(results, metric)``: the stored rows ``(layer, layer2)`` (``l < l2``,
  ``analysis.cross_layer``) as a symmetric ``[L, L]`` grid of values, with the grids of their
  chance levels, above-chance flags and tooltips; the diagonal (a layer with itself) is empty.
* ``layer_map_figure(results, metric)``: that grid as a heatmap diverging from the metric's chance
  level (``charts.DIVERGING``, white at chance, the range from ``charts.diverging_range``, so a
  random model's values inside the null band stay pale); above-chance cells starred; each cell's
  tooltip gives its value, its own chance level and, for activation metrics, the tokens and the 95%
  interval. Values are written in the cells up to 16 layers; past that the tooltip carries them.
* ``best_pairs(results, metric, k)``: the ``k`` pairs with the largest excess over their chance level.
* ``sharing_plans(results, metric, n_layers)``: two cross-layer sharing schemes read off the map:
  CLA-2 (Brandon et al. 2024, arXiv 2405.12981: layers ``2i`` and ``2i+1`` share one KV cache, half
  the KV cache) and YOCO (Sun et al. 2024, arXiv 2405.05254: the upper half of the layers reads one
  cache made at the middle layer; the KV cache of ``L`` layers becomes about one layer's, the
  lower half's constant-size window caches aside); per scheme the mean value and mean chance over
  the pairs it would share, how many of those pairs are above chance, the KV cache it keeps, and the
  KV calculator's "layers per shared cache" (``lpc``) that models it.
* ``section(results, checkpoint_id)``: the Inspector's section (one call from
  ``app.pages.inspector``): metric picker, figure, tables and the links.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from analysis.registry import BY_NAME, METRICS
from app import charts

#: Layers past which the values are not written in the cells (the tooltip has them).
TEXT_LAYERS = 16
#: The KV calculator page (``app.pages.kv_cost.URL_PATH``) and its parameters used here.
KV_PAGE = "kv-cost"


def pair_metrics(results: pd.DataFrame) -> list[str]:
    """The ``layer_pair`` metrics with stored rows, in registry order."""
    stored = set(results["metric"].unique()) if len(results) else set()
    return [m.name for m in METRICS if m.axis == "layer_pair" and m.name in stored]


def _rows(results: pd.DataFrame, metric: str) -> pd.DataFrame:
    if "layer2" not in results.columns:
        return results.iloc[:0]
    rows = results[(results["metric"] == metric) & results["layer2"].notna() & results["layer"].notna()]
    return rows.assign(layer=rows["layer"].astype(int), layer2=rows["layer2"].astype(int))


def pair_grid(results: pd.DataFrame, metric: str) -> dict:
    """``{"layers", "value", "chance", "above", "hover"}``: ``[L, L]`` symmetric grids over the layers
    that appear in ``metric``'s pair rows (NaN / False / "" where no pair is stored, the diagonal
    included)."""
    rows = _rows(results, metric)
    layers = sorted(set(rows["layer"]) | set(rows["layer2"]))
    pos = {l: i for i, l in enumerate(layers)}
    n = len(layers)
    value, chance = np.full((n, n), np.nan), np.full((n, n), np.nan)
    above = np.zeros((n, n), dtype=bool)
    hover = [["" for _ in range(n)] for _ in range(n)]
    _, flagged = charts.flags_of(rows)
    for (l, l2, v, c, nt, lo, hi), a in zip(zip(rows["layer"], rows["layer2"], rows["value"],
                                                charts._col(rows, "chance"), charts._col(rows, "n_tokens"),
                                                charts._col(rows, "ci_low"), charts._col(rows, "ci_high")),
                                            flagged):
        i, j = pos[l], pos[l2]
        text = (f"L{l} and L{l2}<br>{metric} " + charts.value_text(v, c, nt, lo, hi)
                + ("<br>above chance (outside the null band, 5% false discovery rate)" if a else ""))
        for x, y in ((i, j), (j, i)):
            value[x, y], chance[x, y], above[x, y], hover[x][y] = v, c, a, text
    return {"layers": layers, "value": value, "chance": chance, "above": above, "hover": hover}


def layer_map_figure(results: pd.DataFrame, metric: str) -> go.Figure:
    """Layer x layer heatmap of ``metric`` centred on its chance level (module docstring)."""
    grid = pair_grid(results, metric)
    if not grid["layers"]:
        return charts.empty_figure(f"{metric}: no pairs of layers stored")
    rows = _rows(results, metric)
    z, n = grid["value"], len(grid["layers"])
    labels = [f"L{l}" for l in grid["layers"]]
    fig = charts.pair_heatmap(z, grid["above"], labels, grid["hover"], rows, metric, text_up_to=TEXT_LAYERS)
    side = max(320, min(900, 22 * n + 160))
    fig.update_layout(height=side, margin=dict(l=60, r=20, t=40, b=40),
                      title=dict(text=f"{metric}: pairs of layers (diagonal: a layer with itself, not a pair)",
                                 font=dict(size=13)))
    return fig


def best_pairs(results: pd.DataFrame, metric: str, k: int = 5) -> pd.DataFrame:
    """The ``k`` pairs with the largest ``value - chance`` (all pairs by value where no chance is
    stored): ``layer, layer2, value, chance, excess, above_chance``."""
    rows = _rows(results, metric)
    if rows.empty:
        return pd.DataFrame(columns=["layer", "layer2", "value", "chance", "excess", "above_chance"])
    chance = pd.to_numeric(charts._col(rows, "chance"), errors="coerce")
    _, flagged = charts.flags_of(rows)
    out = pd.DataFrame({"layer": rows["layer"].to_numpy(), "layer2": rows["layer2"].to_numpy(),
                        "value": rows["value"].to_numpy(dtype=float), "chance": chance.to_numpy(dtype=float),
                        "above_chance": flagged.to_numpy()})
    out["excess"] = out["value"] - out["chance"].fillna(0.0)
    out = out.sort_values(["excess", "layer", "layer2"], ascending=[False, True, True], kind="stable")
    return out.head(k)[["layer", "layer2", "value", "chance", "excess", "above_chance"]].reset_index(drop=True)


def _scheme_pairs(n_layers: int) -> dict[str, list[tuple[int, int]]]:
    """The pairs of layers each sharing scheme makes share one cache (``n_layers`` layers 0..L-1)."""
    middle = n_layers // 2
    return {"CLA-2": [(l, l + 1) for l in range(0, n_layers - 1, 2)],
            "YOCO": [(middle, l) for l in range(middle + 1, n_layers)]}


def sharing_plans(results: pd.DataFrame, metric: str, n_layers: int) -> pd.DataFrame:
    """Per scheme (module docstring): ``scheme, pairs, mean_value, mean_chance, above_chance (of
    pairs stored), kv_kept`` (the fraction of the KV cache kept) and ``lpc`` (the KV calculator's
    layers per shared cache: 2 for CLA-2, ``n_layers`` for YOCO's one cache)."""
    rows = _rows(results, metric)
    by_pair = {(int(l), int(l2)): (v, c, a) for l, l2, v, c, a in
               zip(rows["layer"], rows["layer2"], rows["value"], charts._col(rows, "chance"), charts.flags_of(rows)[1])}
    out = []
    for scheme, pairs in _scheme_pairs(n_layers).items():
        found = [by_pair[p] for p in pairs if p in by_pair]
        vals = [v for v, _, _ in found if np.isfinite(v)]
        chances = [c for _, c, _ in found if np.isfinite(c)]
        kept = 1 / 2 if scheme == "CLA-2" else 1 / n_layers
        out.append({"scheme": scheme, "pairs": len(pairs), "stored": len(found),
                    "mean_value": float(np.mean(vals)) if vals else math.nan,
                    "mean_chance": float(np.mean(chances)) if chances else math.nan,
                    "above_chance": int(sum(bool(a) for _, _, a in found)), "kv_kept": kept,
                    "lpc": 2 if scheme == "CLA-2" else n_layers})
    return pd.DataFrame(out)


def kv_link(checkpoint_id: int, lpc: int) -> str:
    """The KV calculator's address for a stored checkpoint with ``lpc`` layers per shared cache."""
    return f"./{KV_PAGE}?src=checkpoint&ckpt={int(checkpoint_id)}&lpc={int(lpc)}"


def section(results: pd.DataFrame, checkpoint_id: int | None, n_layers: int) -> None:
    """The Inspector's cross-layer section (module docstring); nothing where no pair is stored.
    ``checkpoint_id`` None (a scratch upload): no calculator link."""
    import streamlit as st   # here: the figure builders above are used without a page too

    from app import figures
    from app.state import set_query_params, url_choice, url_notes

    available = pair_metrics(results)
    st.subheader("Pairs of layers")
    if not available:
        st.caption("No cross-layer values stored for this checkpoint (a model of one layer has no pair).")
        return
    chosen = url_choice("xmetric", available, available[0], why="not stored for this checkpoint")
    url_notes()
    metric = st.selectbox("Cross-layer metric", available, index=available.index(chosen), key="insp_xmetric")
    set_query_params(xmetric=None if metric == available[0] else metric)
    info = BY_NAME[metric]
    st.caption(f"**{metric}**: {info.help}. Chance: {info.chance_help}. Colours diverge from chance: white "
               "at chance, red above; * above chance.")
    figures.show(layer_map_figure(results, metric), key="insp_layer_map")
    left, right = st.columns(2)
    with left:
        st.caption("Pairs furthest above their chance level")
        st.dataframe(best_pairs(results, metric), hide_index=True)
    with right:
        plans = sharing_plans(results, metric, n_layers)
        st.caption("What cross-layer KV sharing would share: CLA-2 (arXiv 2405.12981) pairs layers 2i and "
                   "2i+1 and keeps half the KV cache; YOCO (arXiv 2405.05254) lets the upper half read one "
                   "cache made at the middle layer, about one layer's KV cache in all")
        st.dataframe(plans.drop(columns=["lpc"]), hide_index=True)
        if checkpoint_id is not None:
            st.markdown(" · ".join(f"[{s} in the KV calculator]({kv_link(checkpoint_id, lpc)})"
                                   for s, lpc in zip(plans["scheme"], plans["lpc"])))
