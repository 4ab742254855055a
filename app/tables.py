"""Result tables shared by the pages: every value beside its chance level, sampled values with
their tokens and 95% interval, and under-sampled metrics greyed with the reason.

Pure pandas (no streamlit, no I/O): a results frame (``loaders.curves.analysis_results``) and
the analysis notes (``{metric: reason}``) in, a DataFrame or a pandas ``Styler`` out, which the
pages hand to ``st.dataframe``.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
from pandas.io.formats.style import Styler

from app.charts import _col, flags_of, interval_text

#: What a table cell shows where a value is undefined (the std of one run, the baseline's own %),
#: on screen (``st.dataframe(..., placeholder=MISSING)``: Streamlit draws a missing number as a grey
#: "None" otherwise, whatever a Styler's ``na_rep`` says) and in text cells.
MISSING = "\u2014"
#: Text colour of values that are not to be read as results (too few tokens).
MUTED = "color: #9a9a9a; font-style: italic"
#: A note saying a metric had fewer sample tokens than it needs, as ``analysis.activations``
#: writes it (``"512 tokens < 8 x d_head = 1024: ..."``) or in words.
_FEW_TOKENS = re.compile(r"\btokens?\s*<|too few tokens|fewer tokens than", re.IGNORECASE)


#: A cell starting with one of these is a formula to a spreadsheet (OWASP, "CSV Injection").
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _guard(value):
    """A text ``value`` a spreadsheet would run as a formula, prefixed with ``'`` (shown as text);
    anything else as it is (numbers, negative ones included, stay numbers)."""
    return "'" + value if isinstance(value, str) and value.startswith(FORMULA_START) else value


def csv_bytes(frame: pd.DataFrame) -> bytes:
    """``frame`` as the UTF-8 CSV every download offers: headers and text cells that start like a
    formula (``FORMULA_START``: a run name ``=HYPERLINK(...)``, a metric ``=cmd|...``) guarded
    with a leading ``'``, so opening the file in a spreadsheet runs nothing. Lines end in CRLF
    (RFC 4180), so a cell holding a carriage return is quoted: a bare one would end the row
    there for a spreadsheet, and what follows (``=...``) would start a cell of its own."""
    safe = frame.copy()
    safe.columns = [_guard(str(c)) for c in safe.columns]
    for col in safe.columns:
        if safe[col].dtype == object or pd.api.types.is_string_dtype(safe[col]):
            safe[col] = safe[col].map(_guard)
    return safe.to_csv(index=False, lineterminator="\r\n").encode()


def few_tokens(note: str | None) -> bool:
    """Whether a metric's note says its value rests on too few tokens."""
    return bool(note) and _FEW_TOKENS.search(str(note)) is not None


def short_reason(note: str) -> str:
    """The first clause of a too-few-tokens note (``"512 tokens < 8 x d_head = 1024"``), for titles."""
    return str(note).split(":", 1)[0].split(";", 1)[0].strip()


def muted_metrics(notes: dict[str, str]) -> dict[str, str]:
    """The metrics of ``notes`` whose values rest on too few tokens, with the reason."""
    return {m: n for m, n in notes.items() if few_tokens(n)}


def _grey_rows(frame: pd.DataFrame, column: str = "note") -> Styler:
    """``frame`` styled: rows whose ``column`` says too few tokens in ``MUTED``; floats to 4 digits."""
    floats = [c for c in frame.columns if pd.api.types.is_float_dtype(frame[c])]

    def style(row: pd.Series) -> list[str]:
        grey = few_tokens(row.get(column)) or row.get("heads above chance") == "degenerate" or \
            row.get("degenerate") is True
        return [MUTED if grey else ""] * len(row)

    others = [c for c in frame.columns if c not in floats]
    return (frame.style.apply(style, axis=1).format("{:.4g}", subset=floats, na_rep="")
            .format(na_rep="", subset=others))


def _count_text(values) -> list[str]:
    """Token counts as text, "" where absent (the grid draws a missing number as "None")."""
    return ["" if pd.isna(v) else str(int(v)) for v in values]


def layer_table(results: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """Per-layer values (head NULL) of ``metrics`` with each one's chance beside it:
    ``layer, <m>, <m> chance, ...`` in the order of ``metrics`` (absent metrics left out)."""
    rows = results[results["metric"].isin(metrics) & results["head"].isna() & results["layer"].notna()]
    if rows.empty:
        return pd.DataFrame(columns=["layer"])
    out = pd.DataFrame({"layer": sorted(rows["layer"].astype(int).unique())})
    stored = set(rows["metric"].unique())
    for m in [m for m in metrics if m in stored]:
        r = rows[rows["metric"] == m].assign(layer=lambda d: d["layer"].astype(int)).drop_duplicates("layer")
        r = r.set_index("layer")
        out[m] = out["layer"].map(r["value"]).astype(float)
        out[f"{m} chance"] = out["layer"].map(r["chance"]).astype(float)
    return out


def head_summary(results: pd.DataFrame, metrics: list[str], notes: dict[str, str]) -> Styler:
    """Per (layer, metric) over its heads: ``mean, min, max`` of the value, the (mean) chance,
    ``heads above chance``, and for activation metrics ``n_tokens`` and the mean of the heads'
    95% bounds; ``note`` from the analysis notes. Rows of under-sampled metrics are greyed.

    "Above chance" is the stored test (``above_chance``, ``analysis.above_chance``: the value, or
    for sampled metrics its whole 95% interval, outside the null band at a 5% false discovery
    rate over the metric's heads), counted over the heads it was tested on; degenerate heads
    (fixed by construction) are counted nowhere, and a layer whose heads are all degenerate
    reads "degenerate" and is greyed.
    """
    rows = results[results["metric"].isin(metrics) & results["head"].notna()].copy()
    cols = ["layer", "metric", "mean", "min", "max", "chance", "heads above chance", "n_tokens",
            "95% CI (mean of heads' bounds)", "note"]
    if rows.empty:
        return _grey_rows(pd.DataFrame(columns=cols))
    degenerate, above = flags_of(rows)
    tested = (rows["above_chance"].notna() if "above_chance" in rows.columns
              else pd.Series(False, index=rows.index)) & ~degenerate
    rows["above"], rows["judged"], rows["fixed"] = above & tested, tested, degenerate
    g = rows.groupby(["layer", "metric"], sort=False)
    out = g.agg(mean=("value", "mean"), min=("value", "min"), max=("value", "max"), chance=("chance", "mean"),
                above=("above", "sum"), judged=("judged", "sum"), n=("value", "size"), fixed=("fixed", "sum"),
                n_tokens=("n_tokens", "min"), ci_low=("ci_low", "mean"), ci_high=("ci_high", "mean")).reset_index()
    order = {m: i for i, m in enumerate(metrics)}
    out = out.sort_values(["layer", "metric"], key=lambda s: s.map(order) if s.name == "metric" else s)
    out["heads above chance"] = ["degenerate" if f == n else f"{int(a)} of {int(j)}" if j else ""
                                 for a, j, n, f in zip(out["above"], out["judged"], out["n"], out["fixed"])]
    out["95% CI (mean of heads' bounds)"] = [interval_text(lo, hi) for lo, hi in zip(out["ci_low"], out["ci_high"])]
    out["note"] = out["metric"].map(lambda m: notes.get(m, "")).astype(str)
    out["layer"] = out["layer"].astype(int)
    out["n_tokens"] = _count_text(out["n_tokens"])
    return _grey_rows(out[cols].reset_index(drop=True))


def head_rows(results: pd.DataFrame, metrics: list[str], notes: dict[str, str]) -> Styler:
    """Every per-head row of ``metrics``: ``layer, head, metric, value, chance, null band, above
    chance, degenerate, n_tokens, 95% CI, note``; under-sampled metrics and degenerate rows greyed."""
    rows = results[results["metric"].isin(metrics) & results["head"].notna()]
    degenerate, above = flags_of(rows)
    out = pd.DataFrame({
        "layer": rows["layer"].astype(int), "head": rows["head"].astype(int), "metric": rows["metric"],
        "value": rows["value"].astype(float), "chance": rows["chance"].astype(float),
        "null band": [interval_text(lo, hi) for lo, hi in zip(_col(rows, "chance_low"), _col(rows, "chance_high"))],
        "above chance": [None if d or pd.isna(t) else bool(a) for d, t, a in
                         zip(degenerate, _col(rows, "above_chance"), above)],
        "degenerate": degenerate.tolist(),
        "n_tokens": _count_text(rows["n_tokens"]),
        "95% CI": [interval_text(lo, hi) for lo, hi in zip(rows["ci_low"], rows["ci_high"])],
        "note": rows["metric"].map(lambda m: notes.get(m, "")).astype(str)})
    return _grey_rows(out.sort_values(["layer", "head", "metric"]).reset_index(drop=True))


def change_table(diff: pd.DataFrame, metric: str, notes_a: dict[str, str], notes_b: dict[str, str],
                 top: int = 10) -> Styler:
    """The ``top`` largest changes ``|b - a|`` of ``metric`` (``curves.head_difference``) with both
    sides' chance levels, and for sampled metrics their tokens, 95% intervals and whether the
    intervals overlap (a change inside both intervals is not a change); ``note``: A's and B's notes
    (greyed when one says too few tokens)."""
    d = diff[(diff["metric"] == metric) & diff["head"].notna()].copy()
    d = d.assign(abs=d["diff"].abs()).sort_values("abs", ascending=False).head(top)
    out = pd.DataFrame({"layer": d["layer"].astype(int), "head": d["head"].astype(int),
                        "A": d["a"].astype(float), "B": d["b"].astype(float), "B - A": d["diff"].astype(float),
                        "chance A": d["chance_a"].astype(float), "chance B": d["chance_b"].astype(float)})
    if d[["ci_low_a", "ci_low_b"]].notna().any().any():
        out["n_tokens A"] = _count_text(d["n_tokens_a"])
        out["A 95% CI"] = [interval_text(lo, hi) for lo, hi in zip(d["ci_low_a"], d["ci_high_a"])]
        out["n_tokens B"] = _count_text(d["n_tokens_b"])
        out["B 95% CI"] = [interval_text(lo, hi) for lo, hi in zip(d["ci_low_b"], d["ci_high_b"])]
        out["CIs overlap"] = [bool(la <= hb and lb <= ha) if np.isfinite([la, ha, lb, hb]).all() else None
                              for la, ha, lb, hb in zip(d["ci_low_a"], d["ci_high_a"], d["ci_low_b"],
                                                        d["ci_high_b"])]
    parts = [f"{side}: {n[metric]}" for side, n in (("A", notes_a), ("B", notes_b)) if n.get(metric)]
    out["note"] = "; ".join(parts)
    return _grey_rows(out.reset_index(drop=True))


def head_means(results: pd.DataFrame) -> pd.DataFrame:
    """Results over checkpoints (``loaders.curves.results_over_checkpoints``) averaged over heads:
    per ``run_id, metric, layer, step`` the mean ``value``, ``chance``, ``ci_low``, ``ci_high``
    (the mean of the heads' bounds, not an interval of the mean) and the fewest ``n_tokens``.
    Rows without a run or a step (no place on a training-step axis) and whole-layer rows are left out."""
    rows = results[results["head"].notna() & results["run_id"].notna() & results["step"].notna()]
    cols = ["run_id", "metric", "layer", "step", "value", "chance", "n_tokens", "ci_low", "ci_high"]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    out = (rows.groupby(["run_id", "metric", "layer", "step"], as_index=False, dropna=False)
           .agg(value=("value", "mean"), chance=("chance", "mean"), n_tokens=("n_tokens", "min"),
                ci_low=("ci_low", "mean"), ci_high=("ci_high", "mean")))
    return out[cols]


# -- results tables as papers print them (analysis.results_table) ------------------------

def _pm(mean, std, digits: int) -> str:
    if not _finite_number(mean):
        return ""
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if _finite_number(std) else f"{mean:.{digits}f}"


def _finite_number(v) -> bool:
    return v is not None and v is not pd.NA and isinstance(v, (int, float, np.number)) and np.isfinite(v)


def _pct(v) -> str:
    return f"{v:+.1f}%" if _finite_number(v) else ""


def _count(v) -> str:
    return f"{int(v):,}" if _finite_number(v) else ""


def results_metric_names(table: pd.DataFrame) -> list[str]:
    """The metric columns of a ``results_table`` frame (``<m>`` of each ``<m> mean``), in order."""
    return [c[: -len(" mean")] for c in table.columns if c.endswith(" mean")]


def results_display(table: pd.DataFrame, *, digits: int = 4) -> pd.DataFrame:
    """A ``results_table`` frame as a paper prints it, all text: ``Variant, Heads`` (and ``Project``,
    ``Task``, ``d_model``, ``Layers`` each when the rows hold more than one), ``n``, per metric ``"1.3194 ± 0.0047"`` and ``"vs Q-K-V"``
    (``"+2.0%"``, empty for the baseline), ``KV bytes/token, Attention params``."""
    out = pd.DataFrame({"Variant": table["label"].astype(str), "Heads": table["sharing"].astype(str)})
    for col, title in (("n_layers", "Layers"), ("d_model", "d_model"), ("task", "Task"), ("project", "Project")):
        if col in table.columns and table[col].astype(str).nunique() > 1:
            out.insert(0, title, [MISSING if pd.isna(v) else str(v if not isinstance(v, float) else int(v))
                                  for v in table[col]])
    out["n"] = [str(int(n)) for n in table["n runs"]]
    for m in results_metric_names(table):
        out[m] = [_pm(a, b, digits) for a, b in zip(table[f"{m} mean"], table[f"{m} std"])]
        out[f"{m} vs Q-K-V"] = [_pct(v) for v in table[f"{m} vs qkv %"]]
    out["KV bytes/token"] = [_count(v) for v in table["KV bytes/token"]]
    out["Attention params"] = [_count(v) for v in table["attention params"]]
    if "warnings" in table.columns and any(len(w) for w in table["warnings"]):
        out["Runs differ in"] = ["; ".join(w) for w in table["warnings"]]
    return out.reset_index(drop=True)


def results_csv(table: pd.DataFrame) -> bytes:
    """A ``results_table`` frame as CSV (``csv_bytes``: formula-like cells guarded), ``warnings``
    joined by ``"; "``."""
    flat = table.copy()
    if "warnings" in flat.columns:
        flat["warnings"] = ["; ".join(w) for w in flat["warnings"]]
    return csv_bytes(flat)


def results_markdown(display: pd.DataFrame) -> str:
    """A ``results_display`` frame as a Markdown (GitHub) table; numbers right-aligned."""
    cols = list(display.columns)
    text = {"Project", "Task", "Variant", "Heads", "Runs differ in"}
    esc = [[str(v).replace("|", "\\|") for v in row] for row in display.itertuples(index=False)]
    lines = ["| " + " | ".join(c.replace("|", "\\|") for c in cols) + " |",
             "|" + "|".join(":---" if c in text else "---:" for c in cols) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in esc]
    return "\n".join(lines) + "\n"


_LATEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def _latex(text: str) -> str:
    out = "".join(_LATEX_ESCAPES.get(ch, ch) for ch in str(text))
    return out.replace("±", r"$\pm$").replace("·", r"$\cdot$").replace("σ", r"$\sigma$")


def results_latex(display: pd.DataFrame, *, caption: str | None = None, label: str | None = None) -> str:
    """A ``results_display`` frame as a LaTeX ``booktabs`` table (``\\toprule``, ``\\midrule``,
    ``\\bottomrule``; needs ``\\usepackage{booktabs}``), special characters escaped, ``±`` as
    ``$\\pm$``; a ``\\midrule`` between head-sharing (and task) blocks as papers group rows."""
    cols = list(display.columns)
    align = "".join("l" if c in ("Project", "Task", "Variant", "Heads", "Runs differ in") else "r" for c in cols)
    lines = [r"\begin{table}[t]", r"\centering"]
    if caption:
        lines.append(r"\caption{" + _latex(caption) + "}")
    if label:
        lines.append(r"\label{" + label + "}")
    lines += [r"\begin{tabular}{" + align + "}", r"\toprule", " & ".join(_latex(c) for c in cols) + r" \\",
              r"\midrule"]
    block = [c for c in ("Task", "Heads") if c in cols]
    prev = None
    for row in display.to_dict("records"):
        key = tuple(str(row[c]) for c in block)
        if prev is not None and key != prev:
            lines.append(r"\midrule")
        prev = key
        lines.append(" & ".join(_latex(row[c]) for c in cols) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"
