"""Results tables as papers print them: variants as rows, metrics as columns, mean ± std over seeds.

Pure pandas (no I/O). ``run_groups(runs)`` gives each run its comparable group
(``analysis.comparable``: project, task, d_model, n_layers, query heads, KV heads, variant: MHA,
GQA and MQA runs of one variant are different rows, and so are two projects or two widths; a
paper condition of its own, ``OWN_CONDITIONS``, apart from its stored variant);
``results_table(runs, values, metrics)`` aggregates per group, and names in ``warnings`` what
a group's runs differ in besides weight decay and seed (``analysis.comparable.differences``).
The runs' project, task and geometry come from the store (``loaders.run_table``).
``results_view`` is the table as the Results page and ``python -m app results`` show it (weight
decay and task chosen, the reason when it is empty); ``results_json`` its rows as JSON.

Per group and metric (``statistic`` ``"final"``: each run's last value; ``"best"``: its best,
the lowest of a loss and the highest of an accuracy, ``analysis.directions``):

* ``mean`` = sum(x) / n and ``std`` the sample standard deviation sqrt(sum (x - mean)^2 / (n - 1))
  (NaN for one run), over the group's runs (seeds, when the other settings are held fixed);
* ``n`` runs with a value;
* ``vs qkv %`` = 100 (mean - mean_qkv) / |mean_qkv| against the ``qkv`` row of the same project,
  task, geometry and head sharing (paper B, arXiv 2606.04032, Table 4: "+3.1% perplexity"); NaN for the
  baseline itself and where the group has no baseline.

``perplexity`` adds ``exp(loss)`` per run before the mean (the perplexity of a loss in nats,
per token or per byte as the loss is), for language runs only: an image classifier's loss
has no perplexity (NaN).

Beside them: KV bytes per token ``n_layers * n_cached * n_kv_heads * d_head * bytes``
(``analysis.variants.n_cached``: 1 for K=V variants, else 2) and the attention parameters
(W_Q, W_K, W_V, W_O without biases, those a variant ties counted once), from the run's
checkpoint geometry or, without a checkpoint, its config.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis import variants as V
from analysis.comparable import differences, group_keys
from analysis.directions import direction
from analysis.errors import AnalysisError

#: Task of a run whose config names none.
DEFAULT_TASK = "language"
#: The baseline variant of the % column.
BASELINE = "qkv"
STATISTICS = ("final", "best")
#: Bytes per element of a checkpoint dtype name.
DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2,
               "bf16": 2, "float8": 1, "fp8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1,
               "float64": 8}
#: Order of head-sharing kinds in a table.
_SHARING_ORDER = {"MHA": 0, "GQA": 1, "MQA": 2, "?": 3}

#: Paper conditions that are an architecture of their own but are stored under the variant whose
#: projections and KV cache they share, until ``analysis.variants`` names them: paper B's QVV(3)
#: (K=V with a depth-2 factored W_Q, the parameter count of Q-K-V; its repository's
#: ``imagenet_experiment.py``), stored as ``k_eq_v`` with ``config.paper_condition``. Rows and
#: legends show the condition and keep its runs apart from the variant's own.
OWN_CONDITIONS = frozenset({"QVV(3)"})


def own_condition(condition) -> str | None:
    """``condition`` when it is one of ``OWN_CONDITIONS``, else None (NaN, None, other names)."""
    return condition if isinstance(condition, str) and condition in OWN_CONDITIONS else None


def variant_label(variant, condition=None) -> str:
    """The name a row or legend shows: the paper's condition for ``OWN_CONDITIONS``
    (``"QVV(3)"``), else the variant's paper label (``analysis.variants.label``)."""
    return own_condition(condition) or V.label(variant)


def _part(v) -> str:
    """A key part: the value as text, ``?`` for an unknown one (NaN, None)."""
    return "?" if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else str(v)


def _int_or_none(v):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA else int(v)


def run_groups(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` (``id`` or ``run_id``, ``variant``, and ``task``, ``n_heads``, ``n_kv_heads``,
    ``condition`` where known) with ``task`` filled (``"language"``), ``sharing``
    (``analysis.variants.sharing``), ``label`` (``variant_label``) and ``group``:
    ``analysis.comparable.group_key`` (project, task, geometry, variant, head sharing), with
    ``"|<condition>"`` added for an ``OWN_CONDITIONS`` run (QVV(3) is not a Q-K=V run)."""
    out = runs.copy()
    if "task" not in out.columns:
        out["task"] = DEFAULT_TASK
    out["task"] = out["task"].where(out["task"].notna() & (out["task"].astype(str) != ""), DEFAULT_TASK).astype(str)
    for c in ("n_heads", "n_kv_heads"):
        if c not in out.columns:
            out[c] = None
    out["variant"] = out["variant"].where(out["variant"].notna(), V.UNKNOWN).astype(str)
    h = [_int_or_none(v) for v in out["n_heads"]]
    kv = [_int_or_none(v) for v in out["n_kv_heads"]]
    own = [own_condition(c) for c in (out["condition"] if "condition" in out.columns else [None] * len(out))]
    out["sharing"] = [V.sharing(a, b) for a, b in zip(h, kv)]
    out["label"] = [variant_label(v, c) for v, c in zip(out["variant"], own)]
    out["group"] = [k + (f"|{c}" if c else "") for k, c in zip(group_keys(out), own)]
    return out


def attention_params(variant: str, n_layers, n_heads, n_kv_heads, d_model, d_head) -> int | None:
    """W_Q + W_K + W_V + W_O parameters over all layers, a tied projection counted once:
    per layer W_Q ``n_heads d_model d_head`` (0 when dropped: ``analysis.variants.Q_DROPPED``),
    W_K ``n_kv_heads d_model d_head``, W_V the same (0 when tied to K), W_O ``n_heads d_head
    d_model``; None when a size is unknown."""
    L, H, G, dm, dh = (_int_or_none(v) for v in (n_layers, n_heads, n_kv_heads, d_model, d_head))
    if None in (L, H, G, dm, dh):
        return None
    q = 0 if variant in V.Q_DROPPED else H * dm * dh
    v = 0 if variant in V.KV_TIED else G * dm * dh
    return L * (q + G * dm * dh + v + H * dh * dm)


def kv_bytes_per_token(variant: str, n_layers, n_kv_heads, d_head, bytes_per_elem) -> int | None:
    """``n_layers * n_cached(variant) * n_kv_heads * d_head * bytes_per_elem``; None when unknown."""
    L, G, dh, b = (_int_or_none(v) for v in (n_layers, n_kv_heads, d_head, bytes_per_elem))
    if None in (L, G, dh, b):
        return None
    return V.kv_bytes_per_token(variant, L, G, dh, b)


def _per_run_value(values: pd.DataFrame, metric: str, statistic: str, overrides) -> pd.Series:
    rows = values[values["metric"] == metric].drop_duplicates("run_id").set_index("run_id")
    if statistic == "final":
        return rows["final"].astype(float)
    return (rows["max"] if direction(metric, overrides) == "max" else rows["min"]).astype(float)


def results_table(runs: pd.DataFrame, values: pd.DataFrame, metrics: list[str], *, statistic: str = "final",
                  perplexity: bool = False, bytes_per_elem: int | None = None,
                  overrides: dict[str, str] | None = None, baseline: str = BASELINE) -> pd.DataFrame:
    """One row per group of ``run_groups(runs)`` (see the module docstring).

    ``runs``: ``id`` (or ``run_id``), ``variant`` and where known ``task, n_heads, n_kv_heads,
    n_layers, d_model, d_head, seed, dtype, params_attention, kv_bytes_per_token`` (from the
    latest checkpoint; the stored ``kv_bytes_per_token`` is used unless ``bytes_per_elem`` is
    given, which recomputes it from the geometry). ``values``: ``run_id, metric, final, min,
    max`` (``loaders.curves.run_metric_summary``).

    Returns ``project, task, variant, label, sharing, d_model, n_layers, n_heads, n_kv_heads, n runs,
    seeds, run ids, warnings`` (a list of sentences, ``analysis.comparable.differences``), then
    per metric ``<m> mean, <m> std, <m> n, <m> vs qkv %`` (and with ``perplexity`` the same for
    ``exp(<m>)`` of each loss metric), then ``KV bytes/token, attention params``; rows in the
    order project, task, d_model, n_layers, head sharing (MHA, GQA, MQA), variant
    (``analysis.variants.ALL_VARIANTS``).
    """
    if statistic not in STATISTICS:
        raise AnalysisError(f"results_table: statistic must be one of {', '.join(STATISTICS)}; got {statistic!r}")
    id_col = "id" if "id" in runs.columns else "run_id"
    g = run_groups(runs)
    if id_col == "id":
        g = g.drop(columns=[c for c in ("run_id",) if c in g.columns]).rename(columns={"id": "run_id"})
    g["run_id"] = g["run_id"].astype(int)
    columns: list[tuple[str, pd.Series]] = []
    for m in metrics:
        per_run = _per_run_value(values, m, statistic, overrides)
        columns.append((m, g["run_id"].map(per_run)))
        if perplexity and direction(m, overrides) == "min":
            columns.append((f"exp({m})", np.exp(g["run_id"].map(per_run)).where(g["task"] == DEFAULT_TASK)))
    out_rows = []
    order = {v: i for i, v in enumerate(V.ALL_VARIANTS)}
    for key, rows in g.groupby("group", sort=False):
        first = rows.iloc[0]
        variant = str(first["variant"])
        row = {"project": first.get("project"), "task": first["task"], "variant": variant, "label": first["label"],
               "sharing": first["sharing"], "d_model": _int_or_none(first.get("d_model")),
               "n_layers": _int_or_none(first.get("n_layers")),
               "n_heads": _int_or_none(first["n_heads"]), "n_kv_heads": _int_or_none(first["n_kv_heads"]),
               "n runs": len(rows),
               "seeds": ", ".join(str(_int_or_none(s)) for s in rows["seed"] if _int_or_none(s) is not None)
               if "seed" in rows.columns else "",
               "run ids": ", ".join(str(i) for i in sorted(rows["run_id"])),
               "warnings": differences(rows)}
        for name, series in columns:
            x = series.loc[rows.index].dropna().to_numpy(dtype=float)
            row[f"{name} mean"] = float(x.mean()) if x.size else np.nan
            row[f"{name} std"] = float(x.std(ddof=1)) if x.size > 1 else np.nan
            row[f"{name} n"] = int(x.size)
        row["KV bytes/token"] = _geometry_value(rows, variant, "kv", bytes_per_elem)
        # an own condition's projections are not its stored variant's (QVV(3) factors W_Q): only a
        # checkpoint's stored count is used
        row["attention params"] = _geometry_value(rows, variant, "params", bytes_per_elem,
                                                  computed=own_condition(first["label"]) is None)
        task_sharing = _sort_key(str(first["task"]), str(first["sharing"]), _int_or_none(first["n_kv_heads"]),
                                 order.get(variant, len(order)), variant)
        row["_order"] = (str(first.get("project")), *task_sharing[:2], _int_or_none(first.get("d_model")) or 0,
                         _int_or_none(first.get("n_layers")) or 0, *task_sharing[2:])
        out_rows.append(row)
    base_cols = ["project", "task", "variant", "label", "sharing", "d_model", "n_layers", "n_heads", "n_kv_heads",
                 "n runs", "seeds", "run ids", "warnings"]
    metric_cols = [f"{name} {s}" for name, _ in columns for s in ("mean", "std", "n", "vs qkv %")]
    if not out_rows:
        return pd.DataFrame(columns=base_cols + metric_cols + ["KV bytes/token", "attention params"])
    out = pd.DataFrame(out_rows).sort_values("_order", kind="stable").drop(columns="_order").reset_index(drop=True)
    for name, _ in columns:
        same = ["project", "task", "d_model", "n_layers", "n_heads", "n_kv_heads"]
        keys = [tuple(_part(v) for v in t) for t in out[same].itertuples(index=False)]
        base = {k: m for k, m, v in zip(keys, out[f"{name} mean"], out["variant"]) if v == baseline}
        ref = [base.get(k, np.nan) for k in keys]
        ref = np.asarray(ref, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            pct = 100.0 * (out[f"{name} mean"].to_numpy(dtype=float) - ref) / np.abs(ref)
        pct[(out["variant"] == baseline).to_numpy() | ~np.isfinite(pct)] = np.nan
        out[f"{name} vs qkv %"] = pct
    return out[base_cols + metric_cols + ["KV bytes/token", "attention params"]]


def table_order(task, sharing, n_kv_heads, variant) -> tuple:
    """The sort key of a row in table order: task, head sharing (MHA, GQA with more KV heads
    first, MQA), variant (``analysis.variants.ALL_VARIANTS`` order)."""
    rank = {v: i for i, v in enumerate(V.ALL_VARIANTS)}
    return _sort_key(str(task), str(sharing), _int_or_none(n_kv_heads), rank.get(str(variant), len(rank)), str(variant))


def _sort_key(task: str, sharing: str, n_kv_heads, variant_rank: int, variant: str) -> tuple:
    """Rows by task (language first, then the others by name), head sharing (MHA, GQA with more
    KV heads first, MQA), then variant."""
    kind = "GQA" if sharing.startswith("GQA") else (sharing if sharing in _SHARING_ORDER else "?")
    return (task != DEFAULT_TASK, task, _SHARING_ORDER[kind], -(n_kv_heads or 0), variant_rank, variant)


def _geometry_value(rows: pd.DataFrame, variant: str, what: str, bytes_per_elem, *,
                    computed: bool = True) -> float:
    """The group's KV bytes per token or attention parameters (the median over its runs); with
    ``computed`` False, parameters only as a checkpoint stored them."""
    vals = []
    for r in rows.to_dict("records"):
        if what == "params":
            v = r.get("params_attention")
            if _int_or_none(v) is None and computed:
                v = attention_params(variant, r.get("n_layers"), r.get("n_heads"), r.get("n_kv_heads"),
                                     r.get("d_model"), r.get("d_head"))
        else:
            v = None if bytes_per_elem is not None else r.get("kv_bytes_per_token")
            if _int_or_none(v) is None:
                b = bytes_per_elem if bytes_per_elem is not None else DTYPE_BYTES.get(str(r.get("dtype")).lower())
                v = kv_bytes_per_token(variant, r.get("n_layers"), r.get("n_kv_heads"), r.get("d_head"), b)
        if _int_or_none(v) is not None:
            vals.append(float(v))
    return float(np.median(vals)) if vals else np.nan


def common_setting(runs: pd.DataFrame, column: str = "weight_decay"):
    """The value of ``column`` shared by the most groups (ties: the largest value), the setting a
    table holds fixed by default so its rows differ in variant and seed only; None if absent."""
    if column not in runs.columns or runs[column].dropna().empty:
        return None
    g = run_groups(runs)
    counts = g.dropna(subset=[column]).groupby(column)["group"].nunique()
    best = counts.max()
    return float(max(v for v, c in counts.items() if c == best))


def best_of_each_group(runs: pd.DataFrame, values: pd.DataFrame, metric: str, *, limit: int = 8,
                       overrides: dict[str, str] | None = None) -> list[int]:
    """A default selection of runs to plot: per group (``run_groups``), the run with the best
    final ``metric`` (lowest loss, highest accuracy; ``values``: ``run_id, final`` rows of that
    metric), groups in table order, at most ``limit``; groups without the metric give their
    first run. Empty for no runs."""
    if runs.empty:
        return []
    id_col = "id" if "id" in runs.columns else "run_id"
    g = run_groups(runs)
    final = dict(zip(values["run_id"].astype(int), values["final"].astype(float))) if len(values) else {}
    sign = -1.0 if direction(metric, overrides) == "max" else 1.0
    order = {v: i for i, v in enumerate(V.ALL_VARIANTS)}
    picks = []
    for _, rows in g.groupby("group", sort=False):
        first = rows.iloc[0]
        ids = [int(i) for i in rows[id_col]]
        scored = [(sign * final[i], i) for i in ids if i in final and math.isfinite(final[i])]
        pick = min(scored)[1] if scored else min(ids)
        picks.append((_sort_key(str(first["task"]), str(first["sharing"]), _int_or_none(first["n_kv_heads"]),
                                order.get(str(first["variant"]), len(order)), str(first["variant"])), pick))
    return [i for _, i in sorted(picks)[:limit]]


def metric_order(names) -> list[str]:
    """Metric names in picking order: validation metrics first, then training metrics, then the
    rest (learning rate and the like). Validation: ``val/loss``, ``eval/loss``, other losses of a
    ``val``/``eval``/``valid`` split, then those of a ``test`` split, then the split's other
    metrics (accuracies such as ``val/accuracy`` or ``val_top1``). A name containing ``train`` is
    a training metric wherever it stands (``eval/train_loss`` is a loss on the training split).
    Alphabetical within each rank."""
    def key(name: str):
        low = name.lower()
        split = low.replace("/", "_").replace("-", "_")
        loss = 0 if "loss" in low else 1
        if "train" in low:
            return 1, 0, loss, low
        if split.startswith(("val", "eval", "valid")) or "valid" in split:
            rank = 0 if low == "val/loss" else 1 if low == "eval/loss" else 2
            return 0, loss, rank, low
        if split.startswith("test") or "_test" in split:
            return 0, loss, 3, low
        return 2, 0, loss, low
    return sorted({str(n) for n in names}, key=key)


def _fmt_wd(v) -> str:
    return f"{v:g}"


def wd_choices(runs: pd.DataFrame) -> list[str]:
    """The weight decays a table can hold fixed, as text (``"0.03"``), lowest first."""
    if "weight_decay" not in runs.columns:
        return []
    return [_fmt_wd(w) for w in sorted({float(w) for w in runs["weight_decay"].dropna()})]


def default_task(runs: pd.DataFrame) -> str:
    """The task a table opens on: ``language`` when the runs hold it and another task (a loss in
    nats per byte and a classifier's cross-entropy are different quantities), else ``"all"``."""
    tasks = set(runs["task"].astype(str)) if "task" in runs.columns else set()
    return DEFAULT_TASK if DEFAULT_TASK in tasks and len(tasks) > 1 else "all"


def default_wd(runs: pd.DataFrame, values: pd.DataFrame, metric: str | None) -> str:
    """The weight decay a table opens on: ``common_setting`` among the runs that logged ``metric``
    (a weight decay with data), ``"all"`` when no run states one."""
    if metric is not None and len(values):
        logged = set(values.loc[values["metric"] == metric, "run_id"].astype(int))
        id_col = "id" if "id" in runs.columns else "run_id"
        with_data = runs[runs[id_col].astype(int).isin(logged)]
        if len(with_data):
            runs = with_data
    wd = common_setting(runs)
    return "all" if wd is None else _fmt_wd(wd)


def results_view(runs: pd.DataFrame, values: pd.DataFrame, metrics: list[str], *, wd: str = "all",
                 task: str = "all", statistic: str = "final", perplexity: bool = False,
                 bytes_per_elem: int | None = None, overrides: dict[str, str] | None = None
                 ) -> tuple[pd.DataFrame, str | None]:
    """The Results table as the page and ``python -m app results`` show it: ``runs`` held at weight
    decay ``wd`` (text as ``wd_choices`` gives it, or ``"all"``) and ``task`` (or ``"all"``), then
    ``results_table``. Returns ``(table, why_empty)``: one line saying why no row is left, or
    None."""
    chosen = runs
    if wd != "all":
        chosen = chosen[chosen["weight_decay"].map(lambda w: w is not None and not (
            isinstance(w, float) and math.isnan(w)) and _fmt_wd(float(w)) == wd)]
    if task != "all":
        chosen = chosen[chosen["task"].astype(str) == task]
    table = results_table(chosen, values, metrics, statistic=statistic, perplexity=perplexity,
                          bytes_per_elem=bytes_per_elem, overrides=overrides)
    why = None
    if runs.empty:
        why = "no runs stored (in the chosen projects)"
    elif chosen.empty:
        why = (f"no run has weight decay {wd}" if wd != "all" else "no run") + \
              (f" and task {task}" if task != "all" else "")
    elif metrics and all((table[f"{m} n"] == 0).all() for m in metrics if f"{m} n" in table.columns):
        why = f"none of the {len(chosen)} runs chosen logged {', '.join(metrics)}"
    return table, why


def _json_value(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return None if not math.isfinite(float(v)) else float(v)
    return v


def results_json(table: pd.DataFrame) -> list[dict]:
    """The rows of ``results_table`` as JSON: ``project, task, variant, label, sharing, n_kv_heads,
    n_heads, d_model, n_layers, n`` (runs), ``run_ids`` (list), ``seeds``, the statistics (``"<metric>
    mean"``, ``std``, ``n``, ``vs qkv %``, ``KV bytes/token``, ``attention params``; null where
    undefined) and ``warnings`` (list)."""
    rows = []
    for r in table.to_dict("records"):
        row = {k: _json_value(r[k]) for k in ("project", "task", "variant", "label", "sharing", "n_kv_heads",
                                             "n_heads", "d_model", "n_layers")}
        row["n"] = int(r["n runs"])
        row["run_ids"] = [int(i) for i in str(r["run ids"]).split(", ") if i]
        row["seeds"] = [int(s) for s in str(r["seeds"]).split(", ") if s]
        for k, v in r.items():
            if k.endswith((" mean", " std", " n", " vs qkv %")) or k in ("KV bytes/token", "attention params"):
                row[k] = _json_value(v)
        row["warnings"] = list(r["warnings"])
        rows.append(row)
    return rows
