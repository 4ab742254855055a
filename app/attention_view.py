"""Attention maps as the Inspector draws them: every head of a layer as small multiples on one
colour scale, and one head enlarged, fluid up to thousands of tokens.

A map of T x T weights is drawn as at most ``bins`` x ``bins`` cells: when T is larger, each cell
is the maximum over its block of ceil(T / bins)^2 weights (max-pooling, so a single sharp
attention spike stays visible, where averaging would wash it out), and its tooltip names the
query and key tokens of that maximum. The figures are plain heatmap traces (drawn by plotly as
one image), with ``bins`` = 48 per small multiple and 128 enlarged, so 2,048 tokens cost the
browser what 128 do.
"""
from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app import plain

#: Cells per axis of each small multiple, and of the enlarged head.
GRID_BINS, LARGE_BINS = 48, 128
#: Small multiples per row of the grid.
GRID_COLS = 4


def pool_max(weights: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Max-pool a ``[T, T]`` map into at most ``bins`` x ``bins`` blocks of ``s = ceil(T / bins)``.

    Returns ``(z, q, k)``, each ``[n, n]`` with ``n = ceil(T / s)``: the block maxima and the query
    (row) and key (column) index of each maximum (the first one on ties). ``T <= bins`` gives the
    map itself with ``q[i, j] = i``, ``k[i, j] = j``.
    """
    w = np.asarray(weights, dtype=np.float32)
    t = w.shape[0]
    s = max(1, math.ceil(t / bins))
    n = math.ceil(t / s)
    padded = np.full((n * s, n * s), -np.inf, dtype=np.float32)   # padding never wins the max
    padded[:t, :t] = w
    blocks = padded.reshape(n, s, n, s).transpose(0, 2, 1, 3).reshape(n, n, s * s)  # (n, n, s*s)
    flat = blocks.argmax(axis=2)                                                    # (n, n)
    z = np.take_along_axis(blocks, flat[..., None], axis=2)[..., 0]
    rows, cols = np.divmod(flat, s)
    q = np.arange(n)[:, None] * s + rows
    k = np.arange(n)[None, :] * s + cols
    return z, q, k


def _hover(q: np.ndarray, k: np.ndarray, tokens: list[str]) -> np.ndarray:
    """Per cell: ``[query, key]``, the tokens of the cell's maximum, as ``"12 'fox'"``: a ``[n, n, 2]``
    string array (numpy arrays go to the browser without plotly validating each cell)."""
    names = np.array([plain.html(f"{i} {t!r}") for i, t in enumerate(tokens)] or [""])
    clip = len(names) - 1
    return np.stack([names[np.minimum(q, clip)], names[np.minimum(k, clip)]], axis=-1)


def _template(pooled: bool, lead: str = "") -> str:
    what = "block max at " if pooled else ""
    return f"{lead}{what}query %{{customdata[0]}}<br>key %{{customdata[1]}}<br>weight %{{z:.3f}}<extra></extra>"


def _axis_ticks(n: int, s: int, tokens: list[str], max_ticks: int = 12) -> tuple[list[int], list[str]]:
    step = max(1, math.ceil(n / max_ticks))
    where = list(range(0, n, step))
    return where, [plain.html(f"{i * s}:{tokens[i * s]}") if i * s < len(tokens) else str(i * s) for i in where]


def shared_max(maps: np.ndarray) -> float:
    """The top of the colour scale shared by all heads of a layer: their largest weight (1 when none)."""
    finite = maps[np.isfinite(maps)]
    return float(finite.max()) if finite.size and finite.max() > 0 else 1.0


def grid_figure(maps: np.ndarray, tokens: list[str], *, layer: int, selected: int | None = None,
                bins: int = GRID_BINS) -> go.Figure:
    """All heads of one layer (``maps``: ``[n_heads, T, T]``) as small multiples, one colour scale
    from 0 to the layer's largest weight; ``selected`` (the enlarged head) is outlined."""
    n_heads, t = maps.shape[0], maps.shape[-1]
    cols = min(GRID_COLS, n_heads)
    rows = math.ceil(n_heads / cols)
    zmax = shared_max(maps)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[f"L{layer}H{h}" for h in range(n_heads)],
                        horizontal_spacing=0.03, vertical_spacing=0.06 if rows > 1 else 0.0)
    for h in range(n_heads):
        z, q, k = pool_max(maps[h], bins)
        s = max(1, math.ceil(t / bins))
        fig.add_trace(go.Heatmap(
            z=z, customdata=_hover(q, k, tokens), coloraxis="coloraxis", name=f"L{layer}H{h}",
            hovertemplate=_template(s > 1, f"L{layer}H{h}<br>")),
            row=h // cols + 1, col=h % cols + 1)
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False, autorange="reversed", scaleanchor=None)
    if selected is not None and 0 <= selected < n_heads:
        ax = "" if selected == 0 else str(selected + 1)
        fig.add_shape(type="rect", xref=f"x{ax} domain", yref=f"y{ax} domain", x0=0, y0=0, x1=1, y1=1,
                      line=dict(color="#d62728", width=3))
    fig.update_layout(coloraxis=dict(colorscale="Blues", cmin=0, cmax=zmax,
                                     colorbar=dict(title=dict(text="weight<br>(all heads)"))),
                      height=60 + 190 * rows, margin=dict(l=10, r=10, t=40, b=10))
    return fig


def head_figure(weights: np.ndarray, tokens: list[str], *, title: str, zmax: float = 1.0,
                bins: int = LARGE_BINS) -> go.Figure:
    """One head's map (query rows x key columns, ``[T, T]``) enlarged, max-pooled to ``bins`` cells
    per axis past that many tokens, on the grid's colour scale (0 to ``zmax``)."""
    t = weights.shape[-1]
    s = max(1, math.ceil(t / bins))
    z, q, k = pool_max(weights, bins)
    fig = go.Figure(go.Heatmap(z=z, customdata=_hover(q, k, tokens), colorscale="Blues",
                               zmin=0, zmax=zmax, colorbar=dict(title=dict(text="weight")),
                               hovertemplate=_template(s > 1)))
    where, labels = _axis_ticks(z.shape[0], s, tokens)
    fig.update_xaxes(tickvals=where, ticktext=labels, title="key" + (f" (blocks of {s} tokens)" if s > 1 else ""))
    fig.update_yaxes(tickvals=where, ticktext=labels, autorange="reversed",
                     title="query" + (f" (blocks of {s} tokens)" if s > 1 else ""))
    fig.update_layout(title=dict(text=plain.html(title)), height=560, margin=dict(l=10, r=10, t=50, b=10))
    return fig
