"""Chance level of every weight-level metric: what independent random projections of the same shapes read.

A value means little without the value random matrices of the same shapes give
(``kv_share_r2`` = 0.25 is chance for ``d_head / d_model`` = 1/4). The chance
level of a metric is the metric of a **random layer**: i.i.d. Gaussian
``W_Q: [n_heads, d_model, d_head]`` (None for a query-free model: its identity
query is not a projection, and ``weight_metrics`` uses the identity slices as
for the real model), ``W_K`` and ``W_V: [n_kv_heads, d_model, d_head]`` drawn
independently (also for a K=V model: chance is what *untied* random projections
give), ``W_O: [n_heads, d_head, d_model]``, no biases, the model's norm type (so
the same metrics exist). Where the distribution of the metric over such layers
is known, the chance level is its closed form; otherwise it is the median over
seeded draws (and over heads, for per-head metrics) of ``weight_metrics`` on
random layers. ``d = d_model``, ``e = d_head``, ``h = n_heads``, ``g = n_kv_heads``.

Which of these a metric gets is its registry row's ``chance`` rule
(``analysis.registry.Metric``): ``closed`` (its closed form where it holds for
the geometry, else Monte Carlo), ``monte_carlo`` or ``none``; its one-line
description is the row's ``chance_help`` (``WEIGHT_CHANCE`` reads it). The closed
forms are declared beside their formulas, built-in and plugin alike
(``registry.register(..., closed_form=)``; the built-in ones with their derivations
in ``analysis/metrics/``: ``kv_similarity`` (``kv_cosine_flat`` 0, ``kv_share_r2``
e/d), ``qk_geometry`` (``qk_symmetry`` (1 + 1/d)/2, ``qk_directionality`` 0 except
query-free grouped-query layers), ``paper_scale`` (the same on the paper's scale),
``query_absorb`` (``wq_condition`` and ``wq_basis_orth_defect`` of a square stack));
each is checked against Monte Carlo in ``tests/analysis/test_chance.py``. A
``monte_carlo`` metric gets the median of its own ``compute`` over the random
layers, since ``weight_metrics`` runs every registered metric on them as on any
layer. Random layers spread widely about some closed forms: the directionality
over ``[-1, 1]`` at ``d = 32..64``, quartiles about +-0.15 at GPT-2's shapes.

Every chance level is a distribution: the draws (at least ``MIN_DRAWS`` random layers of
the model's shapes, more, of the per-layer values not yet stable only, while a per-layer
median is not stable, then per-head values from wide random layers of ``WIDE_HEADS``
independent heads (query-free models' W_Q metrics: query-free layers of ``d_model / d_head``
heads) until each per-head median is stable, ``stable``) give the null band ``chance_low``/``chance_high`` (2.5% and 97.5%
quantiles) of every row, closed forms included, and the p-values of
``analysis.above_chance``. ``how`` names the values behind each level and, where a median
did not reach the 1% stability within the caps, its standard error.
A per-layer metric with an exact sampler of its null cheaper than a random layer
(``registry.Plugin.null_draws``: the directionality of query-free grouped-query layers, from
the stacked W_K's norms alone) takes its draws past ``MIN_DRAWS`` from it, up to
``MAX_NULL_BATCHES`` batches.

No chance level (NaN; rule ``none``): ``norm_q``, ``norm_k``, ``norm_v``, ``norm_o``: a norm
measures the scale itself, which random matrices of any scale match.

Cost: a chance level depends on the shapes, the norm type, whether the model is
query-free, the device type and the seed, never on the layer, so it is computed
once per such key and kept for the process (``lru_cache``). The ``MIN_DRAWS`` full
draws cost about as many layers of ``weight_metrics`` (the stacked-W_Q LU and the
layer's ``M`` of a random layer included, for the closed-form metrics' bands); later
draws leave those out and cost the head-space Grams only. Measured on the demo's
multi-query checkpoint (4 layers, d_model 128, 4 heads of 32), the whole ``analyze``
of its weights took about 2x the CPU time of the 4-16 draws without bands, which
this replaced.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import pandas as pd
import torch

from analysis import registry
from analysis.above_chance import p_value
from analysis.degenerate import add_note
from analysis.errors import AnalysisError
from analysis.registry import COLUMNS, PAIR_COLUMNS, RESULT_COLUMNS, with_pair_columns
from analysis.layer import AttentionWeights
# the closed forms live beside their formulas (analysis.metrics); these two are named here too
from analysis.metrics.query_absorb import square_condition_median, square_orth_defect_mean  # noqa: F401
from analysis.weights import MetaLike, default_device, weight_metrics

class _ChanceTexts(Mapping):
    """metric -> its chance level in one line (docs/guide/metrics.md, the pages): each weight metric's ``chance_help``,
    read from the registry when asked, so a plugin registered later is in it too."""

    def __getitem__(self, name: str) -> str:
        m = registry.BY_NAME.get(name)
        if m is None or m.level != "weights":
            raise KeyError(name)
        return m.chance_help

    def __iter__(self):
        return iter(registry.names("weights"))

    def __len__(self) -> int:
        return len(registry.names("weights"))


#: metric -> its chance level in one line (``analysis.registry.Metric.chance_help``). Details: module docstring.
WEIGHT_CHANCE: Mapping[str, str] = _ChanceTexts()
_CLOSED = "closed form"


@dataclass(frozen=True)
class _Geometry:
    """The ``MetaLike`` fields of a random layer (the variant: independent projections)."""

    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    norm: str
    variant: str = "qkv"


def random_layer(geo: MetaLike, *, query_free: bool, generator: torch.Generator,
                 device: str | torch.device = "cpu") -> AttentionWeights:
    """i.i.d. ``N(0, 1/d_model)`` projections of ``geo``'s shapes, drawn on the CPU from
    ``generator`` (deterministic) and moved to ``device``. Each projection is stored
    as a loader stores it (per head transposed, the rows of an ``nn.Linear``
    weight), so the analysis reads it as it reads a checkpoint's."""
    h, g, d, e = geo.n_heads, geo.n_kv_heads, geo.d_model, geo.d_head
    scale = d ** -0.5

    def rows(heads: int) -> torch.Tensor:       # [heads*e, d] weight -> [heads, d, e], per head transposed
        w = torch.randn(heads * e, d, generator=generator) * scale
        return w.view(heads, e, d).mT.to(device)

    w_q = None if query_free else rows(h)
    w_k, w_v = rows(g), rows(g)
    w_o = (torch.randn(d, h * e, generator=generator) * scale).mT.reshape(h, e, d).to(device)  # [h, e, d]
    return AttentionWeights(0, w_q, w_k, w_v, w_o)


#: Random layers of the model's own shapes behind every weight chance level: at least ``MIN_DRAWS``
#: (every metric, the closed-form ones too, so each has a null band), then more while a per-layer
#: Monte Carlo median is not stable (``stable``), at most ``MAX_DRAWS``; past ``MIN_DRAWS`` a draw
#: computes only the per-layer values whose median is not yet stable (``weight_metrics(skip=, heads=False)``),
#: so it costs the products those read.
MIN_DRAWS, MAX_DRAWS = 24, 512
#: Per-head rows then get more draws from *wide* random layers: ``WIDE_HEADS`` independent heads of
#: the same ``d_model`` and ``d_head`` (multi-head, nothing per layer computed), whose per-head
#: values have the same distribution as the model's own heads (each head's W_Q, W_K, W_V, W_O are
#: independent Gaussians either way); until every per-head median is stable, at most
#: ``MAX_HEAD_SAMPLES`` values per metric. A wide draw costs the head-space Grams of its heads only.
WIDE_HEADS, MAX_HEAD_SAMPLES = 64, 8192
#: "Stable": the median's standard error at most this fraction of ``max(|median|, band width)``, so
#: that two independent sets of draws (another seed, another variant of the same shapes) give medians
#: within 1% of each other 95% of the time (``1.96 * sqrt(2) * 0.0036 = 0.01``).
STABLE = 0.0036
#: Per-layer metrics with an exact sampler cheaper than a random layer (``registry.Plugin.null_draws``,
#: e.g. the directionality of query-free grouped-query layers) take their draws past ``MIN_DRAWS``
#: from it, batch by batch while the median is not stable, at most this many batches.
MAX_NULL_BATCHES = 32
#: Quantiles of the null band (``chance_low``, ``chance_high``).
BAND = (0.025, 0.975)


def median_se(values: torch.Tensor) -> float:
    """Standard error of the median of the sorted float64 ``values`` from its order statistics:
    half the distance between ranks ``n/2 -+ sqrt(n)/2`` (the median's rank has binomial standard
    deviation ``sqrt(n)/2``; distribution-free, right for integer-valued metrics too). inf for n < 4."""
    n = len(values)
    if n < 4:
        return math.inf
    half = math.sqrt(n) / 2
    lo, hi = max(0, math.floor(n / 2 - half)), min(n - 1, math.ceil(n / 2 + half))
    return float(values[hi] - values[lo]) / 2


def stable(values: torch.Tensor) -> bool:
    """Whether the median of the sorted ``values`` is stable to 1% (``STABLE``): ``median_se`` at most
    ``STABLE * max(|median|, q97.5 - q2.5)`` (the band's width stands in for a median near 0)."""
    if len(values) < 4:
        return False
    med = float(values.quantile(0.5))
    lo, hi = (float(x) for x in values.quantile(torch.tensor(BAND, dtype=torch.float64)))
    return median_se(values) <= STABLE * max(abs(med), hi - lo)


#: Where chance rows outlive the process (``use_store``), or None: the process's memo only.
_STORE = None


def use_store(store) -> None:
    """Keep chance rows beyond this process in ``store`` (None: the process's memo only): an object
    with ``get(key) -> rows | None`` and ``put(key, rows)``, ``key`` the geometry, device type and
    seed of ``_chance_rows`` plus the names of the registered weight metrics (a plugin switched on
    or off is another key), ``rows`` its tuple of rows. The rows are a deterministic function of the
    key and the code that draws them, so a store that also keys on that code (``loaders.chance_cache``)
    returns exactly what drawing again would."""
    global _STORE
    _STORE = store
    _chance_rows.cache_clear()


@lru_cache(maxsize=64)
def _chance_rows(n_heads: int, n_kv_heads: int, d_model: int, d_head: int, norm: str, query_free: bool,
                 device_type: str, seed: int, generation: int) -> tuple[tuple, ...]:
    """``(metric, whole, chance, how, low, high, null)`` for one geometry and registry ``generation``
    (a plugin registered since gets a fresh entry), ``null`` the sorted finite draws (a tuple);
    immutable, so the cache can share it. Read from the ``use_store`` store where it holds them."""
    key = (n_heads, n_kv_heads, d_model, d_head, norm, query_free, device_type, seed,
           tuple(sorted(p.metric.name for p in registry.computed("weights"))))
    rows = None if _STORE is None else _STORE.get(key)
    if rows is None:
        rows = _draw_rows(n_heads, n_kv_heads, d_model, d_head, norm, query_free, device_type, seed)
        if _STORE is not None:
            _STORE.put(key, rows)
    return rows


def _draw_rows(n_heads: int, n_kv_heads: int, d_model: int, d_head: int, norm: str, query_free: bool,
               device_type: str, seed: int) -> tuple[tuple, ...]:
    """The rows of ``_chance_rows``, drawn."""
    geo = _Geometry(n_heads, n_kv_heads, d_model, d_head, norm)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    samples: dict[tuple[str, bool], list[float]] = {}
    rules: dict[str, str] = {}
    closed: dict[str, float | None] = {}

    def add(frame: pd.DataFrame, *, heads_only: bool) -> None:
        whole = frame["head"].isna().tolist()
        for metric, w, value in zip(frame["metric"], whole, frame["value"]):
            if heads_only and (w or (metric, w) not in samples):
                continue
            samples.setdefault((metric, w), [])
            if math.isfinite(value):
                samples[(metric, w)].append(float(value))

    def unstable(whole: bool, among: set[str] | None = None) -> set[str]:
        """Monte Carlo metrics of per-layer (``whole``) or per-head rows whose median is not yet stable;
        ``among``: only these (the others got no draws since they were last found stable)."""
        return {m for (m, w), vals in samples.items() if w == whole and rules[m] != "none"
                and (among is None or m in among)
                and closed.get(m) is None and not (not w and len(vals) >= MAX_HEAD_SAMPLES)
                and not stable(torch.tensor(sorted(vals), dtype=torch.float64))}

    every = frozenset(p.metric.name for p in registry.computed("weights"))
    n, skip = 0, frozenset()
    while True:                                          # the model's own shapes
        frame, _notes = weight_metrics(random_layer(geo, query_free=query_free, generator=gen,
                                                    device=device_type), geo, device=device_type, skip=skip,
                                       heads=n < MIN_DRAWS)
        n += 1
        add(frame, heads_only=False)
        if not rules:
            rules = {metric: registry.BY_NAME[metric].chance for metric, _ in samples}
            closed = {m: registry.closed_form(m, geo, query_free) for m, r in rules.items() if r == "closed"}
            exact = {m for m, w in samples if w and rules[m] != "none" and closed.get(m) is None
                     and registry.null_draws(m, geo, query_free, seed, 0) is not None}
        if n < MIN_DRAWS:
            continue
        todo = unstable(whole=True, among=None if n == MIN_DRAWS else todo) - exact
        if not todo or n >= MAX_DRAWS:
            break
        skip = every - todo                              # later draws: the unstable per-layer metrics only
    for m in exact:                                      # per-layer values with a cheaper exact sampler
        batch = 0
        while unstable(whole=True, among={m}) and batch < MAX_NULL_BATCHES:
            samples[(m, True)].extend(v for v in registry.null_draws(m, geo, query_free, seed, batch).tolist()
                                      if math.isfinite(v))
            batch += 1
    # per-head rows: wide layers of independent heads; a query-free model's metrics of W_Q read identity
    # slices, which random W_Q do not stand in for: those get query-free layers of d_model / d_head heads
    own = {m for m, _ in samples if "Q" in registry.BY_NAME[m].reads} if query_free else set()
    shapes = [(_Geometry(WIDE_HEADS, WIDE_HEADS, d_model, d_head, norm), False, lambda m: m not in own)]
    if own and d_model % d_head == 0:
        shapes.append((_Geometry(d_model // d_head, d_model // d_head, d_model, d_head, norm), True,
                       lambda m: m in own))
    # the closed-form per-head metrics ride along: their null bands (the p-values of analysis.above_chance)
    # get the same wide draws
    banded = {m for (m, w) in samples if not w and closed.get(m) is not None}
    todo = None
    while todo := unstable(whole=False, among=todo):
        before = {m: len(samples[(m, False)]) for m in todo}
        for shape, free, mine in shapes:
            want = {m for m in todo | banded if mine(m)}
            if not want:
                continue
            try:
                frame, _notes = weight_metrics(random_layer(shape, query_free=free, generator=gen,
                                                            device=device_type),
                                               shape, device=device_type, skip=every - want, whole=False)
            except AnalysisError:                        # a plugin that cannot take these shapes: own draws only
                continue
            add(frame, heads_only=True)
        if all(len(samples[(m, False)]) == k for m, k in before.items()):
            break                                        # e.g. a plugin's metric absent from a wide layer
    rows = []
    for (metric, whole), values in samples.items():
        null = torch.tensor(sorted(values), dtype=torch.float64)
        if rules[metric] == "none" or not len(null):
            rows.append((metric, whole, math.nan, "none" if rules[metric] == "none" else "no finite draw",
                         math.nan, math.nan, ()))
            continue
        lo, hi = (float(x) for x in null.quantile(torch.tensor(BAND, dtype=torch.float64)))
        drawn = f"{len(null)} Gaussian {'draws' if whole else 'heads'}"
        if closed.get(metric) is not None:
            chance, how = closed[metric], f"{_CLOSED}; band of {drawn}"
        else:
            chance = float(null.quantile(0.5))                   # midpoint median
            how = f"median of {drawn}" + ("" if stable(null) else
                                          f" (median's standard error {median_se(null):.2g}: not stable to 1%)")
        rows.append((metric, whole, chance, how, lo, hi, tuple(null.tolist())))
    return tuple(rows)


def weight_chance(meta: MetaLike, *, query_free: bool, device: str | torch.device | None = None,
                  seed: int = 0) -> pd.DataFrame:
    """Chance level and null band of every weight metric ``weight_metrics`` gives for ``meta``'s geometry.

    One row per ``(metric, whole)``: columns ``metric``, ``whole`` (True: the
    per-layer row, ``head`` None), ``chance`` (NaN where none), ``how``
    (``closed form; band of N Gaussian heads``, ``median of N Gaussian heads``,
    ``median of N Gaussian draws`` for a per-layer value, N the values behind it,
    with the median's standard error where it is not stable to 1%, or ``none``: the
    row's rule, whose reason is the registry's ``chance_help``), ``chance_low`` and
    ``chance_high`` (the 2.5% and 97.5% quantiles of the draws: the null band) and
    ``null`` (the sorted finite draws, a tuple: ``analysis.above_chance``'s p-values).
    ``query_free``: the model has no W_Q (identity queries). Deterministic for a
    given ``seed`` and device type; cached per geometry (and registry generation) for the process.
    """
    dev = torch.device(device or default_device())
    rows = _chance_rows(int(meta.n_heads), int(meta.n_kv_heads), int(meta.d_model), int(meta.d_head),
                        str(meta.norm), bool(query_free), dev.type, int(seed), registry.generation())
    return pd.DataFrame(list(rows), columns=["metric", "whole", "chance", "how", "chance_low", "chance_high",
                                             "null"])


def attach_weight_chance(frame: pd.DataFrame, meta: MetaLike, *, query_free: bool,
                         device: str | torch.device | None = None,
                         notes: dict[str, str] | None = None) -> pd.DataFrame:
    """``frame`` (``analysis.registry.COLUMNS``, e.g. ``weight_metrics``' frame over any
    layers of one model, with its ``degenerate`` column where it has one) as result rows
    (``RESULT_COLUMNS``) plus ``p_null``: ``chance``, ``chance_low``, ``chance_high`` from
    ``weight_chance`` by ``(metric, head is NA)`` (NaN for a metric without one),
    ``p_null`` the value's two-sided p-value against the draws (``above_chance.p_values``),
    ``n_tokens`` (Int64), ``ci_low`` and ``ci_high`` NA (weight metrics are not sampled),
    ``above_chance`` NA until ``above_chance.flag`` tests the whole family, ``degenerate``
    False unless ``frame`` says so. ``frame`` itself is not modified. ``notes``: gets, for each of
    ``frame``'s metrics whose chance median is not stable to 1% within the draws' cap, the draws
    behind it and the median's standard error (``weight_chance``'s ``how``)."""
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise AnalysisError(f"attach_weight_chance: expected a frame with columns {COLUMNS}, "
                            f"missing {missing}")
    table = weight_chance(meta, query_free=query_free, device=device)
    lookup = {(m, bool(w)): (c, lo, hi, null) for m, w, c, lo, hi, null in
              zip(table["metric"], table["whole"], table["chance"], table["chance_low"], table["chance_high"],
                  table["null"])}
    if notes is not None:
        shown = set(frame["metric"])
        for m, w, how in zip(table["metric"], table["whole"], table["how"]):
            if m in shown and "not stable" in how:
                add_note(notes, m, f"chance level{' per layer' if w else ' per head'}: {how}")
    out = with_pair_columns(frame[COLUMNS + [c for c in PAIR_COLUMNS if c in frame.columns]])
    whole = out["head"].isna().tolist()
    found = [lookup.get((m, w), (math.nan, math.nan, math.nan, ())) for m, w in zip(out["metric"], whole)]
    for i, col in enumerate(("chance", "chance_low", "chance_high")):
        out[col] = pd.Series([f[i] for f in found], index=out.index, dtype="float64")
    out["n_tokens"] = pd.Series(pd.NA, index=out.index, dtype="Int64")
    out["ci_low"] = pd.Series(math.nan, index=out.index, dtype="float64")
    out["ci_high"] = pd.Series(math.nan, index=out.index, dtype="float64")
    out["above_chance"] = pd.Series(pd.NA, index=out.index, dtype="boolean")
    out["degenerate"] = (frame["degenerate"].fillna(False).astype(bool) if "degenerate" in frame.columns
                         else pd.Series(False, index=out.index, dtype=bool))
    out["p_null"] = pd.Series([p_value(v, f[3]) for v, f in zip(out["value"], found)], index=out.index,
                              dtype="float64")
    return out[RESULT_COLUMNS + ["p_null"]]
