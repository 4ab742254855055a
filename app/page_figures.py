"""The main figures of the Weight decay and KV cost pages, built without Streamlit.

The pages draw them (through ``app.figures.show``) and the CLI writes them with
``--figures DIR`` (``wd-sensitivity``, ``kv-cost``: ``app.figures.write_figures``),
so a figure in a paper is the one on the page.

* Weight decay: ``wd_curve_figures(table, statistic, metric)``, per task the loss of each run
  against its weight decay with the mean and its t interval per weight
  decay (``analysis.wd_sensitivity``'s table; ``per_run`` and ``per_wd`` unpack it).
* KV cost: ``kv_cost_figures(...)``, four sweeps of the configurations
  (``kv_configs``) against context and concurrent users.
* What if: ``whatif_figure(curves, trained, paper)``, the Pareto chart of KV bytes saved against
  perplexity change: one greedy conversion curve per target beside the trained runs' and the
  paper's points (``analysis.sharing_cost``).
"""
from __future__ import annotations

import dataclasses

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from analysis.gpus import GIB
from analysis.kv_cost import Attention, Geometry, baseline_attention, standard_configs, sweep_context, sweep_users
from analysis.variants import sharing
from app import charts, plain
from app.charts import LIGHT, group_style, readable_log_axis

#: Axis titles in words for the KV cost sweep charts.
KV_AXES = {
    "context": "context (tokens per user)", "users": "concurrent users", "label": "configuration",
    "KV GiB per user": "KV cache per user (GiB)", "users_per_gpu": "users per GPU (memory)",
    "usd_per_million_tokens": "USD per 1M output tokens", "gpus": "GPUs needed",
    "tokens_per_s": "decode tokens/s", "bound": "bound", "tokens_per_s_per_gpu": "tokens/s per GPU",
}


# -- Weight decay -----------------------------------------------------------------------------

def _keys(table: pd.DataFrame) -> list[str]:
    """The columns naming a group: ``task, condition`` (where present), ``variant, group``."""
    return [c for c in ("task", "condition") if c in table.columns] + ["variant", "group"]


def per_run(table: pd.DataFrame) -> pd.DataFrame:
    """The sensitivity table's per-run lists as one row per run (``[task, condition,] variant, group,
    run_id, weight_decay, final_val_loss, best_val_loss, spikes, diverged``)."""
    cols = ["weight_decays", "final_val_loss", "best_val_loss", "run_ids", "spikes", "diverged"]
    if table.empty:
        return pd.DataFrame(columns=_keys(table) + ["run_id", "weight_decay", "final_val_loss",
                                                    "best_val_loss", "spikes", "diverged"])
    long = table[_keys(table) + cols].explode(cols, ignore_index=True)
    long = long.rename(columns={"weight_decays": "weight_decay", "run_ids": "run_id"})
    long["weight_decay"] = long["weight_decay"].astype(float)
    long["final_val_loss"] = pd.to_numeric(long["final_val_loss"], errors="coerce")
    long["best_val_loss"] = pd.to_numeric(long["best_val_loss"], errors="coerce")
    long["spikes"] = long["spikes"].astype(int)
    long["diverged"] = long["diverged"].astype(bool)
    long["run_id"] = long["run_id"].astype(int)
    return long


def per_wd(table: pd.DataFrame) -> pd.DataFrame:
    """The sensitivity table's per-weight-decay points as rows: ``[task, condition,] variant, group,
    weight_decay, n_runs, mean, ci_low, ci_high, n_diverged, n_spiky``."""
    keys = _keys(table)
    cols = keys + ["weight_decay", "n_runs", "mean", "ci_low", "ci_high", "n_diverged", "n_spiky"]
    rows = [{**{k: getattr(r, k) for k in keys}, **{k: p.get(k) for k in cols[len(keys):]}}
            for r in table.itertuples() for p in r.per_wd]
    out = pd.DataFrame(rows, columns=cols)
    for c in ("weight_decay", "mean", "ci_low", "ci_high"):
        out[c] = pd.to_numeric(out[c], errors="coerce")
    return out


def _x_of(fig: go.Figure, wd: pd.Series) -> pd.Series:
    """Where ``charts.wd_figure`` put each weight decay on its log axis (wd 0 sits on the tick labelled "0")."""
    ticks = dict(zip(fig.layout.xaxis.ticktext or (), fig.layout.xaxis.tickvals or ()))
    return wd.where(wd > 0, ticks.get("0"))


def add_intervals(fig: go.Figure, points: pd.DataFrame, *, y_title: str) -> go.Figure:
    """Per weight decay and group: the mean over runs as a dash with its 95% t interval as an
    error bar (only where runs repeat) and ``n=`` beside it where more than one run stands behind it."""
    data = points.assign(x=lambda d: _x_of(fig, d["weight_decay"]))
    shown = charts.wd_task_shown(data)
    for i, ((task, variant, group), g) in enumerate(charts.wd_groups(data)):
        name = charts.wd_group_name(variant, group, shown(task), charts.first_value(g, "condition"))  # as charts.wd_figure
        has = g["ci_low"].notna()
        err = dict(type="data", symmetric=False, array=(g["ci_high"] - g["mean"]).where(has, 0).tolist(),
                   arrayminus=(g["mean"] - g["ci_low"]).where(has, 0).tolist(), thickness=1.5, width=6,
                   color=charts.variant_color(variant, i))
        ci = [f"{lo:.4g} to {hi:.4g}" if pd.notna(lo) else "none (one run)" for lo, hi in zip(g["ci_low"], g["ci_high"])]
        fig.add_trace(go.Scatter(
            x=g["x"], y=g["mean"], mode="markers+text", name=f"{name}: mean, 95% CI", legendgroup=name,
            showlegend=False, error_y=err,
            marker=dict(symbol="line-ew-open", size=16, color=charts.variant_color(variant, i), line=dict(width=2)),
            text=[f"n={n}" if n > 1 else "" for n in g["n_runs"]], textposition="middle right",
            customdata=[[w, n, c] for w, n, c in zip(g["weight_decay"], g["n_runs"], ci)],
            hovertemplate=(f"{plain.hover(name)}<br>wd %{{customdata[0]:.4g}}<br>mean {plain.hover(y_title)} %{{y:.4g}} over "
                           "%{customdata[1]} runs<br>95% CI %{customdata[2]}<extra></extra>")))
    return fig


def _task_column(table: pd.DataFrame) -> pd.Series:
    """``table``'s ``task`` column (a tasks-less table: None for every row), to group by."""
    return table["task"].rename("task") if "task" in table.columns else pd.Series("", index=table.index, name="task")


def regressions(table: pd.DataFrame) -> dict[tuple[str, str, str], dict]:
    """``{(task, variant, project): regression}`` for the variants whose method is ``"regression"``:
    one per comparable set (``analysis.wd_sensitivity`` fits each set of a variant on its own; task
    ``""`` in a table without tasks, project ``""`` without projects; a second set of one task,
    variant and project, another geometry, is ``"project (2)"``)."""
    out: dict[tuple[str, str, str], dict] = {}
    seen: set[int] = set()
    for r in table.itertuples():
        reg = r.regression if r.method == "regression" else None
        if not isinstance(reg, dict) or id(reg) in seen:    # a set's rows share one regression dict
            continue
        seen.add(id(reg))
        task, variant, project = str(getattr(r, "task", "") or ""), str(r.variant), str(getattr(r, "project", "") or "")
        key, n = (task, variant, project), 1
        while key in out:
            n += 1
            key = (task, variant, f"{project} ({n})")
        out[key] = reg
    return out


def by_task(regs: dict[tuple[str, str, str], dict]) -> dict[str, dict[tuple[str, str, str], dict]]:
    """``regs`` split per task, language first: each task's regressions get their own figure and
    y axis (a language loss and a ViT's cross-entropy are different quantities)."""
    from analysis.results_table import DEFAULT_TASK  # here: the Results table's order, only when drawn

    tasks = sorted({k[0] for k in regs}, key=lambda t: (t != DEFAULT_TASK, t))
    return {t: {k: v for k, v in regs.items() if k[0] == t} for t in tasks}


def wd_curve_figures(table: pd.DataFrame, *, statistic: str, metric: str) -> dict[str, go.Figure]:
    """The Weight decay page's main charts, one per task (``{task: figure}``, language first): per
    group of runs fitted by the grouped estimator, each run's ``statistic`` loss against its
    weight decay and the mean per weight decay with its interval (``add_intervals``). One figure
    and y axis per task: a language loss in nats per token and a ViT's cross-entropy are different
    quantities on different scales. Empty when every variant was fitted by the regression."""
    from analysis.results_table import DEFAULT_TASK  # here: the Results table's order, only when drawn

    # a variant fitted by the regression has a group per run: its runs are drawn under "Random sweeps"
    grouped = table[table["method"] != "regression"] if "method" in table.columns else table
    grouped_long, points = per_run(grouped), per_wd(grouped)
    if grouped_long.empty:
        return {}
    y_title = f"{statistic} {metric}"
    long_task = _task_column(grouped_long).astype(str)
    point_task = _task_column(points).astype(str)
    out = {}
    for task in sorted(set(long_task), key=lambda t: (t != DEFAULT_TASK, t)):
        fig = charts.wd_figure(grouped_long[long_task == task], y=f"{statistic}_val_loss", y_title=y_title)
        out[task] = add_intervals(fig, points[point_task == task], y_title=y_title)
    return out


# -- Results ------------------------------------------------------------------------------------

#: Head sharing told apart by the marker (the colour is the variant's).
_SHARING_SYMBOLS = {"MHA": "circle", "GQA": "square", "MQA": "diamond"}


def results_figure(table: pd.DataFrame, metric: str) -> go.Figure | None:
    """The Results table as a figure: each row's mean ``metric`` with its sample standard deviation
    as an error bar, against its KV-cache bytes per token (log x): what a variant costs to serve
    beside what it loses. One marker per row, coloured by variant and shaped by head sharing, named as the table names it
    (variant, head sharing, and the project, task and geometry where rows differ in them); None
    without a row holding that mean."""
    mean, std = f"{metric} mean", f"{metric} std"
    if table.empty or mean not in table.columns or "KV bytes/token" not in table.columns:
        return None
    rows = table[pd.to_numeric(table[mean], errors="coerce").notna()]
    if rows.empty:
        return None
    varying = [c for c in ("project", "task", "d_model", "n_layers") if c in rows and rows[c].nunique() > 1]
    fig = go.Figure()
    for _, r in rows.iterrows():
        name = " · ".join([str(r.get("label") or r["variant"]), str(r.get("sharing", ""))]
                          + [f"{c} {r[c]}" if c in ("d_model", "n_layers") else str(r[c]) for c in varying])
        err = r.get(std)
        fig.add_trace(go.Scatter(
            x=[r["KV bytes/token"]], y=[r[mean]], mode="markers", name=name,
            marker=dict(size=10, color=charts.VARIANT_COLORS.get(str(r["variant"]), "#888"),
                        symbol=_SHARING_SYMBOLS.get(str(r.get("sharing", ""))[:3], "circle")),
            error_y=dict(type="data", array=[err if pd.notna(err) else 0], visible=bool(pd.notna(err))),
            hovertemplate=(f"{plain.hover(name)}<br>KV bytes/token %{{x:,.0f}}<br>{plain.hover(metric)} %{{y:.4g}} "
                           f"(n {int(r[f'{metric} n'])})<extra></extra>")))
    charts._layout(fig, x_title="KV-cache bytes per token", y_title=f"{metric} (mean ± std over a row's runs)",
                   log_x=True, height=420)
    fig.update_layout(legend=dict(orientation="h", y=-0.25))
    return fig


# -- What if ----------------------------------------------------------------------------------

#: Legend names of the What if chart's reference points.
WHATIF_TRAINED = "trained with the tie (stored runs)"
WHATIF_PAPER = "trained with the tie (paper B, 300M)"


def whatif_label(result: dict) -> str:
    """The legend name of a ``whatif`` result's curve: target, method, how it was converted."""
    return f"{result['target']} by {result['method']}, converted (greedy)"


def whatif_figure(curves: dict[str, pd.DataFrame], trained: pd.DataFrame, paper: pd.DataFrame) -> go.Figure:
    """The What if page's Pareto chart: x the KV cache saved (% of bytes per token), y the
    perplexity change (%), both from (0, 0), the unconverted model. ``curves``: legend name ->
    ``analysis.sharing_cost.curve`` of a greedy conversion (lines, each step's marker labelled with
    the layers converted so far); ``trained`` and ``paper``: ``sharing_cost.POINT_COLUMNS`` frames
    (diamonds: the stored runs trained with the tie against their Q-K-V run; stars: the paper's
    trained variants). Lower right is better: more cache saved for less perplexity."""
    fig = go.Figure()
    for name, c in curves.items():
        fig.add_trace(go.Scatter(x=c["kv_saved_pct"], y=c["delta_ppl_pct"], mode="lines+markers+text",
                                 text=[plain.html(t) for t in c["layers"]], textposition="top center", name=name))
    fig.add_trace(go.Scatter(x=trained["kv_saved_pct"], y=trained["delta_ppl_pct"], mode="markers",
                             marker={"symbol": "diamond", "size": 11}, text=[plain.html(t) for t in trained["label"]],
                             name=WHATIF_TRAINED))
    fig.add_trace(go.Scatter(x=paper["kv_saved_pct"], y=paper["delta_ppl_pct"], mode="markers",
                             marker={"symbol": "star", "size": 12}, text=[plain.html(t) for t in paper["label"]],
                             name=WHATIF_PAPER))
    fig.update_layout(xaxis_title="KV cache saved (% of bytes per token)", yaxis_title="perplexity change (%)",
                      height=480)
    return fig


# -- KV cost ----------------------------------------------------------------------------------

def kv_configs(geometry: Geometry, chosen: Attention) -> list[Attention]:
    """The baseline first, then an MLA model's own attention, every variant and K=V with
    GQA/MQA at the chosen window, plus the chosen configuration itself when it adds MLA or
    cross-layer sharing."""
    configs = [dataclasses.replace(c, window=chosen.window)
               for c in standard_configs(geometry, chosen.n_kv_heads)]
    if chosen not in configs:
        configs.append(chosen)
    base = baseline_attention(geometry)
    return [base] + [c for c in configs if c != base]


def kv_styles(geometry: Geometry, configs: list[Attention]) -> tuple[dict, dict]:
    """Colour (the variant's) and dash (the head sharing's) per configuration label."""
    colors, dashes = {}, {}
    for i, cfg in enumerate(configs):
        kv = cfg.n_kv_heads or geometry.n_kv_heads
        style = group_style("mla" if cfg.mla_latent else cfg.variant, sharing(geometry.n_heads, kv), i)
        colors[cfg.label(geometry)], dashes[cfg.label(geometry)] = style["color"], style["dash"]
    return colors, dashes


def kv_line(frame: pd.DataFrame, x: str, y: str, title: str, styles: tuple[dict, dict], *, log_x: bool = True,
          log_y: bool = False, hover: list[str] | None = None):
    colors, dashes = styles
    fig = px.line(frame, x=x, y=y, color="label", line_dash="label", color_discrete_map=colors,
                  line_dash_map=dashes, markers=True, log_x=log_x, log_y=log_y, hover_data=hover,
                  labels=KV_AXES, title=title, template=LIGHT)
    if log_x:
        readable_log_axis(fig, frame[x], "x")
    if log_y:
        readable_log_axis(fig, frame[y], "y")
    # the legend under the plot: beside it, seven configurations took half of a half-width column
    fig.update_layout(legend=dict(title_text="configuration", orientation="h", yanchor="top", y=-0.3),
                      height=520, margin=dict(l=60, r=20, t=50, b=40))
    return fig


def kv_cost_figures(geometry: Geometry, configs: list[Attention], serving, gpu, result, base) -> dict[str, go.Figure]:
    """The KV cost page's four sweeps of ``configs``: cache per user and users per GPU against the
    context (1/32 to 4 times the chosen one, at least 1024), USD per 1M tokens and GPUs needed
    against concurrent users (1/64 to 16 times what one GPU holds)."""
    styles = kv_styles(geometry, configs)
    top = max(serving.resolved_context(), 1024)
    contexts = sorted({int(top * f) for f in (1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1, 2, 4)} - {0})
    sweep = sweep_context(geometry, configs, serving, gpu, contexts)
    sweep["KV GiB per user"] = sweep["bytes_per_user"] / GIB
    cap = max(result.users_per_gpu, base.users_per_gpu, result.batch_per_replica, 8)
    users = sorted({max(1, int(cap * f)) for f in (1 / 64, 1 / 16, 1 / 4, 1 / 2, 1, 2, 4, 16)})
    by_users = sweep_users(geometry, configs, serving, gpu, users).dropna(subset=["usd_per_million_tokens"])
    return {
        "kv_plot_cache": kv_line(sweep, "context", "KV GiB per user", "KV cache per user against context", styles),
        "kv_plot_users": kv_line(sweep, "context", "users_per_gpu", "Users per GPU against context", styles),
        "kv_plot_cost": kv_line(by_users, "users", "usd_per_million_tokens",
                                "USD per 1M output tokens against concurrent users", styles, log_y=True,
                                hover=["gpus", "bound"]),
        "kv_plot_gpus": kv_line(by_users, "users", "gpus", "GPUs needed against concurrent users", styles,
                                log_y=True, hover=["tokens_per_s", "tokens_per_s_per_gpu"]),
    }
