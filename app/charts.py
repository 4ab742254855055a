"""Plotly figure builders shared by the dashboard pages: a DataFrame in, a figure out.

Pure functions, no streamlit, no I/O. Every figure gets the same look
(``_layout``) and variants keep one colour across pages (``variant_color``).
Curves use ``Scattergl`` so ten runs of 2,000 points draw instantly.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

#: One colour per attention variant, the same on every page.
VARIANT_COLORS = {
    "qkv": "#4C78A8", "wq_identity": "#F58518", "q_eq_k": "#54A24B", "k_eq_v": "#E45756",
    "q_eq_k_eq_v": "#B279A2", "unknown": "#9D9D9D",
}
_CYCLE = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D",
          "#EECA3B", "#BAB0AC"]

X_TITLES = {"step": "step", "tokens": "tokens seen", "wall_time": "wall time since start (s)"}


def variant_color(variant: str | None, i: int = 0) -> str:
    return VARIANT_COLORS.get(str(variant), _CYCLE[i % len(_CYCLE)])


def run_color(i: int) -> str:
    return _CYCLE[i % len(_CYCLE)]


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def _nested(z: np.ndarray) -> list[list[float | None]]:
    """A 2-D array as nested lists with None for NaN (readable hover values and JSON for tests)."""
    return [[None if not np.isfinite(v) else float(v) for v in row] for row in np.asarray(z, dtype=float)]


def _noise_range(values) -> tuple[float, float] | None:
    """A value range for values that are all equal up to float32 noise (e.g. ``kv_cka``
    of a K=V model, 1 - 3e-8 to 1 + 2e-8), ``+-0.5 * max(1, |v|)`` around them, so
    a colour scale or axis is not stretched over rounding error; None otherwise."""
    v = np.asarray(values, dtype=float)
    finite = v[np.isfinite(v)]
    if not finite.size:
        return None
    lo, hi = float(finite.min()), float(finite.max())
    if hi - lo > 1e-6 * max(1.0, abs(hi)):
        return None
    return lo - 0.5 * max(1.0, abs(lo)), hi + 0.5 * max(1.0, abs(hi))


# -- chance levels: what every metric figure is read against -----------------------

#: Colour scale of metric heatmaps: blue below chance, white at chance, red above.
DIVERGING = "RdBu_r"


def _finite(v) -> bool:
    return v is not None and v is not pd.NA and isinstance(v, (int, float, np.number)) and math.isfinite(v)


def num(v) -> str:
    """A metric value as text: 4 significant digits, "undefined" for NaN/None."""
    return f"{float(v):.4g}" if _finite(v) else "undefined"


def interval_text(lo, hi) -> str:
    """A 95% interval as ``"0.28–0.34"``; "" when either bound is missing."""
    return f"{num(lo)}–{num(hi)}" if _finite(lo) and _finite(hi) else ""


def value_text(value, chance=None, n_tokens=None, ci_low=None, ci_high=None) -> str:
    """A value with what it is read against: ``"0.31 (chance 0.25)"``, and for a sampled
    (activation) value ``"<br>n=4096 tokens, 95% CI 0.28–0.34"``."""
    out = num(value) + (f" (chance {num(chance)})" if _finite(chance) else " (no chance level stored)")
    sampled = []
    if _finite(n_tokens):
        sampled.append(f"n={int(n_tokens)} tokens")
    if (ci := interval_text(ci_low, ci_high)):
        sampled.append(f"95% CI {ci}")
    return out + ("<br>" + ", ".join(sampled) if sampled else "")


def _col(frame: pd.DataFrame, name: str) -> pd.Series:
    """``frame[name]``, or NaN when the frame has no such column (results stored before chance levels)."""
    return frame[name] if name in frame.columns else pd.Series(np.nan, index=frame.index)


def chance_of(rows: pd.DataFrame) -> float | None:
    """The one chance level a set of rows is read against: the median of their ``chance``
    (weight metrics share it across a layer's heads; activation chance differs a little per
    head, and each cell's own chance is in its tooltip); None when none is stored."""
    c = pd.to_numeric(_col(rows, "chance"), errors="coerce").dropna()
    return float(c.median()) if len(c) else None


def chance_label(rows: pd.DataFrame) -> str:
    """``"chance 0.25"``, or the range ``"chance 0.21–0.26"`` when rows differ by more than
    rounding, or ``"no chance level stored"``."""
    c = pd.to_numeric(_col(rows, "chance"), errors="coerce").dropna()
    if not len(c):
        return "no chance level stored"
    lo, hi = float(c.min()), float(c.max())
    if hi - lo <= 1e-6 * max(1.0, abs(hi)):
        return f"chance {num(lo)}"
    # a range: 3 significant digits of the larger end, the same decimals on both ends
    decimals = max(0, 2 - math.floor(math.log10(max(abs(lo), abs(hi))))) if max(abs(lo), abs(hi)) > 0 else 3
    return f"chance {lo:.{decimals}f}–{hi:.{decimals}f}"


def diverging_range(values, chance: float) -> tuple[float, float]:
    """A colour range centred on ``chance`` that holds every finite value:
    ``chance +- max |v - chance|`` (``+-0.5 * max(1, |chance|)`` when all equal chance)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    half = float(np.abs(v - chance).max()) if v.size else 0.0
    if half <= 1e-6 * max(1.0, abs(chance)):
        half = 0.5 * max(1.0, abs(chance))
    return chance - half, chance + half


def heat_range(rows: pd.DataFrame) -> tuple[float | None, float | None]:
    """One colour range for heatmaps that share a scale (Compare's A and B): centred on the
    rows' chance level when they have one (``diverging_range``), else their min and max."""
    values = pd.to_numeric(rows["value"], errors="coerce").dropna()
    if not len(values):
        return None, None
    chance = chance_of(rows)
    if chance is None:
        return float(values.min()), float(values.max())
    return diverging_range(values, chance)


def _layout(fig: go.Figure, *, title: str | None = None, x_title: str = "", y_title: str = "",
            log_x: bool = False, log_y: bool = False, height: int = 460) -> go.Figure:
    fig.update_layout(title=title, height=height, margin=dict(l=60, r=20, t=50 if title else 20, b=50),
                      hovermode="closest", legend=dict(orientation="h", y=-0.18),
                      template="plotly_white")
    # set the type only for log: forcing "linear" would break categorical axes (heatmap labels)
    fig.update_xaxes(title=x_title, **({"type": "log"} if log_x else {}))
    fig.update_yaxes(title=y_title, **({"type": "log"} if log_y else {}))
    return fig


def empty_figure(message: str, height: int = 300) -> go.Figure:
    """A blank figure that says why it is blank."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=14, color="#666"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, height=height)


def curves_figure(raw: pd.DataFrame, labels: dict[int, str], *, smoothed: pd.DataFrame | None = None,
                  x: str = "step", metric: str = "", log_x: bool = False, log_y: bool = False) -> go.Figure:
    """One line per run (``run_id, x, value, step``); with ``smoothed``, raw points faint behind it."""
    fig = go.Figure()
    for i, (rid, g) in enumerate(raw.groupby("run_id", sort=True)):
        color = run_color(i)
        name = labels.get(int(rid), f"run {rid}")
        fig.add_trace(go.Scattergl(
            x=g["x"], y=g["value"], mode="lines", name=name, legendgroup=str(rid),
            line=dict(color=_rgba(color, 0.25) if smoothed is not None else color, width=1),
            showlegend=smoothed is None, customdata=g["step"],
            hovertemplate=f"{name}<br>step %{{customdata}}<br>x %{{x}}<br>{metric} %{{y:.4g}}<extra></extra>"))
        if smoothed is not None:
            s = smoothed[smoothed["run_id"] == rid]
            fig.add_trace(go.Scattergl(
                x=s["x"], y=s["value"], mode="lines", name=name, legendgroup=str(rid),
                line=dict(color=color, width=2), customdata=s["step"],
                hovertemplate=f"{name} (smoothed)<br>step %{{customdata}}<br>{metric} %{{y:.4g}}<extra></extra>"))
    return _layout(fig, x_title=X_TITLES.get(x, x), y_title=metric, log_x=log_x, log_y=log_y)


def band_figure(band: pd.DataFrame, *, x: str = "step", metric: str = "", log_x: bool = False,
                log_y: bool = False) -> go.Figure:
    """Mean line and min-max band per group (``group, x, mean, lo, hi, n_runs``)."""
    fig = go.Figure()
    for i, (group, g) in enumerate(band.groupby("group", sort=True)):
        color = variant_color(group, i)
        g = g.sort_values("x")
        fig.add_trace(go.Scatter(x=g["x"], y=g["hi"], mode="lines", line=dict(width=0),
                                 legendgroup=str(group), showlegend=False, hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=g["x"], y=g["lo"], mode="lines", line=dict(width=0), fill="tonexty",
                                 fillcolor=_rgba(color, 0.2), legendgroup=str(group), showlegend=False,
                                 hoverinfo="skip"))
        n = int(g["n_runs"].max())
        fig.add_trace(go.Scatter(
            x=g["x"], y=g["mean"], mode="lines", name=f"{group} (n={n})", legendgroup=str(group),
            line=dict(color=color, width=2), customdata=np.stack([g["lo"], g["hi"], g["n_runs"]], axis=-1),
            hovertemplate=(f"{group}<br>x %{{x}}<br>mean %{{y:.4g}}<br>min %{{customdata[0]:.4g}} "
                           "max %{customdata[1]:.4g}<br>runs %{customdata[2]}<extra></extra>")))
    return _layout(fig, x_title=X_TITLES.get(x, x), y_title=f"{metric} (mean, min-max band)",
                   log_x=log_x, log_y=log_y)


def final_scatter(frame: pd.DataFrame, *, hparam: str, value: str = "final", metric: str = "",
                  log_x: bool = False) -> go.Figure:
    """Final metric against a hyperparameter, coloured by variant (``name, variant, <hparam>, <value>``)."""
    fig = go.Figure()
    data = frame.dropna(subset=[hparam, value])
    for i, (variant, g) in enumerate(data.groupby("variant", sort=True)):
        g = g.sort_values(hparam)
        fig.add_trace(go.Scatter(
            x=g[hparam], y=g[value], mode="markers", name=str(variant),
            marker=dict(color=variant_color(variant, i), size=10, line=dict(width=1, color="white")),
            text=g["name"], hovertemplate=f"%{{text}}<br>{hparam} %{{x:.4g}}<br>{metric} %{{y:.4g}}<extra></extra>"))
    return _layout(fig, x_title=hparam, y_title=f"{value} {metric}", log_x=log_x)


def parallel_figure(frame: pd.DataFrame, dims: list[str], *, color: str = "final", metric: str = "") -> go.Figure:
    """Parallel coordinates over hyperparameters and the final metric, coloured by it."""
    data = frame.dropna(subset=[color])
    dimensions = []
    for d in dims:
        col = data[d]
        if not pd.api.types.is_numeric_dtype(col):
            cats = sorted(col.astype(str).unique())
            codes = col.astype(str).map({c: i for i, c in enumerate(cats)})
            dimensions.append(dict(label=d, values=codes, tickvals=list(range(len(cats))), ticktext=cats))
        else:
            dimensions.append(dict(label=d, values=col.astype(float)))
    dimensions.append(dict(label=f"{color} {metric}", values=data[color]))
    fig = go.Figure(go.Parcoords(line=dict(color=data[color], colorscale="Viridis_r", showscale=True),
                                 dimensions=dimensions))
    return _layout(fig, height=420)


def param_split_figure(row: dict) -> go.Figure:
    """Where a checkpoint's parameters are: W_Q, W_K, W_V, W_O (from the geometry), the
    rest of attention (biases) and the rest of the model, as a donut.

    Per layer: W_Q n_heads*d_model*d_head (0 for ``wq_identity``, and for ``q_eq_k`` /
    ``q_eq_k_eq_v`` where it is W_K), W_K n_kv_heads*d_model*d_head, W_V the same (0 when
    tied to W_K), W_O n_heads*d_head*d_model.
    """
    L, H, G = int(row["n_layers"]), int(row["n_heads"]), int(row["n_kv_heads"])
    dm, dh, variant = int(row["d_model"]), int(row["d_head"]), str(row["variant"])
    parts = {
        "W_Q": 0 if variant in ("wq_identity", "q_eq_k", "q_eq_k_eq_v") else L * H * dm * dh,
        "W_K": L * G * dm * dh,
        "W_V": 0 if variant in ("k_eq_v", "q_eq_k_eq_v") else L * G * dm * dh,
        "W_O": L * H * dh * dm,
    }
    attention = int(row.get("params_attention") or 0)
    total = int(row.get("params_total") or 0)
    parts["attention biases"] = max(attention - sum(parts.values()), 0)
    parts["rest of the model"] = max(total - attention, 0)
    names = list(parts)
    fig = go.Figure(go.Pie(
        labels=names, values=[parts[n] for n in names], hole=0.5, sort=False,
        marker=dict(colors=[_CYCLE[i % len(_CYCLE)] for i in range(len(names))]),
        texttemplate="%{percent:.1%}", hovertemplate="%{label}: %{value:,} (%{percent})<extra></extra>"))
    _layout(fig, title="Parameter split", height=300)
    fig.update_layout(legend=dict(orientation="v", x=1.02, y=0.5))
    return fig


def _grid(data: pd.DataFrame, column: str, index, columns) -> np.ndarray:
    """``column`` of (layer, head) rows as a ``[n_layers, n_heads]`` object array (None: no row)."""
    g = data.drop_duplicates(["layer", "head"]).set_index(["layer", "head"])[column]
    g = g.unstack("head").reindex(index=index, columns=columns)
    return g.astype(object).where(g.notna(), None).to_numpy()


def heatmap_figure(results: pd.DataFrame, metric: str, *, help_text: str = "",
                   zmin: float | None = None, zmax: float | None = None,
                   colorscale: str | None = None, muted: str | None = None) -> go.Figure:
    """Layer x head heatmap of one metric (``layer, head, value`` and, where stored, ``chance,
    n_tokens, ci_low, ci_high``; rows with head NULL skipped).

    With a chance level the scale diverges from it (``DIVERGING``: white at chance, ``zmid``;
    the range symmetric around it unless ``zmin``/``zmax`` are given) and the colour bar says
    ``chance 0.25``; without one it is sequential (Viridis). Each cell's tooltip gives its value,
    its own chance and, for activation metrics, its tokens and 95% interval. ``muted``: why the
    values rest on too few tokens (``"512 tokens < 8 x d_head = 1024"``): the cells are faded and
    the title says why.
    """
    data = results[(results["metric"] == metric) & results["head"].notna() & results["layer"].notna()]
    if data.empty:
        return empty_figure(f"{metric}: no per-head values stored")
    data = data.assign(layer=data["layer"].astype(int), head=data["head"].astype(int))
    layers, heads = sorted(data["layer"].unique()), sorted(data["head"].unique())
    z = _grid(data, "value", layers, heads).astype(float)  # (n_layers, n_heads)
    text = [[("" if math.isnan(v) else f"{v:.3g}") for v in row] for row in z]
    hover = data.assign(hover=[
        f"L{l}H{h}<br>{metric} " + value_text(v, c, n, lo, hi)
        for l, h, v, c, n, lo, hi in zip(data["layer"], data["head"], data["value"], _col(data, "chance"),
                                         _col(data, "n_tokens"), _col(data, "ci_low"), _col(data, "ci_high"))])
    custom = _grid(hover, "hover", layers, heads)
    custom = [[("" if c is None else c) for c in row] for row in custom]
    chance = chance_of(data)
    if chance is not None:
        if zmin is None and zmax is None:
            zmin, zmax = diverging_range(z, chance)
        scale, zmid = colorscale or DIVERGING, chance
    else:
        if zmin is None and zmax is None and (steady := _noise_range(z)) is not None:
            zmin, zmax = steady                 # one colour for values equal up to noise
        scale, zmid = colorscale or "Viridis", None
    fig = go.Figure(go.Heatmap(
        z=_nested(z), x=[f"H{h}" for h in heads], y=[f"L{l}" for l in layers],
        colorscale=scale, zmin=zmin, zmax=zmax, zmid=zmid, text=text, customdata=custom,
        texttemplate="%{text}" if z.size <= 400 else None, opacity=0.35 if muted else None,
        hovertemplate="%{customdata}<extra></extra>",
        colorbar=dict(title=dict(text=f"{metric}<br>{chance_label(data)}"))))
    fig.update_yaxes(autorange="reversed")
    height = max(260, min(900, 40 * z.shape[0] + 120))
    title = f"Faded: too few tokens ({muted})" if muted else (help_text or None)
    fig = _layout(fig, title=title, x_title="head", y_title="layer", height=height)
    if muted:
        fig.update_layout(title_font=dict(size=13, color="#777"))
    return fig


def _chance_trace(x, chance, *, name: str, color: str = "#555", legendgroup: str | None = None) -> go.Scatter:
    """A dashed line at the chance level (one value per x), labelled in the legend."""
    return go.Scatter(x=list(x), y=list(chance), mode="lines", name=name, legendgroup=legendgroup,
                      line=dict(color=color, dash="dash", width=1.5),
                      hovertemplate=f"{name}<br>%{{y:.4g}}<extra></extra>")


def _constant(values) -> float | None:
    """The one value of ``values`` when all finite ones agree up to rounding, else None."""
    v = pd.to_numeric(pd.Series(values), errors="coerce").dropna()
    if not len(v) or float(v.max() - v.min()) > 1e-6 * max(1.0, abs(float(v.max()))):
        return None
    return float(v.median())


def layer_figure(results: pd.DataFrame, metric: str) -> go.Figure:
    """Per-layer values (head NULL) of one metric as a line over layers, with the chance level
    as a dashed line and, for activation metrics, the 95% interval as error bars."""
    data = results[(results["metric"] == metric) & results["head"].isna() & results["layer"].notna()]
    data = data.sort_values("layer")
    lo, hi = _col(data, "ci_low").astype(float), _col(data, "ci_high").astype(float)
    error = None
    if (lo.notna() & hi.notna()).any():
        error = dict(type="data", symmetric=False, array=(hi - data["value"]).clip(lower=0).tolist(),
                     arrayminus=(data["value"] - lo).clip(lower=0).tolist(), thickness=1)
    hover = [f"layer {int(l)}<br>{metric} " + value_text(v, c, n, a, b)
             for l, v, c, n, a, b in zip(data["layer"], data["value"], _col(data, "chance"),
                                         _col(data, "n_tokens"), lo, hi)]
    fig = go.Figure(go.Scatter(x=data["layer"], y=data["value"], mode="lines+markers", name=metric,
                               error_y=error, customdata=hover, hovertemplate="%{customdata}<extra></extra>"))
    chance = pd.to_numeric(_col(data, "chance"), errors="coerce")
    if chance.notna().any():
        fig.add_trace(_chance_trace(data["layer"], chance, name=chance_label(data)))
    fig = _layout(fig, x_title="layer", y_title=metric, height=320)
    fig.update_xaxes(dtick=1)                   # layers are integers
    return fig


def spectra_figure(spectra: pd.DataFrame, *, log_y: bool = True) -> go.Figure:
    """Singular values by index, one line per projection (``projection, index, sigma``)."""
    fig = go.Figure()
    for i, (proj, g) in enumerate(spectra.groupby("projection", sort=False)):
        fig.add_trace(go.Scatter(x=g["index"], y=g["sigma"], mode="lines+markers", name=str(proj),
                                 line=dict(color=run_color(i)),
                                 hovertemplate=f"{proj}<br>i=%{{x}}<br>sigma %{{y:.4g}}<extra></extra>"))
    return _layout(fig, x_title="singular value index", y_title="sigma", log_y=log_y, height=360)


def attention_figure(weights: np.ndarray, tokens: list[str], *, title: str = "") -> go.Figure:
    """One head's attention pattern (query rows x key columns, ``[T, T]``)."""
    labels = [f"{i}:{t}" for i, t in enumerate(tokens)]
    fig = go.Figure(go.Heatmap(z=_nested(weights), x=labels, y=labels, colorscale="Blues", zmin=0, zmax=1,
                               hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.3f}<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, title=title or None, x_title="key", y_title="query", height=480)


def diff_heatmap(diff: pd.DataFrame, metric: str, *, a_label: str = "A", b_label: str = "B") -> go.Figure:
    """Layer x head heatmap of ``b - a`` for one metric (``curves.head_difference``: ``metric, layer,
    head, a, b, diff`` and, where stored, ``chance_a, chance_b, ...``); the tooltip gives both values
    with their chance levels and intervals."""
    data = diff[(diff["metric"] == metric) & diff["head"].notna() & diff["layer"].notna()]
    if data.empty:
        return empty_figure(f"{metric}: no per-head values in both checkpoints")
    data = data.assign(layer=data["layer"].astype(int), head=data["head"].astype(int))
    layers, heads = sorted(data["layer"].unique()), sorted(data["head"].unique())
    z = _grid(data, "diff", layers, heads).astype(float)  # (n_layers, n_heads)

    def side(row, s: str, label: str) -> str:
        return f"{label} " + value_text(row[s], row.get(f"chance_{s}"), row.get(f"n_tokens_{s}"),
                                        row.get(f"ci_low_{s}"), row.get(f"ci_high_{s}"))

    hover = data.assign(hover=[
        f"L{r['layer']}H{r['head']}<br>{b_label} - {a_label} = "
        f"{format(r['diff'], '+.4g') if _finite(r['diff']) else 'undefined'}<br>"
        f"{side(r, 'a', a_label)}<br>{side(r, 'b', b_label)}" for r in data.to_dict("records")])
    custom = [[("" if c is None else c) for c in row] for row in _grid(hover, "hover", layers, heads)]
    lim = float(np.nanmax(np.abs(z))) if np.isfinite(z).any() else 1.0
    fig = go.Figure(go.Heatmap(
        z=_nested(z), x=[f"H{h}" for h in heads], y=[f"L{l}" for l in layers],
        colorscale=DIVERGING, zmin=-lim, zmax=lim, zmid=0.0, colorbar=dict(title=dict(text=f"{b_label} - {a_label}")),
        customdata=custom, hovertemplate="%{customdata}<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, x_title="head", y_title="layer", height=max(260, min(900, 40 * z.shape[0] + 120)))


def trajectory_figure(traj: pd.DataFrame, metric: str, *, by: str = "layer") -> go.Figure:
    """A metric against training step, one line per layer (``step, layer, value``) or one line.

    Where the rows carry ``chance``, the chance level is a dashed line (one grey line when every
    layer shares it, else one per layer in its colour); ``ci_low, ci_high`` (activation metrics)
    draw a band behind each line. Tooltips: ``"0.31 (chance 0.25)"`` and the tokens and interval.
    """
    data = traj[traj["metric"] == metric].sort_values("step")
    fig = go.Figure()
    groups = (list(data.groupby("layer", sort=True, dropna=False)) if by == "layer" and "layer" in data.columns
              else [(None, data)])
    chance_all = pd.to_numeric(_col(data, "chance"), errors="coerce")
    shared = _constant(chance_all)
    for i, (layer, g) in enumerate(groups):
        name = metric if by != "layer" else ("model" if pd.isna(layer) else f"L{int(layer)}")
        color = run_color(i)
        lo, hi = _col(g, "ci_low").astype(float), _col(g, "ci_high").astype(float)
        if (lo.notna() & hi.notna()).any():
            fig.add_trace(go.Scatter(x=g["step"], y=hi, mode="lines", line=dict(width=0), legendgroup=name,
                                     showlegend=False, hoverinfo="skip"))
            fig.add_trace(go.Scatter(x=g["step"], y=lo, mode="lines", line=dict(width=0), fill="tonexty",
                                     fillcolor=_rgba(color, 0.15), legendgroup=name, showlegend=False,
                                     name=f"{name} 95% CI", hoverinfo="skip"))
        hover = [f"{name}<br>step {int(s)}<br>{metric} " + value_text(v, c, n, a, b)
                 for s, v, c, n, a, b in zip(g["step"], g["value"], _col(g, "chance"), _col(g, "n_tokens"), lo, hi)]
        fig.add_trace(go.Scatter(x=g["step"], y=g["value"], mode="lines+markers", name=name, legendgroup=name,
                                 line=dict(color=color), customdata=hover,
                                 hovertemplate="%{customdata}<extra></extra>"))
        chance = pd.to_numeric(_col(g, "chance"), errors="coerce")
        if shared is None and chance.notna().any():
            fig.add_trace(_chance_trace(g["step"], chance, name=f"{name} chance", color=color,
                                        legendgroup=name))
    if shared is not None:
        steps = data["step"].dropna()
        fig.add_trace(_chance_trace([steps.min(), steps.max()], [shared, shared], name=f"chance {num(shared)}"))
    fig = _layout(fig, x_title="step", y_title=f"{metric} (mean over heads)", height=380)
    if (steady := _noise_range(pd.concat([data["value"], chance_all]))) is not None:
        fig.update_yaxes(range=list(steady))    # flat lines, not rounding error blown up to full height
    return fig


def _wd_axis(wds) -> tuple[dict, float | None]:
    """Where weight decay 0 goes on a log axis (half a decade left of the smallest positive wd,
    labelled "0") and the tick settings that label every weight decay present."""
    wds = sorted({float(w) for w in wds if pd.notna(w)})
    positive = [w for w in wds if w > 0]
    zero_at = (min(positive) / 10 ** 0.5 if positive else 1e-3) if 0.0 in wds else None
    ticks = ([zero_at] if zero_at is not None else []) + positive
    text = (["0"] if zero_at is not None else []) + [f"{w:g}" for w in positive]
    return dict(tickmode="array", tickvals=ticks, ticktext=text), zero_at


def _wd_x(wd: pd.Series, zero_at: float | None) -> pd.Series:
    return wd.where(wd > 0, zero_at if zero_at is not None else np.nan)


def wd_figure(points: pd.DataFrame, *, y: str = "final_val_loss", y_title: str = "final val/loss") -> go.Figure:
    """Loss against weight decay per variant, log x; diverged runs as crosses, spiky ones ringed.

    ``points``: ``variant, group, weight_decay, <y>, diverged, spikes, run_id``. Weight decay 0
    is drawn half a decade left of the smallest positive value, on a tick labelled "0".
    """
    fig = go.Figure()
    ticks, zero_at = _wd_axis(points["weight_decay"])
    data = points[points["weight_decay"] >= 0].assign(x=lambda d: _wd_x(d["weight_decay"], zero_at))
    for i, ((variant, group), g) in enumerate(data.groupby(["variant", "group"], sort=True)):
        color = variant_color(variant, i)
        g = g.sort_values("weight_decay")
        name = str(variant) if group == "all" else f"{variant} [{group}]"
        ok = g[~g["diverged"]]
        mean = ok.groupby("x", as_index=False)[y].mean()
        fig.add_trace(go.Scatter(x=mean["x"], y=mean[y], mode="lines", name=name,
                                 legendgroup=name, line=dict(color=color, width=2), hoverinfo="skip"))
        marker_line = np.where(g["spikes"] > 0, 3, 1)
        fig.add_trace(go.Scatter(
            x=g["x"], y=g[y], mode="markers", legendgroup=name, showlegend=False,
            marker=dict(color=color, size=11, symbol=np.where(g["diverged"], "x", "circle"),
                        line=dict(width=marker_line, color=np.where(g["spikes"] > 0, "black", "white"))),
            customdata=np.stack([g["run_id"], g["spikes"], g["diverged"].astype(int), g["weight_decay"]], axis=-1),
            hovertemplate=(f"{name}<br>wd %{{customdata[3]:.4g}}<br>{y_title} %{{y:.4g}}<br>run %{{customdata[0]}}"
                           "<br>spikes %{customdata[1]}<br>diverged %{customdata[2]}<extra></extra>")))
    _layout(fig, x_title="weight decay (log)", y_title=y_title, log_x=True)
    fig.update_xaxes(**ticks)
    return fig


def norms_figure(norms: pd.DataFrame) -> go.Figure:
    """Projection norms against weight decay (``variant, weight_decay, metric, value``), log x.

    One marker per run, a line through the mean at each weight decay.
    """
    fig = go.Figure()
    ticks, zero_at = _wd_axis(norms["weight_decay"])
    data = norms[norms["weight_decay"] >= 0].assign(x=lambda d: _wd_x(d["weight_decay"], zero_at))
    for i, ((variant, metric), g) in enumerate(data.groupby(["variant", "metric"], sort=True)):
        name = f"{variant} {metric}"
        mean = g.groupby("x", as_index=False)["value"].mean()
        fig.add_trace(go.Scatter(x=mean["x"], y=mean["value"], mode="lines", name=name, legendgroup=name,
                                 line=dict(color=run_color(i)), hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=g["x"], y=g["value"], mode="markers", legendgroup=name, showlegend=False,
                                 marker=dict(color=run_color(i), size=8), customdata=g["weight_decay"],
                                 hovertemplate=f"{name}<br>wd %{{customdata:.4g}}<br>norm %{{y:.4g}}<extra></extra>"))
    _layout(fig, x_title="weight decay (log)", y_title="Frobenius norm (root-sum-square over layers)",
            log_x=True, height=380)
    fig.update_xaxes(**ticks)
    return fig
