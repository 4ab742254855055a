"""Plotly figure builders shared by the dashboard pages: a DataFrame in, a figure out.

Pure functions, no streamlit, no I/O. Every figure gets the same look
(``_layout``) and variants keep one colour across pages (``variant_color``).
Curves are SVG ``Scatter`` lines: the queries cap them at 2,000 points per run, and
SVG draws 20 such runs in 0.17 s in headless Chromium where WebGL (``Scattergl``, no GPU
there) took 1.70 s and blocked the rest of the page (``bench/dashboard_speed.py``).
"""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from analysis import variants as V
from analysis.intervals import mean_interval
from analysis.results_table import own_condition, variant_label
from app import plain
from loaders.run_table import with_facts

#: One colour per attention variant, the same on every page (``analysis.variants.COLORS``).
VARIANT_COLORS = V.COLORS
_CYCLE = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D",
          "#EECA3B", "#BAB0AC"]

X_TITLES = {"step": "step", "tokens": "tokens seen", "wall_time": "wall time since start (s)"}

#: Axis and column titles in words, for run columns that figures put on an axis.
AXIS_TITLES = {
    "weight_decay": "weight decay", "lr": "learning rate", "seed": "seed",
    "model_size": "model size (parameters)", "n_kv_heads": "KV heads", "n_heads": "query heads",
    "variant": "variant", "sharing": "head sharing", "task": "task", "final": "final", "best": "best",
    "step": "step", "tokens": "tokens seen", "wall_time": "wall time since start (s)",
}

# -- one palette and one legend for variant x head sharing, on every page -----------
#: Head sharing is drawn by line dash and marker symbol; the hue is the variant's.
SHARING_DASH = {"MHA": "solid", "GQA": "dash", "MQA": "dot", "?": "solid"}
#: The ring around a run's marker on the Weight decay chart, by a 0/1 colour value: 0 white
#: (a quiet run), 1 black (a spiky one).
RING_SCALE = [[0.0, "white"], [1.0, "black"]]
SHARING_SYMBOL = {"MHA": "circle", "GQA": "diamond", "MQA": "square", "?": "circle"}
#: Colours of runs whose variant is not known, one per run in id order: a second palette
#: (ColorBrewer Dark2 and Set1, colour-blind-aware), apart from the variants' Tableau hues, so
#: that such runs are told apart and never read as a known variant.
UNKNOWN_COLORS = ["#1B9E77", "#D95F02", "#7570B3", "#E7298A", "#66A61E", "#E6AB02", "#A6761D", "#377EB8",
                  "#984EA3", "#A65628", "#F781BF", "#4DAF4A"]
#: Marker variants by task in a figure of several tasks, language first: the sharing's symbol
#: filled, open, with a dot, open with a dot (plotly symbol suffixes).
TASK_SYMBOL_SUFFIX = ["", "-open", "-dot", "-open-dot"]
#: Tasks drawn without a suffix in the legend (a run config without a task is a language run).
DEFAULT_TASK = "language"
#: Shade of a variant's hue for a task other than language, in a figure of several tasks.
TASK_SHADE = -0.35


def axis_title(column: str) -> str:
    """A column name in words (``"weight_decay"`` -> ``"weight decay"``); unknown names unchanged."""
    return AXIS_TITLES.get(str(column), str(column).replace("_", " "))


def variant_color(variant: str | None, i: int = 0) -> str:
    """The variant's colour (``analysis.variants.COLORS``); an unknown name gets colour ``i`` of a cycle."""
    return VARIANT_COLORS.get(str(variant), _CYCLE[i % len(_CYCLE)])


def run_color(i: int) -> str:
    return _CYCLE[i % len(_CYCLE)]


#: Legend order of head-sharing kinds.
SHARING_RANK = {"MHA": 0, "GQA": 1, "MQA": 2, "?": 3}


def sharing_kind(sharing: str | None) -> str:
    """``"GQA-2"`` -> ``"GQA"``; ``"MHA"``, ``"MQA"`` unchanged; anything else ``"?"``."""
    s = str(sharing or "?")
    return "GQA" if s.startswith("GQA") else (s if s in ("MHA", "MQA") else "?")


def sharing_of(n_heads, n_kv_heads) -> str:
    """``analysis.variants.sharing`` for values that may be NaN/None (read from a frame)."""
    def as_int(v):
        return int(v) if v is not None and not (isinstance(v, float) and math.isnan(v)) and v is not pd.NA else None
    return V.sharing(as_int(n_heads), as_int(n_kv_heads))


def legend_label(variant: str | None, sharing: str | None = None, task: str | None = None,
                 condition: str | None = None, *, name_task: bool = False) -> str:
    """The one legend name of a variant x head sharing group: ``"Q-K=V · MQA"``; a task other
    than language is added (``"Q-K=V · MQA · vision"``), language too with ``name_task`` (a
    figure holding runs of several tasks names each); an unknown sharing is left out. A paper
    condition of its own names the group instead of its stored variant
    (``analysis.results_table.variant_label``: ``"QVV(3) · MHA"``)."""
    parts = [variant_label(variant, condition)]
    if sharing and sharing != "?":
        parts.append(str(sharing))
    if task and (name_task or str(task) != DEFAULT_TASK):
        parts.append(str(task))
    return " · ".join(parts)


def several_tasks(tasks) -> bool:
    """Whether ``tasks`` (a column of task names; None or NaN: language) holds more than one task."""
    return len({str(t) if isinstance(t, str) and t else DEFAULT_TASK for t in tasks}) > 1


def shade(hex_color: str, amount: float) -> str:
    """``hex_color`` mixed with white (``amount`` > 0) or black (< 0) by ``|amount|``."""
    h = hex_color.lstrip("#")
    rgb = [int(h[i:i + 2], 16) for i in (0, 2, 4)]
    target = 255 if amount > 0 else 0
    a = min(abs(amount), 1.0)
    return "#" + "".join(f"{round(c + (target - c) * a):02X}" for c in rgb)


#: Shades of one hue for several runs of one group (light and dark in turn, base first).
_RUN_SHADES = [0.0, 0.35, -0.3, 0.6, -0.5, 0.2, -0.15, 0.5]


def group_style(variant: str | None, sharing: str | None = None, i: int = 0) -> dict:
    """Colour (the variant's), dash and marker symbol (the head sharing's) of one group."""
    kind = sharing_kind(sharing)
    return {"color": variant_color(variant, i), "dash": SHARING_DASH[kind], "symbol": SHARING_SYMBOL[kind]}


def _val(row, key):
    v = row.get(key) if hasattr(row, "get") else None
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


def _values(frame: pd.DataFrame, column: str) -> list:
    """``frame[column]`` as Python values, None where missing (NaN, NA) or where the frame has no
    such column: what ``_val`` reads from one row, for all rows at once."""
    if column not in frame.columns:
        return [None] * len(frame)
    return [None if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else v
            for v in frame[column].tolist()]


def legend_keys(frame: pd.DataFrame) -> list[tuple]:
    """Per row of ``frame`` (``variant`` and where present ``n_heads, n_kv_heads, task,
    condition``): ``(variant, sharing, task, condition)`` as ``legend_label`` and ``group_style``
    take them (sharing by ``sharing_of``, a missing task ``DEFAULT_TASK``). One look-up per
    distinct head count pair, not per row: a run table has thousands of rows and a few groups."""
    variants = frame["variant"].tolist() if "variant" in frame.columns else [None] * len(frame)
    pairs = list(zip(_values(frame, "n_heads"), _values(frame, "n_kv_heads")))
    sharing = {pair: sharing_of(*pair) for pair in set(pairs)}
    tasks = [t or DEFAULT_TASK for t in _values(frame, "task")]
    return list(zip(variants, [sharing[p] for p in pairs], tasks, _values(frame, "condition")))


def comparable_suffixes(frame: pd.DataFrame) -> list[str]:
    """Per row, what its legend group adds so that a group never spans projects or geometries
    (``analysis.comparable``): ``" · <project>"`` where the rows hold several projects, and
    ``" · d<d_model> L<n_layers>"`` where they hold several geometries; ``""`` otherwise."""
    parts = [[] for _ in range(len(frame))]
    if "project" in frame.columns and len({str(p) for p in frame["project"]}) > 1:
        for row, p in zip(parts, frame["project"]):
            row.append(str(p))
    geo = [c for c in ("d_model", "n_layers") if c in frame.columns]
    if geo:
        shapes = [f"d{tick_text(v) if v is not None else '?'} L{tick_text(w) if w is not None else '?'}"
                  for v, w in zip(_values(frame, "d_model") if "d_model" in geo else [None] * len(frame),
                                  _values(frame, "n_layers") if "n_layers" in geo else [None] * len(frame))]
        if len(set(shapes)) > 1:
            for row, s in zip(parts, shapes):
                row.append(s)
    return ["".join(f" · {p}" for p in row) for row in parts]


def run_styles(runs: pd.DataFrame) -> dict[int, dict]:
    """Per run id (``id`` or ``run_id`` column; ``variant`` and where present ``n_heads``,
    ``n_kv_heads``, ``task``, ``condition``): ``color, dash, symbol, group`` (``legend_label``,
    naming every run's task when ``runs`` holds several, and its project and geometry when
    they differ: ``comparable_suffixes``). Runs of one group share hue and dash
    and differ in shade, in run id order; runs of an unknown variant each take the next colour of
    ``UNKNOWN_COLORS``; in a figure of several tasks each task has its marker
    (``TASK_SYMBOL_SUFFIX``, language filled). Labels and styles are made once per group
    (``legend_keys``), so 2,000 runs cost what their groups cost."""
    id_col = "id" if "id" in runs.columns else "run_id"
    data = runs.sort_values(id_col)
    name_task = "task" in data.columns and several_tasks(data["task"])
    groups: dict[tuple, tuple[str, dict]] = {}
    shades: dict[tuple[str, float], str] = {}
    seen: dict[str, int] = {}
    out: dict[int, dict] = {}
    keys = [(*k, s) for k, s in zip(legend_keys(data), comparable_suffixes(data))]
    task_order = sorted({k[2] for k in keys}, key=lambda t: (t != DEFAULT_TASK, t))
    suffix = {t: TASK_SYMBOL_SUFFIX[i % len(TASK_SYMBOL_SUFFIX)] if name_task else "" for i, t in enumerate(task_order)}
    n_unknown = 0
    for rid, key in zip(data[id_col].tolist(), keys):
        if key not in groups:
            variant, sharing, task, condition, suffix_ = key
            style = group_style(variant, sharing)
            groups[key] = (legend_label(variant, sharing, task, condition, name_task=name_task) + suffix_,
                           {**style, "symbol": style["symbol"] + suffix[task]})
        group, style = groups[key]
        if str(key[0]) not in VARIANT_COLORS or str(key[0]) == V.UNKNOWN:
            out[int(rid)] = {**style, "color": UNKNOWN_COLORS[n_unknown % len(UNKNOWN_COLORS)], "group": group}
            n_unknown += 1
            continue
        k = seen.get(group, 0)
        seen[group] = k + 1
        amount = _RUN_SHADES[k % len(_RUN_SHADES)]
        color = shades.get((style["color"], amount)) or shades.setdefault((style["color"], amount),
                                                                         shade(style["color"], amount))
        out[int(rid)] = {**style, "color": color, "group": group}
    return out


def log_ticks(values, *, max_ticks: int = 12) -> dict:
    """Tick values and labels for a log axis over ``values`` that read as numbers ("0.3", not a
    bare "3" as plotly labels minor ticks): 1..9, 1-2-3-5 or 1-2-5 x 10^k (or only powers of ten
    over many decades) inside the data's range, labelled by ``tick_text``, with one at the lowest
    value (2 digits) where the nearest tick is more than 25% above it (the final losses of
    training curves sit there). ``{}`` when no value is positive."""
    v = np.asarray(pd.to_numeric(pd.Series(values), errors="coerce"), dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if not v.size:
        return {}
    lo, hi = math.floor(math.log10(v.min())), math.ceil(math.log10(v.max()))
    # the axis shows a little beyond the data (plotly pads a log range by about 5% each side)
    pad = 10 ** (0.05 * max(math.log10(v.max() / v.min()), 0.02))
    ticks: list[float] = []
    for mantissas in ((1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 3, 5), (1, 2, 5), (1, 3), (1,)):
        ticks = [float(f"{m * 10.0 ** e:.6g}") for e in range(lo, hi + 1) for m in mantissas]
        ticks = [t for t in ticks if v.min() / pad <= t <= v.max() * pad]
        if len(ticks) <= (8 if len(mantissas) == 9 else max_ticks):
            break
    if len(ticks) > max_ticks:                  # many decades: every k-th power of ten
        ticks = ticks[::math.ceil(len(ticks) / max_ticks)]
    if len(ticks) < 2:                          # a range inside one step: its ends, 2 digits
        ticks = sorted({float(f"{v.min():.2g}"), float(f"{v.max():.2g}")} | set(ticks))
    elif ticks[0] > 1.25 * v.min():             # no tick near the lowest values (final losses): add one
        ticks = sorted({float(f"{v.min():.2g}")} | set(ticks))
    return dict(tickmode="array", tickvals=ticks, ticktext=[tick_text(t) for t in ticks])


def tick_text(t: float) -> str:
    """A tick value as text: ``:g`` below 10,000 ("0.3", "2000"), SI above ("20k", "1M", "3G")."""
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e4, "k")):
        if abs(t) >= div:
            scale = 1e3 if unit == "k" else div
            return f"{t / scale:g}{unit}"
    return f"{t:g}"


def readable_log_axis(fig: go.Figure, values, axis: str = "y", **selector) -> go.Figure:
    """Give a figure's log axis readable ticks (``log_ticks`` of ``values``); other pages call
    this after ``plotly.express`` (``axis`` ``"x"`` or ``"y"``; ``selector`` as ``update_xaxes``)."""
    ticks = log_ticks(values)
    if ticks:
        (fig.update_xaxes if axis == "x" else fig.update_yaxes)(**ticks, **selector)
    return fig


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
#: Colour of a degenerate value (fixed by construction, ``analysis.degenerate``): off the scale.
GREY = "#c8c8c8"


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


def diverging_range(values, chance: float, band: tuple[float, float] | None = None) -> tuple[float, float]:
    """A colour range centred on ``chance`` that holds every finite value and the null band:
    ``chance +- max(max |v - chance|, the band's farther side from chance)``, so values inside
    the band (noise) stay pale however close together they are; ``+-0.5 * max(1, |chance|)``
    when all equal chance and there is no band."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    half = float(np.abs(v - chance).max()) if v.size else 0.0
    if band is not None and all(_finite(b) for b in band):
        half = max(half, chance - band[0], band[1] - chance)
    if half <= 1e-6 * max(1.0, abs(chance)):
        half = 0.5 * max(1.0, abs(chance))
    return chance - half, chance + half


def band_of(rows: pd.DataFrame) -> tuple[float, float] | None:
    """The null band a set of rows is read against: the medians of their ``chance_low`` and
    ``chance_high`` (as ``chance_of``); None when none is stored."""
    lo = pd.to_numeric(_col(rows, "chance_low"), errors="coerce").dropna()
    hi = pd.to_numeric(_col(rows, "chance_high"), errors="coerce").dropna()
    return (float(lo.median()), float(hi.median())) if len(lo) and len(hi) else None


def flags_of(rows: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """``(degenerate, above)`` of result rows as plain bools: a value fixed by construction, and
    one called above chance (``above_chance`` True; NA and False are not); False where the rows
    were stored without these columns."""
    def flag(name: str) -> pd.Series:
        if name not in rows.columns:
            return pd.Series(False, index=rows.index)
        return rows[name].astype("boolean").fillna(False).astype(bool)

    deg = flag("degenerate")
    return deg, flag("above_chance") & ~deg


def pair_heatmap(z: np.ndarray, above: np.ndarray, labels: list[str], hover: list[list[str]], rows: pd.DataFrame,
                 metric: str, *, text_up_to: int) -> go.Figure:
    """The square heatmap of a pair metric (``app.layer_maps``, ``app.head_maps``): ``z`` ``[n, n]``
    (NaN: no pair, e.g. the diagonal) centred on the rows' chance level where they have one
    (``diverging_range``, the null band at least), each value printed with ``*`` where ``above``
    (outside the null band) for ``n <= text_up_to``, ``hover`` the cells' tooltips."""
    text = [["" if math.isnan(v) else f"{v:.2f}" + ("*" if s else "") for v, s in zip(r, sr)]
            for r, sr in zip(z, above)]
    chance = chance_of(rows)
    if chance is not None:
        zmin, zmax = diverging_range(z, chance, band_of(rows))
        scale, zmid = DIVERGING, chance
    else:
        zmin = zmax = zmid = None
        scale = "Viridis"
    fig = go.Figure(go.Heatmap(
        z=[[None if math.isnan(v) else float(v) for v in r] for r in z], x=labels, y=labels, colorscale=scale,
        zmin=zmin, zmax=zmax, zmid=zmid, text=text, customdata=hover,
        texttemplate="%{text}" if len(labels) <= text_up_to else None, hoverongaps=False,
        hovertemplate="%{customdata}<extra></extra>",
        colorbar=dict(title=dict(text=f"{metric}<br>{chance_label(rows)}"))))
    fig.update_yaxes(autorange="reversed", scaleanchor="x", constrain="domain")
    fig.update_xaxes(constrain="domain")
    return fig


def heat_range(*sides: pd.DataFrame) -> tuple[float | None, float | None] | None:
    """One colour range for heatmaps that share a scale (Compare's A and B, one frame of rows
    each): centred on their chance level (``diverging_range``), or their min and max when none
    has one; ``(None, None)`` without values. None when the sides are read against different
    chance levels (two geometries: 0.109 for one, 0.323 for the other): one range cannot be
    white at both, and centred on one side's chance it paints the other side's chance-level
    values as far above or below it. Each heatmap then gets its own range, centred on its own
    chance (``heatmap_figure`` with no ``zmin``/``zmax``)."""
    chances = [chance_of(side) for side in sides]
    known = [c for c in chances if c is not None]
    if known and (len(known) < len(chances) or max(known) - min(known) > 1e-6 * max(1.0, *map(abs, known))):
        return None
    rows = pd.concat(sides)
    values = pd.to_numeric(rows["value"], errors="coerce").dropna()
    if not len(values):
        return None, None
    if chances[0] is None:
        return float(values.min()), float(values.max())
    return diverging_range(values, chances[0], band_of(rows))


#: Trace types this module draws, and what of plotly_white's layout its figures read.
TRACE_TYPES = ("scatter", "heatmap", "parcoords", "pie")
_UNREAD = ("colorscale", "geo", "mapbox", "polar", "scene", "ternary")


def _without(node, keys):
    """``node`` (a template's JSON) without any entry named in ``keys``, at any depth."""
    if isinstance(node, dict):
        return {k: _without(v, keys) for k, v in node.items() if k not in keys}
    if isinstance(node, list):
        return [_without(v, keys) for v in node]
    return node


def light_template() -> go.layout.Template:
    """plotly_white as this module's figures read it: its layout for 2-D axes and the defaults of
    ``TRACE_TYPES``, without its colour scales (every heatmap and parcoords here names its own)
    and its 3-D, polar, ternary and map settings. The whole template is 7 kB that plotly checks
    and copies in about 20 ms per figure, and Streamlit checks it once more before sending it;
    this one costs a quarter of that and draws the same figures."""
    white = pio.templates["plotly_white"].to_plotly_json()
    return go.layout.Template(layout=_without(white["layout"], _UNREAD),
                              data=_without({t: white["data"][t] for t in TRACE_TYPES}, _UNREAD))


#: Every figure's template (``_layout``).
LIGHT = light_template()
#: ``st.plotly_chart``'s ``theme`` for figures drawn with ``LIGHT``: none. With Streamlit's theme
#: the chart is mounted with the figure's own look, the theme is applied afterwards and plotly.js
#: draws every trace again (three draws a chart instead of two).
CHART_THEME = None


def _layout(fig: go.Figure, *, title: str | None = None, x_title: str = "", y_title: str = "",
            log_x: bool = False, log_y: bool = False, height: int = 460) -> go.Figure:
    fig.update_layout(title=None if title is None else plain.html(title), height=height,
                      margin=dict(l=60, r=20, t=50 if title else 20, b=50),
                      hovermode="closest", legend=dict(orientation="h", y=-0.18),
                      template=LIGHT)
    # set the type only for log: forcing "linear" would break categorical axes (heatmap labels)
    fig.update_xaxes(title=plain.html(x_title), **({"type": "log"} if log_x else {}))
    fig.update_yaxes(title=plain.html(y_title), **({"type": "log"} if log_y else {}))
    return fig


def empty_figure(message: str, height: int = 300) -> go.Figure:
    """A blank figure that says why it is blank."""
    fig = go.Figure()
    fig.add_annotation(text=plain.html(message), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=14, color="#666"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, height=height)


def curves_figure(raw: pd.DataFrame, labels: dict[int, str], *, smoothed: pd.DataFrame | None = None,
                  x: str = "step", metric: str = "", log_x: bool = False, log_y: bool = False,
                  styles: dict[int, dict] | None = None) -> go.Figure:
    """One line per run (``run_id, x, value, step``); with ``smoothed``, raw points faint behind it.

    ``styles`` (``run_styles``): each run in its variant's hue, its head sharing's dash, and a
    shade of its own; without it runs take the colours of a cycle.
    """
    fig = go.Figure()
    by_step = x == "step"

    def xy(g: pd.DataFrame) -> dict:
        """A trace's points: against the step, x is the step itself, sent as the integers it is
        (half the bytes of float64) and not again as the tooltip's step (``customdata``); against
        tokens or wall time, the step rides along for the tooltip. Numpy arrays, not Series: plotly
        reads a Series through narwhals, 3x slower per array."""
        if by_step:
            return dict(x=g["step"].to_numpy(), y=g["value"].to_numpy())
        return dict(x=g["x"].to_numpy(), y=g["value"].to_numpy(), customdata=g["step"].to_numpy())

    step = "%{x}" if by_step else "%{customdata}"
    where = "" if by_step else "<br>x %{x}"
    for i, (rid, g) in enumerate(raw.groupby("run_id", sort=True)):
        style = (styles or {}).get(int(rid), {"color": run_color(i), "dash": "solid"})
        color = style["color"]
        name = labels.get(int(rid), f"run {rid}")
        fig.add_trace(go.Scatter(
            **xy(g), mode="lines", name=name, legendgroup=str(rid),
            line=dict(color=_rgba(color, 0.25) if smoothed is not None else color, width=1,
                      dash=style["dash"] if smoothed is None else "solid"),
            showlegend=smoothed is None,
            hovertemplate=f"{plain.hover(name)}<br>step {step}{where}<br>{plain.hover(metric)} %{{y:.4g}}<extra></extra>"))
        if smoothed is not None:
            s = smoothed[smoothed["run_id"] == rid]
            fig.add_trace(go.Scatter(
                **xy(s), mode="lines", name=name, legendgroup=str(rid),
                line=dict(color=color, width=2, dash=style["dash"]),
                hovertemplate=f"{plain.hover(name)} (smoothed)<br>step {step}<br>{plain.hover(metric)} %{{y:.4g}}"
                              "<extra></extra>"))
    fig = _layout(fig, x_title=X_TITLES.get(x, x), y_title=metric, log_x=log_x, log_y=log_y)
    if log_y:
        readable_log_axis(fig, raw["value"], "y")
    return fig


def band_figure(band: pd.DataFrame, *, x: str = "step", metric: str = "", log_x: bool = False,
                log_y: bool = False, styles: dict[str, dict] | None = None) -> go.Figure:
    """Mean line and min-max band per group (``group, x, mean, lo, hi, n_runs``).

    ``styles`` maps a group to its ``group_style`` (colour of the variant, dash of the head
    sharing), in legend order; a group without one is read as a variant name.
    """
    fig = go.Figure()
    present = sorted(set(band["group"]), key=str)
    order = [g for g in (styles or {}) if g in set(present)] + [g for g in present if g not in (styles or {})]
    for i, group in enumerate(order):       # the order of ``styles`` (the page's row order), else by name
        g = band[band["group"] == group]
        style = (styles or {}).get(group) or group_style(group, None, i)
        color = style["color"]
        g = g.sort_values("x")
        fig.add_trace(go.Scatter(x=g["x"], y=g["hi"], mode="lines", line=dict(width=0),
                                 legendgroup=str(group), showlegend=False, hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=g["x"], y=g["lo"], mode="lines", line=dict(width=0), fill="tonexty",
                                 fillcolor=_rgba(color, 0.2), legendgroup=str(group), showlegend=False,
                                 hoverinfo="skip"))
        n = int(g["n_runs"].max())
        fig.add_trace(go.Scatter(
            x=g["x"], y=g["mean"], mode="lines", name=f"{group} (n={n})", legendgroup=str(group),
            line=dict(color=color, width=2, dash=style["dash"]),
            customdata=np.stack([g["lo"], g["hi"], g["n_runs"]], axis=-1),
            hovertemplate=(f"{plain.hover(group)}<br>x %{{x}}<br>mean %{{y:.4g}}<br>min %{{customdata[0]:.4g}} "
                           "max %{customdata[1]:.4g}<br>runs %{customdata[2]}<extra></extra>")))
    fig = _layout(fig, x_title=X_TITLES.get(x, x), y_title=f"{metric} (mean, min-max band)",
                  log_x=log_x, log_y=log_y)
    if log_y and len(band):
        readable_log_axis(fig, pd.concat([band["lo"], band["hi"]]), "y")
    return fig


def _final_groups(frame: pd.DataFrame, hparam: str) -> tuple[pd.DataFrame, dict[tuple, np.ndarray]]:
    """``frame``'s rows that have a ``hparam``, given ``_sharing`` and ``_group`` (``legend_keys``:
    one label per group, naming every task when the rows hold several), and per group
    ``(variant, sharing, group)`` the positions of its rows, in legend order: variants in their
    order, then MHA, GQA, MQA."""
    data = frame.dropna(subset=[hparam])
    keys = [(*k, s) for k, s in zip(legend_keys(data), comparable_suffixes(data))]
    name_task = several_tasks([k[2] for k in keys])
    labels = {k: legend_label(*k[:4], name_task=name_task) + k[4] for k in set(keys)}   # one per group, not per run
    data = data.assign(_sharing=[k[1] for k in keys], _group=[labels[k] for k in keys])
    order = {v: i for i, v in enumerate(V.ALL_VARIANTS)}
    groups = data.groupby(["variant", "_sharing", "_group"], dropna=False, sort=False).indices
    ranked = sorted(groups, key=lambda k: (order.get(k[0], 99), str(k[0]), SHARING_RANK[sharing_kind(k[1])],
                                           str(k[1]), str(k[2])))
    return data, {k: groups[k] for k in ranked}


def final_scatter(frame: pd.DataFrame, *, hparam: str, value: str = "final", metric: str = "",
                  log_x: bool = False) -> go.Figure:
    """Final metric against a hyperparameter, every run a marker, one trace per variant x head
    sharing group (``name, variant, <hparam>, <value>`` and where present ``n_heads, n_kv_heads,
    task, condition``): the variant's colour, the sharing's marker symbol, the legend
    ``"Q-K=V · MQA"`` (``"Q-K=V · MQA · language"`` when the runs are of several tasks).
    ``final_summary_figure`` draws the same groups as a mean and interval per x instead."""
    fig = go.Figure()
    data, groups = _final_groups(frame.dropna(subset=[value]), hparam)
    title = axis_title(hparam)
    for i, ((variant, sharing, group), rows) in enumerate(groups.items()):
        g = data.iloc[rows].sort_values(hparam)
        style = group_style(variant, sharing, i)
        fig.add_trace(go.Scatter(
            x=g[hparam].to_numpy(), y=g[value].to_numpy(), mode="markers", name=group,
            marker=dict(color=style["color"], symbol=style["symbol"], size=10, line=dict(width=1, color="white")),
            text=[plain.html(n) for n in g["name"]],
            hovertemplate=f"%{{text}}<br>{plain.hover(title)} %{{x:.4g}}<br>{plain.hover(metric)} %{{y:.4g}}<extra></extra>"))
    fig = _layout(fig, x_title=title, y_title=f"{value} {metric}", log_x=log_x)
    if log_x and hparam in data.columns:
        readable_log_axis(fig, data[hparam], "x")
    return fig


# -- the final metric summarised: a mean and its 95% interval per group and x -----------

#: Columns of ``final_summary``.
SUMMARY_COLUMNS = ["variant", "sharing", "group", "x", "n", "diverged", "mean", "lo", "hi", "minus", "plus",
                   "min", "max"]


def final_summary(frame: pd.DataFrame, *, hparam: str, value: str = "final") -> pd.DataFrame:
    """Per variant x head sharing group (``_final_groups``) and value of ``hparam``: the mean of
    the runs' ``value`` in float64 and its 95% t interval (``analysis.intervals.mean_interval``,
    ``n - 1`` degrees of freedom: the interval the Weight decay page gives each weight decay's mean).

    Returns ``SUMMARY_COLUMNS``, one row per group and x, groups in legend order and x ascending:
    ``n`` the runs in the mean, ``diverged`` the runs left out of it (a non-finite ``value``, or
    non-finite values logged: ``nonfinite`` > 0 where the frame has it), ``lo, hi`` the
    interval's ends (NaN for one run), ``minus, plus`` their distances below and above the mean
    (the error bar), ``min, max`` of the runs in the
    mean. A group and x whose runs all diverged has ``n`` 0 and NaN statistics.
    """
    data, groups = _final_groups(frame, hparam)
    if data.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    v = pd.to_numeric(data[value], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(v)
    if "nonfinite" in data.columns:
        bad |= pd.to_numeric(data["nonfinite"], errors="coerce").fillna(0).to_numpy() > 0
    parts = pd.DataFrame({"variant": data["variant"].to_numpy(), "sharing": data["_sharing"].to_numpy(),
                          "group": data["_group"].to_numpy(), "x": data[hparam].to_numpy(),
                          "v": np.where(bad, np.nan, v), "bad": bad})
    by = parts.groupby(["variant", "sharing", "group", "x"], dropna=False, sort=False)
    stats = by.agg(n=("v", "count"), diverged=("bad", "sum"), mean=("v", "mean"),
                   min=("v", "min"), max=("v", "max")).reset_index()
    # each group's values, in the order of stats' rows (sort=False: first appearance, ngroup's
    # numbering), split from one sorted array rather than a Series per group (pandas' per-group
    # objects were half the summary's time at 2,000 runs)
    codes = by.ngroup().to_numpy()                                    # [runs], each run's group
    order = np.argsort(codes, kind="stable")
    cuts = np.cumsum(np.bincount(codes, minlength=len(stats)))[:-1]
    values = np.split(parts["v"].to_numpy(dtype=float)[order], cuts)
    ends = [mean_interval(v[~np.isnan(v)]) for v in values]         # each its runs in the mean
    lo = np.array([np.nan if a is None else a for a, _ in ends], dtype=float)
    hi = np.array([np.nan if b is None else b for _, b in ends], dtype=float)
    mean = stats["mean"].to_numpy(dtype=float)
    stats = stats.assign(lo=lo, hi=hi, minus=mean - lo, plus=hi - mean,
                         diverged=stats["diverged"].astype(int), n=stats["n"].astype(int))
    rank = {k: i for i, k in enumerate(groups)}
    stats["_rank"] = [rank[k] for k in zip(stats["variant"], stats["sharing"], stats["group"])]
    return stats.sort_values(["_rank", "x"], kind="stable")[SUMMARY_COLUMNS].reset_index(drop=True)


def _x_text(x) -> str:
    return f"{x:.4g}" if isinstance(x, (int, float, np.number)) and not isinstance(x, bool) else str(x)


def summary_hover(row: dict, *, hparam: str, what: str) -> str:
    """One summary point's tooltip: group, x, the mean with its 95% interval (or the one run's
    value), n, the runs' min and max, and the diverged runs left out."""
    lines = [plain.html(row["group"]), plain.html(f"{axis_title(hparam)} {_x_text(row['x'])}")]
    n = int(row["n"])
    if n >= 2:
        lines += [f"mean {plain.html(what)} {num(row['mean'])}",
                  f"95% t interval {interval_text(row['lo'], row['hi'])}",
                  f"n = {n} runs, min {num(row['min'])}, max {num(row['max'])}"]
    else:
        lines += [f"{plain.html(what)} {num(row['mean'])}", "n = 1 (no interval)"]
    if row["diverged"]:
        lines.append(f"{int(row['diverged'])} diverged (not in the mean)")
    return "<br>".join(lines)


def final_summary_figure(frame: pd.DataFrame, *, hparam: str, value: str = "final", metric: str = "",
                         log_x: bool = False) -> go.Figure:
    """``final_summary`` drawn: per variant x head sharing group one trace (styled and named as
    ``final_scatter``'s, with its runs in the legend: ``"Q-K=V · MQA (n=40)"``), a marker at each
    value of ``hparam`` at the mean of its runs' ``value`` with its 95% t interval as an error bar
    (none for one run); n, min, max and the diverged runs in the tooltip. One marker per group
    and x, whatever the number of runs."""
    summary = final_summary(frame, hparam=hparam, value=value)
    fig = go.Figure()
    what = f"{value} {metric}".strip()
    drawn = summary["n"] > 0
    for i, ((variant, sharing, group), g) in enumerate(summary.groupby(["variant", "sharing", "group"],
                                                                        dropna=False, sort=False)):
        g = g[drawn.loc[g.index]]                # an x whose runs all diverged has no marker
        if g.empty:
            continue
        style = group_style(variant, sharing, i)   # i: the group's place in the legend, as final_scatter's
        plus = [None if not np.isfinite(h) else float(h) for h in g["plus"]]
        minus = [None if not np.isfinite(h) else float(h) for h in g["minus"]]
        fig.add_trace(go.Scatter(
            x=g["x"].tolist(), y=g["mean"].tolist(), mode="markers", name=f"{group} (n={int(g['n'].sum())})",
            marker=dict(color=style["color"], symbol=style["symbol"], size=10, line=dict(width=1, color="white")),
            error_y=dict(type="data", symmetric=False, array=plus, arrayminus=minus, visible=True,
                         color=style["color"], thickness=1.5, width=5),
            text=[summary_hover(r, hparam=hparam, what=what) for r in g.to_dict("records")],
            hovertemplate="%{text}<extra></extra>"))
    title = axis_title(hparam)
    fig = _layout(fig, x_title=title, y_title=f"{value} {metric} (mean, 95% interval)", log_x=log_x)
    if log_x and drawn.any():
        readable_log_axis(fig, summary.loc[drawn, "x"], "x")
    return fig


def parallel_figure(frame: pd.DataFrame, dims: list[str], *, color: str = "final", metric: str = "",
                    direction: str = "min") -> go.Figure:
    """Parallel coordinates over hyperparameters and the final metric, coloured by it (the best
    runs brightest: ``direction`` ``"min"`` for a loss, ``"max"`` for an accuracy).

    Axis names are in words (``axis_title``) with room above the axes so none is cut off;
    categorical columns (the variant) are labelled by their paper labels.
    """
    data = frame.dropna(subset=[color])
    dimensions = []
    for d in dims:
        col = data[d]
        if not pd.api.types.is_numeric_dtype(col):
            cats = sorted(col.astype(str).unique())
            codes = col.astype(str).map({c: i for i, c in enumerate(cats)})
            text = [V.label(c) if d == "variant" else c for c in cats]
            # tick texts are set as plain text (d3's axis), labels drawn as plotly's HTML subset
            dimensions.append(dict(label=plain.html(axis_title(d)), values=codes, tickvals=list(range(len(cats))),
                                   ticktext=text))
        else:
            dimensions.append(dict(label=plain.html(axis_title(d)), values=col.astype(float)))
    dimensions.append(dict(label=plain.html(f"{color} {metric}"), values=data[color]))
    fig = go.Figure(go.Parcoords(line=dict(color=data[color], colorscale="Viridis" if direction == "max" else "Viridis_r",
                                           showscale=True,
                                           colorbar=dict(title=dict(text=f"{plain.html(color)}<br>{plain.html(metric)}"))),
                                 dimensions=dimensions, labelangle=0, labelside="top",
                                 labelfont=dict(size=13), tickfont=dict(size=11)))
    fig = _layout(fig, height=460)
    # parcoords draws its axis names above the plot area: leave room for them on every side
    fig.update_layout(margin=dict(l=90, r=110, t=90, b=40))
    return fig


def param_split_figure(row: dict) -> go.Figure:
    """Where a checkpoint's parameters are: W_Q, W_K, W_V, W_O (from the geometry), the
    rest of attention (biases) and the rest of the model, as a donut.

    Per layer: W_Q n_heads*d_model*d_head (0 where the variant has none of its own,
    ``analysis.variants.Q_DROPPED``: ``wq_identity``, and the Q=K variants where it is W_K),
    W_K n_kv_heads*d_model*d_head, W_V the same (0 when tied to W_K, ``KV_TIED``), W_O
    n_heads*d_head*d_model.
    """
    L, H, G = int(row["n_layers"]), int(row["n_heads"]), int(row["n_kv_heads"])
    dm, dh, variant = int(row["d_model"]), int(row["d_head"]), str(row["variant"])
    parts = {
        "W_Q": 0 if variant in V.Q_DROPPED else L * H * dm * dh,
        "W_K": L * G * dm * dh,
        "W_V": 0 if variant in V.KV_TIED else L * G * dm * dh,
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
        # a part the model does not have (no biases, W_V tied to W_K) keeps its legend entry but
        # no "0.0%" label: plotly would draw one outside the ring for a slice of no width
        texttemplate=["%{percent:.1%}" if parts[n] else "" for n in names], hovertemplate="%{label}: %{value:,} (%{percent})<extra></extra>"))
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
    the title says why. Degenerate cells (``degenerate``: fixed by construction) are grey and
    left out of the colour range; a value called above chance (``above_chance``) is starred. The
    range is centred on chance with a half-width at least the null band's (``diverging_range``),
    so a random model's values, all inside the band, stay pale.
    """
    data = results[(results["metric"] == metric) & results["head"].notna() & results["layer"].notna()]
    if data.empty:
        return empty_figure(f"{metric}: no per-head values stored")
    data = data.assign(layer=data["layer"].astype(int), head=data["head"].astype(int))
    degenerate, above = flags_of(data)
    data = data.assign(degenerate=degenerate.to_numpy(), above=above.to_numpy())
    layers, heads = sorted(data["layer"].unique()), sorted(data["head"].unique())
    z = _grid(data, "value", layers, heads).astype(float)  # (n_layers, n_heads)
    fixed = _grid(data.assign(fixed=data["degenerate"].astype(float)), "fixed", layers, heads).astype(float) == 1
    star = _grid(data.assign(star=data["above"].astype(float)), "star", layers, heads).astype(float) == 1
    text = [[("" if math.isnan(v) else f"{v:.3g}" + ("*" if s else "")) for v, s in zip(row, srow)]
            for row, srow in zip(z, star)]
    hover = data.assign(hover=[
        f"L{l}H{h}<br>{plain.html(metric)} " + value_text(v, c, n, lo, hi)
        + ("<br>degenerate: fixed by construction (see the notes), not counted" if d else "")
        + ("<br>above chance (outside the null band, 5% false discovery rate)" if a else "")
        for l, h, v, c, n, lo, hi, d, a in zip(data["layer"], data["head"], data["value"], _col(data, "chance"),
                                               _col(data, "n_tokens"), _col(data, "ci_low"), _col(data, "ci_high"),
                                               data["degenerate"], data["above"])])
    custom = _grid(hover, "hover", layers, heads)
    custom = [[("" if c is None else c) for c in row] for row in custom]
    coloured = np.where(fixed, np.nan, z)                # degenerate cells: grey, off the colour scale
    chance = chance_of(data)
    if chance is not None:
        if zmin is None and zmax is None:
            zmin, zmax = diverging_range(coloured, chance, band_of(data))
        scale, zmid = colorscale or DIVERGING, chance
    else:
        if zmin is None and zmax is None and (steady := _noise_range(z)) is not None:
            zmin, zmax = steady                 # one colour for values equal up to noise
        scale, zmid = colorscale or "Viridis", None
    x, y = [f"H{h}" for h in heads], [f"L{l}" for l in layers]
    fig = go.Figure(go.Heatmap(
        z=_nested(coloured), x=x, y=y,
        colorscale=scale, zmin=zmin, zmax=zmax, zmid=zmid, text=text, customdata=custom,
        texttemplate="%{text}" if z.size <= 400 else None, opacity=0.35 if muted else None,
        hovertemplate="%{customdata}<extra></extra>",
        colorbar=dict(title=dict(text=f"{plain.html(metric)}<br>{chance_label(data)}"))))
    if fixed.any():                                      # the degenerate cells, grey, with their values
        fig.add_trace(go.Heatmap(
            z=_nested(np.where(fixed, 1.0, np.nan)), x=x, y=y, colorscale=[[0, GREY], [1, GREY]],
            showscale=False, text=text, customdata=custom, texttemplate="%{text}" if z.size <= 400 else None,
            hovertemplate="%{customdata}<extra></extra>", name="degenerate"))
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
                      hovertemplate=f"{plain.hover(name)}<br>%{{y:.4g}}<extra></extra>")


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
    hover = [f"layer {int(l)}<br>{plain.html(metric)} " + value_text(v, c, n, a, b)
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
    """Singular values by index, one line per projection (``projection, index, sigma``); a log
    y axis gets ticks that read as numbers (``log_ticks``: "0.3", never a bare "3")."""
    fig = go.Figure()
    for i, (proj, g) in enumerate(spectra.groupby("projection", sort=False)):
        fig.add_trace(go.Scatter(x=g["index"], y=g["sigma"], mode="lines+markers", name=str(proj),
                                 line=dict(color=run_color(i)),
                                 hovertemplate=f"{plain.hover(proj)}<br>i=%{{x}}<br>sigma %{{y:.4g}}<extra></extra>"))
    fig = _layout(fig, x_title="singular value index", y_title="singular value σ", log_y=log_y, height=360)
    if log_y and len(spectra):
        readable_log_axis(fig, spectra["sigma"], "y")
    return fig


def attention_figure(weights: np.ndarray, tokens: list[str], *, title: str = "") -> go.Figure:
    """One head's attention pattern (query rows x key columns, ``[T, T]``)."""
    labels = [plain.html(f"{i}:{t}") for i, t in enumerate(tokens)]
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
        return f"{plain.html(label)} " + value_text(row[s], row.get(f"chance_{s}"), row.get(f"n_tokens_{s}"),
                                        row.get(f"ci_low_{s}"), row.get(f"ci_high_{s}"))

    hover = data.assign(hover=[
        f"L{r['layer']}H{r['head']}<br>{plain.html(b_label)} - {plain.html(a_label)} = "
        f"{format(r['diff'], '+.4g') if _finite(r['diff']) else 'undefined'}<br>"
        f"{side(r, 'a', a_label)}<br>{side(r, 'b', b_label)}" for r in data.to_dict("records")])
    custom = [[("" if c is None else c) for c in row] for row in _grid(hover, "hover", layers, heads)]
    lim = float(np.nanmax(np.abs(z))) if np.isfinite(z).any() else 1.0
    fig = go.Figure(go.Heatmap(
        z=_nested(z), x=[f"H{h}" for h in heads], y=[f"L{l}" for l in layers],
        colorscale=DIVERGING, zmin=-lim, zmax=lim, zmid=0.0, colorbar=dict(title=dict(text=plain.html(f"{b_label} - {a_label}"))),
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
        hover = [f"{plain.html(name)}<br>step {int(s)}<br>{plain.html(metric)} " + value_text(v, c, n, a, b)
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


def _group_sharing(group: str) -> str | None:
    """The head sharing a weight-decay group label names (``"n_kv_heads=1"`` with ``n_head=4``), if any."""
    kv = re.search(r"n_kv_heads=(\d+)", str(group))
    heads = re.search(r"n_heads?=(\d+)", str(group))
    if kv and heads:
        return V.sharing(int(heads.group(1)), int(kv.group(1)))
    if kv and int(kv.group(1)) == 1:
        return "MQA"
    return None


def wd_group_name(variant: str | None, group: str, task: str | None = None, condition: str | None = None, *,
                  paper_label: bool = True) -> str:
    """The legend name of a weight-decay group (``analysis.wd_sensitivity``'s ``group`` label):
    ``"Q-K=V [image, n_kv_heads=1]"``. ``task`` (where given) comes first unless the label starts
    with it already; ``"all"`` (a variant's only group) adds nothing; a paper condition of its own
    names the group instead of its stored variant (``"QVV(3) [image]"``), and its
    ``paper_condition=...`` entry is dropped from the label. ``paper_label`` False: the stored
    variant name (``"k_eq_v [image]"``), as tables write it."""
    entries = [e for e in str(group).split(", ") if e and e != "all" and e != f"paper_condition={condition}"]
    if task and (not entries or entries[0] != str(task)):
        entries.insert(0, str(task))
    name = variant_label(variant, condition) if paper_label else (own_condition(condition) or str(variant))
    return f"{name} [{', '.join(entries)}]" if entries else name


def wd_group_keys(points: pd.DataFrame) -> list[str]:
    """The columns that tell weight-decay groups apart in ``points``: ``task`` (where present),
    ``variant``, ``group``."""
    return (["task"] if "task" in points.columns else []) + ["variant", "group"]


def wd_groups(points: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    """``points`` split by ``wd_group_keys``, as ``((task, variant, group), rows)`` (task None where
    ``points`` has none), language first, then other tasks, variants and groups by name."""
    keys = wd_group_keys(points)
    parts = [((k if len(keys) == 3 else (None, *k)), g) for k, g in points.groupby(keys, sort=True)]
    return sorted(parts, key=lambda p: (p[0][0] not in (None, DEFAULT_TASK), str(p[0][0]), p[0][1:]))


def wd_task_shown(points: pd.DataFrame):
    """A function of a task giving what ``wd_group_name`` should name: every task when ``points``
    holds several, a task other than language always, else None."""
    tasks = points["task"] if "task" in points.columns else pd.Series([], dtype=object)
    several = several_tasks(tasks)
    return lambda task: task if task and (several or str(task) != DEFAULT_TASK) else None


def wd_figure(points: pd.DataFrame, *, y: str = "final_val_loss", y_title: str = "final val/loss") -> go.Figure:
    """Loss against weight decay per variant, log x; diverged runs as crosses, spiky ones ringed.

    ``points``: ``variant, group, weight_decay, <y>, diverged, spikes, run_id`` and where known
    ``task``, ``condition``. Weight decay 0 is drawn half a decade left of the smallest positive
    value, on a tick labelled "0". Groups of one variant share its colour and differ in dash and
    marker (head sharing where the group names it, else by order); groups of different tasks are
    apart and their legend names the task (``wd_group_name``: ``"Q-K=V [image, n_kv_heads=1]"``).
    """
    fig = go.Figure()
    ticks, zero_at = _wd_axis(points["weight_decay"])
    data = points[points["weight_decay"] >= 0].assign(x=lambda d: _wd_x(d["weight_decay"], zero_at))
    kinds = list(SHARING_DASH)[:3]
    within: dict[str, int] = {}

    shown = wd_task_shown(data)
    kvs = [int(m.group(1)) for m in (re.search(r"n_kv_heads=(\d+)", str(g)) for g in data["group"].unique()) if m]
    for i, ((task, variant, group), g) in enumerate(wd_groups(data)):
        k = within.get(variant, 0)
        within[variant] = k + 1
        sharing = _group_sharing(group)
        kv = re.search(r"n_kv_heads=(\d+)", str(group))
        if sharing is None and kv and kvs:     # the most KV heads in the figure drawn as MHA, fewer as GQA
            sharing = "MHA" if int(kv.group(1)) == max(kvs) else "GQA"
        style = group_style(variant, sharing or (kinds[k % 3] if k or group != "all" else "MHA"), i)
        color = style["color"]
        g = g.sort_values("weight_decay")
        name = wd_group_name(variant, group, shown(task), first_value(g, "condition"))
        ok = g[~g["diverged"]]
        mean = ok.groupby("x", as_index=False)[y].mean()
        fig.add_trace(go.Scatter(x=mean["x"], y=mean[y], mode="lines", name=name,
                                 legendgroup=name, line=dict(color=color, width=2, dash=style["dash"]),
                                 hoverinfo="skip"))
        # The runs as markers: the finished ones, then the diverged ones as crosses, each trace
        # with one symbol. Per-point symbol or colour-name arrays would cost plotly's Python
        # validation a regular-expression match per point (0.3 s of the page's 0.47 s at
        # 2,000 runs); numbers are checked as one array, so the ring is a 0/1 colour on a
        # white-to-black scale (1: spiky, ringed black and thicker).
        for diverged, part in ((False, ok), (True, g[g["diverged"]])):
            if part.empty:
                continue
            spiky = (part["spikes"] > 0).to_numpy()
            fig.add_trace(go.Scatter(
                x=part["x"], y=part[y], mode="markers", legendgroup=name, showlegend=False,
                marker=dict(color=color, size=11, symbol="x" if diverged else style["symbol"],
                            line=dict(width=np.where(spiky, 3, 1), color=spiky.astype(np.int8),
                                      colorscale=RING_SCALE, cmin=0, cmax=1)),
                customdata=np.stack([part["run_id"], part["spikes"], part["diverged"].astype(int),
                                     part["weight_decay"]], axis=-1),
                hovertemplate=(f"{plain.hover(name)}<br>wd %{{customdata[3]:.4g}}<br>{plain.hover(y_title)} %{{y:.4g}}"
                               "<br>run %{customdata[0]}"
                               "<br>spikes %{customdata[1]}<br>diverged %{customdata[2]}<extra></extra>")))
    _layout(fig, x_title="weight decay (log)", y_title=y_title, log_x=True)
    fig.update_xaxes(**ticks)
    return fig


def first_value(frame: pd.DataFrame, column: str):
    """The first non-missing value of ``column`` in ``frame`` (None where absent)."""
    if column not in frame.columns:
        return None
    values = frame[column].dropna()
    return values.iloc[0] if len(values) else None


#: Projection norm metrics in the order and words the norms figure uses.
NORM_TITLES = {"norm_q": "W_Q", "norm_k": "W_K", "norm_v": "W_V", "norm_o": "W_O"}


#: What ``_with_runs`` takes from a figure's runs.
RUN_FACTS = ("n_heads", "n_kv_heads", "task", "condition")


def _with_runs(frame: pd.DataFrame, runs: pd.DataFrame | None) -> pd.DataFrame:
    """``frame`` (with ``run_id``) given ``RUN_FACTS`` of its runs: ``runs`` holds ``run_id`` or
    ``id`` and either those columns (``loaders.run_table.run_table`` rows) or a ``config`` they
    are read from (``loaders.run_table.with_facts``; a run's own ``n_kv_heads`` wins)."""
    if runs is None or "run_id" not in frame.columns or runs.empty:
        return frame
    r = runs.rename(columns={"id": "run_id"}) if "run_id" not in runs.columns else runs
    if not set(RUN_FACTS) <= set(r.columns):
        r = with_facts(r)
    facts = r[["run_id", *RUN_FACTS]].assign(run_id=r["run_id"].astype(int)).drop_duplicates("run_id")
    base = frame.drop(columns=[c for c in RUN_FACTS if c in frame.columns])
    return base.merge(facts, on="run_id", how="left")


def norms_figure(norms: pd.DataFrame, *, variants=None, runs: pd.DataFrame | None = None) -> go.Figure:
    """Projection norms against weight decay (``variant, weight_decay, metric, value`` and where
    present ``n_heads, n_kv_heads, task, condition``), log x: one panel per projection (W_Q,
    W_K, W_V, W_O) with a shared y axis, one line per task x variant x head sharing in the
    variant's colour and the sharing's dash (one legend entry per group, as on every page,
    naming the task when the runs are of several: ``"Q-K=V · MQA · image"``), a marker per run.

    ``variants``: only these variants (the page's Variants filter); None or empty: all.
    ``runs``: the runs (``run_id``; ``RUN_FACTS`` columns or a ``config``) that give head
    counts, task and condition, so MHA and MQA runs, and vision and language runs, are
    separate lines.
    """
    data = _with_runs(norms[norms["weight_decay"] >= 0], runs)
    if variants:
        data = data[data["variant"].astype(str).isin([str(v) for v in variants])]
    if data.empty:
        return empty_figure("No projection norms for the chosen variants")
    ticks, zero_at = _wd_axis(data["weight_decay"])
    records = data.to_dict("records")
    data = data.assign(x=_wd_x(data["weight_decay"], zero_at),
                       _sharing=[sharing_of(r.get("n_heads"), r.get("n_kv_heads")) for r in records],
                       _task=[_val(r, "task") or DEFAULT_TASK for r in records],
                       _condition=[_val(r, "condition") or "" for r in records])
    name_task = several_tasks(data["_task"])
    stored = set(data["metric"].unique())
    present = [m for m in NORM_TITLES if m in stored] + sorted(stored - set(NORM_TITLES))
    fig = make_subplots(rows=1, cols=len(present), shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=[plain.html(NORM_TITLES.get(m, m)) for m in present])
    order = {v: i for i, v in enumerate(V.ALL_VARIANTS)}
    groups = sorted(data.groupby(["_task", "variant", "_condition", "_sharing"]).groups,
                    key=lambda k: (k[0] != DEFAULT_TASK, k[0], order.get(k[1], 99), str(k[1]), k[2],
                                   SHARING_RANK[sharing_kind(k[3])], str(k[3])))
    for i, (task, variant, condition, sharing) in enumerate(groups):
        g_all = data[(data["_task"] == task) & (data["variant"] == variant) & (data["_condition"] == condition)
                     & (data["_sharing"] == sharing)]
        style = group_style(variant, sharing, i)
        if name_task and task != DEFAULT_TASK:     # another task's line of the same variant: a darker shade
            style["color"] = shade(style["color"], TASK_SHADE)
        name = legend_label(variant, sharing, task, condition or None, name_task=name_task)
        for col, metric in enumerate(present, start=1):
            g = g_all[g_all["metric"] == metric]
            if g.empty:
                continue
            mean = g.groupby("x", as_index=False)["value"].mean()
            fig.add_trace(go.Scatter(x=mean["x"], y=mean["value"], mode="lines", name=name, legendgroup=name,
                                     showlegend=col == 1, line=dict(color=style["color"], dash=style["dash"]),
                                     hoverinfo="skip"), row=1, col=col)
            fig.add_trace(go.Scatter(
                x=g["x"], y=g["value"], mode="markers", legendgroup=name, showlegend=False, name=name,
                marker=dict(color=style["color"], symbol=style["symbol"], size=8), customdata=g["weight_decay"],
                hovertemplate=(f"{plain.hover(name)}<br>{plain.hover(NORM_TITLES.get(metric, metric))}<br>wd %{{customdata:.4g}}"
                               "<br>norm %{y:.4g}<extra></extra>")), row=1, col=col)
    _layout(fig, x_title="", y_title="", log_x=True, height=400)
    fig.update_xaxes(type="log", **ticks)
    fig.update_xaxes(title_text="weight decay (log)", row=1, col=(len(present) + 1) // 2)
    fig.update_yaxes(title_text="Frobenius norm", row=1, col=1)
    fig.update_layout(margin=dict(l=70, r=20, t=60, b=60), legend=dict(orientation="h", y=-0.25))
    return fig
