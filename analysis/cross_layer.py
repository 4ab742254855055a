"""The model-level pass of the cross-layer metrics (axis ``layer_pair``, ``analysis.metrics.cross_layer``).

Every value is a pair ``(l, l2)``, ``l < l2``, of layers of the same model; the rows carry ``layer2``
(``analysis.registry.PAIR_COLUMNS``), ``head`` NA, labels ``L{l}-L{l2}``.

**Weights** (``WeightPairs``, fed one layer at a time by ``app.jobs.weight_frame``). ``W`` is a
layer's stacked ``W_K`` (``W_V``) as a ``d_model x (n_kv_heads * d_head)`` matrix: its rows, the input
dimensions, are the samples and its columns the features, so two layers compare as two
representations of the same ``d_model`` inputs (what a shared cache needs: the same input read into
the same subspace), whatever the order or rotation of their columns. Linear CKA (Kornblith et al.
2019) with the rows centred, ``Wc = H W``, ``H = I - 11^T/n``::

    CKA(W, W') = ||Wc^T Wc'||_F^2 / (||Wc^T Wc||_F ||Wc'^T Wc'||_F)
               = <G, G'>_F / (||G||_F ||G'||_F),   G = Wc Wc^T   (n x n, the row-space Gram)

The second form is what is computed: each layer keeps its ``G`` (float32, formed in float64), and
every pair's ``<G, G'>`` comes from one float32 product of the stacked Grams (``cka_matrix``:
``L^2 n^2``), never a ``p x q`` cross product per pair (``L^2 / 2`` of them for ``L`` layers); 32
random layers of ``d_model`` 4096 and 1024 kv columns: 19 s to form the Grams, 12 s for the pairs,
861 MiB peak for the whole process (2 shared CPU cores). ``n``:
all ``d_model`` rows up to ``ROW_BOUND``, and then the value is exact. Above it, ``k = ROW_BOUND``
input dimensions ``S`` drawn uniformly without replacement (seed 0, the same for every layer and
every model of that ``d_model``), the rows centred with the mean over all ``d`` of them, and each
of the three inner products estimated from ``G_SS`` by Horvitz-Thompson weighting (unbiased for
the full ``<G, G'>``)::

    <G, G'> ~ d(d-1)/(k(k-1)) sum_{i != j in S} G_ij G'_ij + d/k sum_{i in S} G_ii G'_ii

(the plain CKA of the sampled rows is not an estimate of it: its floor for unrelated matrices,
about ``p / (n + p)``, rises as rows are dropped: +0.22 at ``d_model`` 2048 sampled to 512). The
ratio's error, tests/analysis/test_cross_layer.py: within 0.015 of the exact value at ``d_model``
2048 sampled to 512 (0.009 the largest seen), on random, partly shared, anisotropic and low-rank
pairs; equal matrices read exactly 1. Chance (rule
``monte_carlo``): the same estimate for ``NULL_LAYERS`` independent Gaussian layers of the same
shapes and sampled rows, all their pairs; median and 2.5/97.5% band over those ``NULL_LAYERS
(NULL_LAYERS - 1) / 2`` pairs (one null for ``W_K`` and ``W_V``: the same shapes). Two layers
with the same ``W_K`` read 1.

**Activations** (``CacheSample``, fed by ``experiments.runnable.feed`` beside the per-layer
accumulators, with the same captured inputs ``x`` of every layer). ``TOKEN_BOUND`` tokens drawn
uniformly (seed 0) from all the sample's tokens, the same for every layer; for each layer the caches
of those tokens, ``K = x W_K + b_K`` (all kv heads side by side, un-rotated, as every activation
metric) and ``V`` likewise:

* ``xlayer_cka_kcache``, ``xlayer_cka_vcache``: linear CKA of layer ``l``'s and ``l2``'s caches over
  the sampled tokens (tokens centred), each squared norm debiased exactly as ``kv_cka_act``'s
  (``analysis.activations._debiased_cka``), from the token-space Grams ``G = Kc Kc^T``
  (``m x m``): ``||Kc^T Kc'||^2 = <G, G'>``, ``tr(Kc^T Kc) = tr G``. Against all the tokens this is
  a subsample of ``m`` of them: its sampling error is part of the jackknife interval below.
* ``xlayer_cos_adjacent`` (``l2 = l + 1`` only): MiniCache's (Liu et al. 2024, arXiv 2405.14366)
  observation that adjacent layers' KV states point alike, measured as they merge them, per token:
  ``(mean_t cos(k_t^l, k_t^{l+1}) + mean_t cos(v_t^l, v_t^{l+1})) / 2`` with ``k_t^l`` token ``t``'s
  key vector of layer ``l`` over all kv heads (``n_kv_heads * d_head``, bias included, not centred,
  before rotary positions), averaged over the sampled tokens. (MiniCache's caches are post-rotary;
  qkvscope's keys are the un-rotated ones every activation metric reads.)

Chance (rule ``random_projection``): the same metrics of the same sampled inputs projected through
independent Gaussian matrices ``N(0, 1/d_model)`` of each layer's K and V shapes, no biases (as
every activation metric's draws; ``N_RANDOM`` draws per layer, seeded per layer and draw): median
and 2.5/97.5% band, per pair, over the ``N_RANDOM^2`` pairings of a draw of one layer with a draw of the other (adjacent layers' inputs
are alike through the residual stream, so their random caches' CKA is high too; the cosine of two
independent projections is about 0). Interval: delete-one-group jackknife-t over up to
``JACK_GROUPS`` groups of the sampled tokens' windows (``analysis.intervals``), so the subsample's
error is in it; NaN with one window.

Memory: per layer the sampled inputs (``m x d_model`` float32, 32 layers of ``d_model`` 4096 at
``m = 512``: 256 MiB), each replaced at the end by the real caches' two token Grams (float64) and
the draws' ``2 N_RANDOM`` centred Grams (float32), ``m x m`` each (the same 32 layers: 384 MiB),
then, per K or V, the draws' Grams stacked in float64 for their one product (256 MiB), and the
previous layer's unit caches; the sampled inputs and the Grams are held on the CPU, the
projections and Grams formed on the device of the layer's weights (a float32 product, float64
after it). Weights: two ``n x n`` float32 Grams per layer (32 layers at ``n = 1024``: 256 MiB),
stacked once more for the pairs' product.
"""
from __future__ import annotations

import math
from functools import lru_cache

import pandas as pd
import torch

from analysis._linalg import as_float32, stack_heads
from analysis.above_chance import NULL_BAND, p_value
from analysis.registry import RESULT_COLUMNS, computed, names

#: Input dimensions (the weights' samples) behind a weight pair; above it, a uniform subsample.
ROW_BOUND = 1024
#: Sample tokens behind an activation pair (a uniform subsample of all the sample's tokens).
TOKEN_BOUND = 512
#: Independent random layers behind the weight pairs' null (all their pairs are the draws).
NULL_LAYERS = 12
#: Random projections per layer behind the activation pairs' chance.
N_RANDOM = 4
#: Most groups of windows in the activation pairs' jackknife.
JACK_GROUPS = 16
CACHE_METRICS = ("xlayer_cka_kcache", "xlayer_cka_vcache", "xlayer_cos_adjacent")


# -- the estimators ---------------------------------------------------------------
def sample_rows(n: int, bound: int = ROW_BOUND, seed: int = 0) -> torch.Tensor | None:
    """Sorted indices of ``bound`` of ``n`` rows drawn uniformly without replacement (seeded), or None
    (all rows) where ``n <= bound``."""
    if n <= bound:
        return None
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=gen)[:bound].sort().values


def sampled_gram(x: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """``Xc[S] Xc[S]^T`` of ``x: [n, c]`` centred with the mean over all ``n`` rows, at the rows ``S``
    (None: all), formed in float64, returned float32."""
    x = x.double()
    xc = x - x.mean(0, keepdim=True)
    if rows is not None:
        xc = xc[rows]
    return (xc @ xc.mT).float()


def row_gram(w: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """The centred row-space Gram of a layer's ``[heads, d_model, d_head]`` projection stacked to
    ``d_model x heads*d_head``, at the input dimensions ``rows`` (None: all; centred over all)."""
    return sampled_gram(stack_heads(as_float32(w, "cpu")), rows)


def inner(ga: torch.Tensor, gb: torch.Tensor, n: int) -> float:
    """``<G, G'>`` over all ``n`` rows estimated from the sampled Grams ``G_SS`` (``k`` rows;
    Horvitz-Thompson, module docstring); exact where ``k == n``."""
    a, b = ga.double(), gb.double()
    k = a.shape[0]
    diag = float((torch.diagonal(a) * torch.diagonal(b)).sum())
    off = float((a * b).sum()) - diag
    return (off * n * (n - 1) / (k * (k - 1)) if k > 1 else 0.0) + diag * n / k


def linear_cka(ga: torch.Tensor, gb: torch.Tensor, n: int | None = None) -> float:
    """Linear CKA ``<G, G'> / (||G|| ||G'||)`` from two centred Grams at ``k`` of ``n`` rows (``n``
    None: all rows, exact), float64; NaN for a zero Gram."""
    n = ga.shape[0] if n is None else n
    den = inner(ga, ga, n) * inner(gb, gb, n)
    return inner(ga, gb, n) / math.sqrt(den) if den > 0 else math.nan


def cka_matrix(grams: list[torch.Tensor | None], n: int) -> torch.Tensor:
    """``linear_cka`` of every pair of the Grams (``k x k`` each, at ``k`` of ``n`` rows; None: a
    layer without a value, NaN), ``[L, L]`` float64: every ``<G_a, G_b>`` from one float32 product of
    the stacked Grams (float32 sums of ``k^2`` products: ~1e-6 relative), their diagonals' products
    in float64, then the Horvitz-Thompson weighting of ``inner``."""
    have = [g for g in grams if g is not None]
    if not have:
        return torch.full((len(grams), len(grams)), math.nan, dtype=torch.float64)
    k = have[0].shape[0]
    zero = torch.zeros(k, k)
    x = torch.stack([zero if g is None else g.float() for g in grams]).flatten(1)      # [L, k^2]
    diag = torch.stack([torch.diagonal(zero if g is None else g).double() for g in grams])   # [L, k]
    full = (x @ x.mT).double()
    dd = diag @ diag.mT
    inner_ = (full - dd) * (n * (n - 1) / (k * (k - 1)) if k > 1 else 0.0) + dd * n / k
    norms = torch.diagonal(inner_).clone()
    den = norms[:, None] * norms[None, :]
    out = torch.where(den > 0, inner_ / den.clamp_min(1e-300).sqrt(), torch.full_like(den, math.nan))
    missing = torch.tensor([g is None for g in grams])
    out[missing, :] = math.nan
    out[:, missing] = math.nan
    return out


def _subset_sums(g: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For the uncentred Gram ``g [m, m]`` and 0/1 ``masks [m, k]`` (token subsets): each subset's
    row sums ``a = G w`` restricted to it ``[m, k]``, total ``s = w^T G w`` and the trace of the
    subset's centred Gram ``tr G_S - s / n_S`` ``[k]``."""
    a = (g @ masks) * masks
    s = a.sum(0)
    n = masks.sum(0)
    tr = (torch.diagonal(g)[:, None] * masks).sum(0) - s / n
    return a, s, tr


def _centred_inner(ga: torch.Tensor, gb: torch.Tensor, masks: torch.Tensor, sa, sb) -> torch.Tensor:
    """``tr(H Ga H Gb)`` over each token subset (``masks [m, k]``) from the uncentred Grams:
    ``w^T (Ga o Gb) w - 2 a.b / n + s_a s_b / n^2`` (``H`` the subset's centring)."""
    (aa, ta, _), (ab, tb, _) = sa, sb
    n = masks.sum(0)
    return ((ga * gb) @ masks * masks).sum(0) - 2 * (aa * ab).sum(0) / n + ta * tb / n.square()


def _band(null: list[float]) -> tuple[float, float, float, list[float]]:
    """Median, 2.5% and 97.5% quantiles of the finite draws, and the draws sorted."""
    t = torch.tensor(sorted(v for v in null if math.isfinite(v)), dtype=torch.float64)
    if not len(t):
        return math.nan, math.nan, math.nan, []
    lo, hi = (float(x) for x in t.quantile(torch.tensor(NULL_BAND, dtype=torch.float64)))
    return float(t.quantile(0.5)), lo, hi, t.tolist()


def _rows(items: list[tuple]) -> pd.DataFrame:
    """Result rows (``RESULT_COLUMNS`` plus ``p_null``) of ``(metric, l, l2, value, chance, lo, hi, null,
    n_tokens, ci_low, ci_high)``."""
    out = []
    for metric, l, l2, value, chance, lo, hi, null, n_tok, ci_lo, ci_hi in items:
        out.append((l, pd.NA, f"L{l}-L{l2}", metric, value, chance, n_tok, ci_lo, ci_hi, lo, hi, pd.NA, False,
                    l2, pd.NA, p_value(value, null)))
    df = pd.DataFrame(out, columns=RESULT_COLUMNS + ["p_null"])
    df["layer"] = df["layer"].astype("int64")
    for col in ("head", "n_tokens", "layer2", "head2"):
        df[col] = pd.array(df[col], dtype="Int64")
    for col in ("value", "chance", "ci_low", "ci_high", "chance_low", "chance_high", "p_null"):
        df[col] = df[col].astype("float64")
    df["above_chance"] = pd.array(df["above_chance"], dtype="boolean")
    df["degenerate"] = df["degenerate"].astype(bool)
    return df


# -- weights ---------------------------------------------------------------------
@lru_cache(maxsize=16)
def weight_null(d_model: int, width: int, seed: int = 0) -> tuple[float, ...]:
    """Sorted linear CKAs (the same estimate as the layers', at the same sampled rows) of all pairs
    of ``NULL_LAYERS`` independent Gaussian ``d_model x width`` matrices: random layers' stacked
    projections (the scale of ``N(0, 1/d_model)`` does not change a CKA)."""
    gen = torch.Generator().manual_seed(seed)
    rows = sample_rows(d_model)
    grams = [sampled_gram(torch.randn(d_model, width, generator=gen), rows) for _ in range(NULL_LAYERS)]
    return tuple(sorted(linear_cka(grams[i], grams[j], d_model)
                        for i in range(NULL_LAYERS) for j in range(i + 1, NULL_LAYERS)))


class WeightPairs:
    """The weight ``layer_pair`` metrics of one model, fed one layer at a time (module docstring)."""

    def __init__(self, skip: frozenset[str] = frozenset()):
        self.todo = [p for p in computed("weights") if p.metric.axis == "layer_pair" and p.metric.name not in skip]
        self.grams: dict[str, dict[int, torch.Tensor | None]] = {p.metric.name: {} for p in self.todo}
        self.shape: dict[int, tuple[int, int]] = {}             # layer -> (d_model, kv columns)

    def add(self, layer, meta, *, finite: bool = True) -> None:
        """Keep ``layer``'s part of every pair (its centred row Grams); a layer with non-finite
        weights (``finite=False``) gives NaN pairs."""
        d = meta.d_model
        rows = sample_rows(d)
        self.shape[layer.layer] = (d, meta.n_kv_heads * meta.d_head)
        with torch.inference_mode():
            for p in self.todo:
                self.grams[p.metric.name][layer.layer] = p.compute(layer, rows) if finite else None

    def result(self) -> tuple[pd.DataFrame, dict[str, str]]:
        """Rows of every pair of layers of the same ``d_model`` and kv width, and notes."""
        notes: dict[str, str] = {}
        items = []
        layers = sorted(self.shape)
        for p in self.todo:
            m, grams = p.metric.name, self.grams[p.metric.name]
            for shape in sorted(set(self.shape.values())):
                group = [l for l in layers if self.shape[l] == shape]
                if len(group) < 2:
                    continue
                chance, lo, hi, null = _band(list(weight_null(*shape)))
                cka = cka_matrix([grams[l] for l in group], shape[0])
                for i, l in enumerate(group):
                    for j in range(i + 1, len(group)):
                        items.append((m, l, group[j], float(cka[i, j]), chance, lo, hi, null, pd.NA, math.nan,
                                      math.nan))
            if not any(it[0] == m for it in items):
                notes[m] = "no pair of layers of the same shapes (one layer, or each of its own shapes)"
            elif any(s[0] > ROW_BOUND for s in self.shape.values()):
                notes[m] = (f"estimated from {ROW_BOUND} of the d_model input dimensions drawn uniformly (seed 0, "
                            "the same for every layer), Horvitz-Thompson weighted: within about 0.015 of the "
                            "CKA over all of them")
        order = {p.metric.name: n for n, p in enumerate(self.todo)}
        return _rows(sorted(items, key=lambda it: (order[it[0]], it[1], it[2]))), notes


# -- activations -----------------------------------------------------------------
class CacheSample:
    """The activation ``layer_pair`` metrics over the captured inputs of every layer of one run
    (module docstring). ``projections``: per layer (in the order ``add`` numbers them) ``(layer
    index, w [d_model, 2 * kv], b [2 * kv] or None, kv)`` with ``w``'s columns K then V;
    ``n_inputs`` windows of ``t`` tokens will be added in order."""

    def __init__(self, projections: list[tuple[int, torch.Tensor, torch.Tensor | None, int]], n_inputs: int,
                 t: int, *, bound: int = TOKEN_BOUND, seed: int = 0, n_random: int = N_RANDOM):
        self.proj = projections
        total = n_inputs * t
        gen = torch.Generator().manual_seed(seed)
        picks = (torch.randperm(total, generator=gen)[:bound].sort().values if total > bound
                 else torch.arange(total))
        self.picks, self.t, self.seed, self.n_random = picks, t, seed, n_random
        self.window = picks // t                                  # each sampled token's window
        self.seen = [0] * len(projections)                        # tokens added per layer
        self.x: list[list[torch.Tensor]] = [[] for _ in projections]

    def add(self, i: int, x: torch.Tensor) -> None:
        """Keep the sampled tokens of layer ``i``'s input ``x: [b, T, d_model]`` (the next ``b`` windows)."""
        flat = x.reshape(-1, x.shape[-1])
        lo, hi = self.seen[i], self.seen[i] + flat.shape[0]
        sel = self.picks[(self.picks >= lo) & (self.picks < hi)] - lo
        if len(sel):
            self.x[i].append(flat[sel.to(flat.device)].float().cpu())
        self.seen[i] = hi

    def _caches(self, i: int, draw: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``i``'s sampled K and V caches ``[m, kv]`` float64 on the projections' device: the real
        ones (``draw`` None) or random projection ``draw`` of the same inputs (drawn on the CPU, seeded
        per layer and draw, so a seed gives the same matrices on every device). The projection is a
        float32 product (as the per-layer accumulators' projection path), everything after it float64."""
        _, w, b, kv = self.proj[i]
        dev = w.device
        x = torch.cat(self.x[i]).to(dev)
        if draw is None:
            c = x @ w.detach().float()
            if b is not None:
                c = c + b.detach().float()
        else:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + 7919 * i + draw + 1)
            c = x @ (torch.randn(x.shape[1], 2 * kv, generator=gen) / math.sqrt(x.shape[1])).to(dev)
        c = c.double()
        return c[:, :kv], c[:, kv:]

    def result(self) -> tuple[pd.DataFrame, dict[str, str]]:
        """Rows of every pair of layers (``xlayer_cos_adjacent``: adjacent ones) and notes."""
        from analysis.activations import _debiased_cka  # here: activation jobs only (a weights job never loads it)

        notes: dict[str, str] = {}
        wanted = [m for m in CACHE_METRICS if m in names("activations")]
        if len(self.proj) < 2 or not all(self.x):
            for metric in wanted:
                notes[metric] = "no pair of layers: " + ("one layer" if len(self.proj) < 2 else "no sample tokens")
            return _rows([]), notes
        m = sum(len(c) for c in self.x[0])
        win = self.window[:m]
        groups = torch.unique(win)
        k = min(JACK_GROUPS, len(groups))
        group = torch.searchsorted(groups, win) * k // len(groups)         # contiguous windows per group
        masks = torch.ones(m, 1 + (k if k > 1 else 0), dtype=torch.float64)
        if k > 1:
            masks[:, 1:] = (group[:, None] != torch.arange(k)[None, :]).double()
        n_layers, n_draws = len(self.proj), self.n_random
        # real caches: the uncentred token Grams (float64), each subset's sums and self inner product
        # (the jackknife's subsets); draws: the centred Grams (float32) with their traces and squared
        # norms, all pairs of layers of two draws then one product (_null_inner)
        real: list[list[tuple]] = [[], []]                       # [K, V] per layer: (G, sums, ||Gc||^2)
        cent = [[[] for _ in range(n_draws)] for _ in range(2)]  # [K, V][draw] per layer: Gc
        stats = torch.zeros(2, n_draws, n_layers, 2, dtype=torch.float64)   # tr(Gc), ||Gc||^2
        items, prev = [], None
        idx = [p[0] for p in self.proj]
        with torch.inference_mode():
            for i in range(n_layers):
                units = []
                for draw in [None, *range(n_draws)]:
                    kc, vc = self._caches(i, draw)
                    units.append((_unit(kc), _unit(vc)))
                    for which, c in enumerate((kc, vc)):
                        g = c @ c.mT
                        if draw is None:
                            g = g.cpu()
                            sums = _subset_sums(g, masks)
                            real[which].append((g, sums, _centred_inner(g, g, masks, sums, sums)))
                        else:
                            gc = _centre(g)
                            stats[which, draw, i, 0] = float(torch.diagonal(gc).sum())
                            stats[which, draw, i, 1] = float((gc * gc).sum())
                            cent[which][draw].append(gc.float().cpu())
                self.x[i] = []                                   # the inputs are no longer needed
                if prev is not None and "xlayer_cos_adjacent" in wanted:
                    # MiniCache's per-token cosine, K and V averaged; the null pairs every draw of one
                    # layer with every draw of the other (all independent projections)
                    cos = lambda a, b: (((a[0] * b[0]).sum(1) + (a[1] * b[1]).sum(1)) / 2).cpu()   # noqa: E731
                    est = (cos(prev[0], units[0])[:, None] * masks).sum(0) / masks.sum(0)
                    null = [float(cos(a, b).mean()) for a in prev[1:] for b in units[1:]]
                    items.append(("xlayer_cos_adjacent", idx[i - 1], idx[i], *_jack(est, k), null))
                prev = units
            n_all = masks[:, :1].sum(0)
            for metric, which in (("xlayer_cka_kcache", 0), ("xlayer_cka_vcache", 1)):
                if metric not in wanted:
                    continue
                nulls = _null_cka(cent[which], stats[which], n_all)   # [n_layers, n_layers, draws^2]
                for a in range(n_layers):
                    for b in range(a + 1, n_layers):
                        (ga, sa, qa), (gb, sb, qb) = real[which][a], real[which][b]
                        est = _debiased_cka(_centred_inner(ga, gb, masks, sa, sb), qa, qb, sa[2], sb[2],
                                            masks.sum(0))
                        items.append((metric, idx[a], idx[b], *_jack(est, k), nulls[a, b].tolist()))
        order = {name: n for n, name in enumerate(CACHE_METRICS)}
        items.sort(key=lambda it: (order[it[0]], it[1], it[2]))
        rows = []
        for metric, l, l2, value, ci_lo, ci_hi, null in items:
            chance, lo, hi, srt = _band(null)
            rows.append((metric, l, l2, value, chance, lo, hi, srt, m, ci_lo, ci_hi))
        # the subsample needs no note: every row's n_tokens says how many tokens it rests on
        if k < 2:
            for metric in wanted:
                notes[metric] = "one window: no interval over windows (ci_low, ci_high empty)"
        return _rows(rows), notes


def _centre(g: torch.Tensor) -> torch.Tensor:
    """``H G H`` of a token Gram (``H = I - 11^T/m``: the tokens centred)."""
    r = g.mean(0, keepdim=True)
    return g - r - r.mT + g.mean()


def _null_cka(cent: list[list[torch.Tensor]], stats: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Debiased CKA of every pair of layers for every pairing of a draw of one with a draw of the
    other: ``cent[draw][layer]`` the centred Grams, ``stats [draw, layer, (trace, squared norm)]``;
    ``[n_layers, n_layers, draws^2]``. The cross terms ``<Gc_a, Gc_b>`` of two draws come from one
    float64 product of their stacked Grams."""
    from analysis.activations import _debiased_cka  # here: activation jobs only (a weights job never loads it)

    draws = len(cent)
    stacked = [torch.stack(c).flatten(1).double() for c in cent]          # per draw [L, m^2]
    out = []
    for i in range(draws):
        for j in range(draws):
            cross = stacked[i] @ stacked[j].mT                            # [L, L]
            ti, qi = stats[i, :, 0][:, None], stats[i, :, 1][:, None]
            tj, qj = stats[j, :, 0][None, :], stats[j, :, 1][None, :]
            out.append(_debiased_cka(cross, qi.expand_as(cross), qj.expand_as(cross), ti, tj, n))
    return torch.stack(out, -1)


def _unit(c: torch.Tensor) -> torch.Tensor:
    """``c``'s rows scaled to unit length (a zero row stays zero)."""
    return c / c.norm(dim=1, keepdim=True).clamp_min(1e-300)


def _jack(est: torch.Tensor, k: int) -> tuple[float, float, float]:
    """Value and 95% delete-one-group jackknife-t interval from ``est`` ``[1 + k]`` (all tokens, then
    each group left out); NaN interval with one group. The value is the all-token estimate."""
    from analysis.intervals import t_quantile  # here: activation jobs only, as _debiased_cka above

    value = float(est[0])
    if k < 2:
        return value, math.nan, math.nan
    reps = est[1:]
    se = math.sqrt((k - 1) / k * float(((reps - reps.mean()) ** 2).sum()))
    q = t_quantile(k - 1)
    return value, value - q * se, value + q * se
