"""Results tables as papers print them: variants as rows, metrics as columns, mean ± std over seeds.

Pure pandas (no I/O). ``run_groups(runs)`` gives each run its group (task, variant, query
heads, KV heads: MHA, GQA and MQA runs of one variant are different rows; a paper condition
of its own, ``OWN_CONDITIONS``, apart from its stored variant); ``results_table(runs, values,
metrics)`` aggregates per group. The runs' task and geometry come from their configs
(``loaders.run_table``).

Per group and metric (``statistic`` ``"final"``: each run's last value; ``"best"``: its best,
the lowest of a loss and the highest of an accuracy, ``analysis.directions``):

* ``mean`` = sum(x) / n and ``std`` the sample standard deviation sqrt(sum (x - mean)^2 / (n - 1))
  (NaN for one run), over the group's runs (seeds, when the other settings are held fixed);
* ``n`` runs with a value;
* ``vs qkv %`` = 100 (mean - mean_qkv) / |mean_qkv| against the ``qkv`` row of the same task
  and head sharing (paper B, arXiv 2606.04032, Table 4: "+3.1% perplexity"); NaN for the
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


def _int_or_none(v):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA else int(v)


def run_groups(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` (``id`` or ``run_id``, ``variant``, and ``task``, ``n_heads``, ``n_kv_heads``,
    ``condition`` where known) with ``task`` filled (``"language"``), ``sharing``
    (``analysis.variants.sharing``), ``label`` (``variant_label``) and ``group``:
    ``"<task>|<variant>|<n_heads>|<n_kv_heads>"``, the key that keeps MHA, GQA and MQA runs of
    one variant apart, with ``"|<condition>"`` added for an ``OWN_CONDITIONS`` run (QVV(3) is
    not a Q-K=V run)."""
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
    out["group"] = [f"{t}|{v}|{a}|{b}" + (f"|{c}" if c else "")
                    for t, v, a, b, c in zip(out["task"], out["variant"], h, kv, own)]
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

    Returns ``task, variant, label, sharing, n_heads, n_kv_heads, n runs, seeds, run ids``, then
    per metric ``<m> mean, <m> std, <m> n, <m> vs qkv %`` (and with ``perplexity`` the same for
    ``exp(<m>)`` of each loss metric), then ``KV bytes/token, attention params``; rows in the
    order task, head sharing (MHA, GQA, MQA), variant (``analysis.variants.ALL_VARIANTS``).
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
        row = {"task": first["task"], "variant": variant, "label": first["label"], "sharing": first["sharing"],
               "n_heads": _int_or_none(first["n_heads"]), "n_kv_heads": _int_or_none(first["n_kv_heads"]),
               "n runs": len(rows),
               "seeds": ", ".join(str(_int_or_none(s)) for s in rows["seed"] if _int_or_none(s) is not None)
               if "seed" in rows.columns else "",
               "run ids": ", ".join(str(i) for i in sorted(rows["run_id"]))}
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
        row["_order"] = _sort_key(str(first["task"]), str(first["sharing"]), _int_or_none(first["n_kv_heads"]),
                                  order.get(variant, len(order)), variant)
        out_rows.append(row)
    base_cols = ["task", "variant", "label", "sharing", "n_heads", "n_kv_heads", "n runs", "seeds", "run ids"]
    metric_cols = [f"{name} {s}" for name, _ in columns for s in ("mean", "std", "n", "vs qkv %")]
    if not out_rows:
        return pd.DataFrame(columns=base_cols + metric_cols + ["KV bytes/token", "attention params"])
    out = pd.DataFrame(out_rows).sort_values("_order", kind="stable").drop(columns="_order").reset_index(drop=True)
    for name, _ in columns:
        base = (out[out["variant"] == baseline]
                .drop_duplicates(["task", "n_heads", "n_kv_heads"])
                .set_index(["task", "n_heads", "n_kv_heads"])[f"{name} mean"])
        ref = [base.get((t, h, kv), np.nan) for t, h, kv in zip(out["task"], out["n_heads"], out["n_kv_heads"])]
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
    """Metric names in picking order: validation metrics first (their loss first, then accuracies
    such as ``val/accuracy`` or ``val_top1``), then training metrics (loss first), then the rest
    (learning rate and the like), alphabetically within each."""
    def key(name: str):
        low = name.lower()
        split = low.replace("/", "_").replace("-", "_")
        stage = 0 if split.startswith(("val", "eval", "valid", "test")) else 1 if split.startswith("train") else 2
        loss = 0 if "loss" in low else 1
        return stage, loss, low
    return sorted({str(n) for n in names}, key=key)
