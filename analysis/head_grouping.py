"""Pooling a layer's kv heads into G groups: the mean-pool residual of a grouping, and the best grouping.

GQA uptraining (Ainslie et al. 2023, "GQA: Training Generalized Multi-Query
Transformer Models from Multi-Head Checkpoints", arXiv 2305.13245, section 2.1)
turns ``n`` kv heads into ``G`` by replacing each group's ``W_K`` (and ``W_V``) with
the group's mean. What a head loses is its **mean-pool residual**

    ``r_h = ||W_K[h] - mean_{j in g(h)} W_K[j]||_F / ||W_K[h]||_F``

(0: the head equals its group's mean, i.e. the group's heads are equal; about
``sqrt(1 - 1/s)`` for ``s`` unrelated heads of equal norm). It needs only the
Frobenius Gram ``F_ij = <W_K[i], W_K[j]>_F`` (``n x n``, float64): for a group ``g``
of ``s`` heads, ``||W_h - m_g||^2 = F_hh - (2/s) sum_{j in g} F_hj + (1/s^2) sum_{i,j in g} F_ij``.

A grouping's **cost** is the mean of ``r_h`` over the layer's heads (the value
reported); it is a sum over groups, so a group's cost is computed once. Groups have
equal sizes ``s = n / G`` (what a GQA layer is). Two kinds:

* ``contiguous``: heads ``[g s, (g+1) s)`` form group ``g``: what ``analysis.conversion.gqa``
  pools by default (the only equal contiguous grouping, so also the best one).
* ``free``: any partition into ``G`` groups of ``s`` heads, the one of least cost. There are
  ``n! / ((s!)^G G!)`` of them (``partition_count``): searched exhaustively where that is at
  most ``EXACT_MAX``, else by a heuristic (``exact`` False): **greedy** (repeatedly the
  cheapest pair of unassigned heads seeds a group, grown by the head that adds least cost)
  then **local swaps** (exchange two heads of different groups while the best exchange lowers
  the cost; every pair of groups is tried, until no exchange helps or ``MAX_SWEEPS``), and the
  same swaps from the contiguous grouping; the better is kept, so ``free`` never costs more than
  ``contiguous``. The heuristic's result is a local optimum, tested against the exhaustive search
  on small ``n`` (``tests/analysis/test_head_grouping.py``): on random Gaussian heads (the hardest
  case: every grouping costs about the same) it found the exhaustive optimum in 43 to 50 of 50
  layers for ``n`` = 6 to 10, at most 1.2% above it; planted groups it finds exactly. Its cost
  grows about as ``n^3`` (0.1 s of CPU for 32 heads into 16 pairs, 0.6 s for 64).

Merging after an optimal rotation of each head (align-then-merge, Jin et al. 2024,
arXiv 2412.20677; ``analysis.conversion.gqa`` method ``aligned``) lowers the residual by
what a rotation within the head's space can explain; ``xhead_sim_k_aligned``
(``analysis.metrics.cross_head``) measures that similarity. This module groups the weights
as they are, as GQA's mean-pooling does.

``group_counts(n)``: ``n/2``, ``n/4`` and ``1`` where they divide ``n`` into groups of two
or more heads (``default_groups(n)``: the mildest pooling, ``n / p`` for ``p`` the smallest
prime factor of ``n``, e.g. ``n/2`` for an even count, which ``gqa_pool_residual`` reports).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

#: Free groupings are searched exhaustively where there are at most this many partitions.
EXACT_MAX = 1000
#: Cap on the heuristic's sweeps over pairs of groups.
MAX_SWEEPS = 50
KINDS = ("contiguous", "free")


@dataclass(frozen=True)
class Grouping:
    """A partition of a layer's ``n`` kv heads into ``G`` groups of equal size and its residuals.

    ``groups``: the groups as sorted tuples of head indices, sorted by their first head;
    ``residuals``: ``r_h`` per head (module docstring), ``[n]`` float64; ``cost``: their mean;
    ``kind``: ``contiguous`` or ``free``; ``exact``: the free grouping was searched exhaustively
    (always True for ``contiguous``)."""

    groups: tuple[tuple[int, ...], ...]
    residuals: np.ndarray
    cost: float
    kind: str
    exact: bool

    @property
    def n_groups(self) -> int:
        return len(self.groups)

    def order(self) -> list[int]:
        """The heads group after group: the permutation that makes this grouping contiguous."""
        return [h for g in self.groups for h in g]


def frobenius_gram(w) -> np.ndarray:
    """``F_ij = <W[i], W[j]>_F`` of a stack ``[n, rows, cols]`` (a torch tensor or array), float64."""
    a = np.asarray(w.detach().cpu().double().numpy() if hasattr(w, "detach") else w, dtype=np.float64)
    flat = a.reshape(a.shape[0], -1)
    return flat @ flat.T


def _check(f: np.ndarray, groups: int) -> int:
    f = np.asarray(f)
    if f.ndim != 2 or f.shape[0] != f.shape[1]:
        raise ValueError(f"head grouping: expected a square Frobenius Gram [n, n], found shape {f.shape}")
    n = f.shape[0]
    if groups < 1 or n % groups:
        raise ValueError(f"head grouping: {n} heads cannot form {groups} groups of equal size "
                         f"(expected a divisor of {n})")
    return n


def residuals(f: np.ndarray, groups) -> np.ndarray:
    """``r_h`` per head (module docstring) for ``groups`` (sequences of head indices covering
    ``0..n-1``) from the Frobenius Gram ``f``; NaN for an all-zero head."""
    f = np.asarray(f, dtype=np.float64)
    out = np.full(f.shape[0], np.nan)
    for g in groups:
        out[np.asarray(g, dtype=int)] = residuals_of(f, g)
    return out


def _group_cost(f: np.ndarray, g: tuple[int, ...]) -> float:
    return float(np.nansum(residuals_of(f, g)))


def residuals_of(f: np.ndarray, g) -> np.ndarray:
    """``r_h`` of the heads of one group ``g`` (in its order)."""
    idx = np.asarray(g, dtype=int)
    s = len(idx)
    sub = f[np.ix_(idx, idx)]
    d2 = np.diag(sub) - 2.0 / s * sub.sum(1) + sub.sum() / s**2
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(np.clip(d2, 0.0, None) / np.diag(sub))


def contiguous(n: int, groups: int) -> tuple[tuple[int, ...], ...]:
    """Heads ``[g s, (g+1) s)`` as group ``g`` (``s = n / groups``)."""
    s = n // groups
    return tuple(tuple(range(g * s, (g + 1) * s)) for g in range(groups))


def partition_count(n: int, groups: int) -> int:
    """Partitions of ``n`` heads into ``groups`` unordered groups of ``n / groups``: ``n! / ((s!)^G G!)``."""
    s = n // groups
    return math.factorial(n) // (math.factorial(s) ** groups * math.factorial(groups))


def partitions(n: int, groups: int):
    """Every partition of ``0..n-1`` into ``groups`` groups of equal size, each once (the group
    holding the lowest unassigned head is chosen first)."""
    s = n // groups

    def rest(left: tuple[int, ...]):
        if not left:
            yield ()
            return
        first, others = left[0], left[1:]
        for mates in itertools.combinations(others, s - 1):
            g = (first, *mates)
            remaining = tuple(h for h in others if h not in mates)
            for tail in rest(remaining):
                yield (g, *tail)

    yield from rest(tuple(range(n)))


def _canonical(groups) -> tuple[tuple[int, ...], ...]:
    return tuple(sorted(tuple(sorted(int(h) for h in g)) for g in groups))


def _make(f: np.ndarray, groups, kind: str, exact: bool) -> Grouping:
    groups = _canonical(groups)
    r = residuals(f, groups)
    return Grouping(groups, r, float(np.nanmean(r)) if np.isfinite(r).any() else math.nan, kind, exact)


def _exhaustive(f: np.ndarray, groups: int):
    cache: dict[tuple[int, ...], float] = {}
    best, best_cost = None, math.inf
    for p in partitions(f.shape[0], groups):
        cost = 0.0
        for g in p:
            if g not in cache:
                cache[g] = _group_cost(f, g)
            cost += cache[g]
        if cost < best_cost - 1e-12:
            best, best_cost = p, cost
    return best


def pair_costs(f: np.ndarray) -> np.ndarray:
    """``[n, n]``: the cost ``r_i + r_j`` of heads ``i`` and ``j`` pooled as a group of two,
    ``r_i = ||W_i - W_j||_F / (2 ||W_i||_F)`` (inf on the diagonal)."""
    d = np.diag(f)
    dist = np.sqrt(np.clip(d[:, None] - 2 * f + d[None, :], 0.0, None))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = dist / (2 * np.sqrt(d))[:, None] + dist / (2 * np.sqrt(d))[None, :]
    np.fill_diagonal(out, np.inf)
    return np.nan_to_num(out, nan=np.inf)


def _greedy(f: np.ndarray, groups: int) -> list[list[int]]:
    n = f.shape[0]
    s = n // groups
    pc = pair_costs(f)
    left = np.ones(n, dtype=bool)
    out = []
    while left.any():
        sub = np.where(left[:, None] & left[None, :], pc, np.inf)
        i, j = np.unravel_index(int(np.argmin(sub)), sub.shape)
        g = [int(i), int(j)]
        left[g] = False
        while len(g) < s:
            h = min(np.flatnonzero(left).tolist(), key=lambda h: _group_cost(f, (*g, h)))
            g.append(h)
            left[h] = False
        out.append(g)
    return out


def _swaps(f: np.ndarray, groups: list[list[int]]) -> list[list[int]]:
    """Local search: the best exchange of two heads between two groups, while it lowers the cost."""
    cost = [_group_cost(f, g) for g in groups]
    for _ in range(MAX_SWEEPS):
        improved = False
        for x, y in itertools.combinations(range(len(groups)), 2):
            best, move = 1e-12, None
            for i, a in enumerate(groups[x]):
                for j, b in enumerate(groups[y]):
                    gx = groups[x][:i] + [b] + groups[x][i + 1:]
                    gy = groups[y][:j] + [a] + groups[y][j + 1:]
                    cx, cy = _group_cost(f, gx), _group_cost(f, gy)
                    gain = cost[x] + cost[y] - cx - cy
                    if gain > best:
                        best, move = gain, (gx, gy, cx, cy)
            if move is not None:
                groups[x], groups[y], cost[x], cost[y] = move
                improved = True
        if not improved:
            break
    return groups


def best_grouping(f: np.ndarray, groups: int, kind: str = "free", *, exact_max: int = EXACT_MAX) -> Grouping:
    """The ``kind`` grouping (``contiguous`` or ``free``, module docstring) of least cost into
    ``groups`` groups, from the Frobenius Gram ``f`` ``[n, n]``. ``exact_max``: search free
    groupings exhaustively up to this many partitions (0: always the heuristic)."""
    f = np.asarray(f, dtype=np.float64)
    n = _check(f, groups)
    if kind not in KINDS:
        raise ValueError(f"head grouping: unknown kind {kind!r}: expected one of {', '.join(KINDS)}")
    if kind == "contiguous" or groups in (1, n):
        return _make(f, contiguous(n, groups), kind, True)
    if partition_count(n, groups) <= exact_max:
        return _make(f, _exhaustive(f, groups), kind, True)
    starts = (_greedy(f, groups), [list(g) for g in contiguous(n, groups)])
    return min((_make(f, _swaps(f, s), kind, False) for s in starts), key=lambda g: g.cost)


def group_counts(n: int) -> list[int]:
    """The group counts reported for ``n`` kv heads: ``n/2``, ``n/4``, ``1`` and ``default_groups(n)``,
    those that divide ``n`` into groups of two or more heads, largest first."""
    if n < 2:
        return []
    want = {n // 2 if n % 2 == 0 else None, n // 4 if n % 4 == 0 else None, 1, default_groups(n)}
    return sorted((g for g in want if g is not None and g < n and n % g == 0), reverse=True)


def default_groups(n: int) -> int:
    """``n / p`` for ``p`` the smallest prime factor of ``n`` (``n/2`` for an even count): the mildest
    pooling into equal groups; 1 for ``n < 2`` (nothing to pool)."""
    if n < 2:
        return 1
    p = next(p for p in range(2, n + 1) if n % p == 0)
    return n // p


def groupings(f: np.ndarray, *, exact_max: int = EXACT_MAX) -> list[Grouping]:
    """The contiguous and the best free grouping for every ``group_counts(n)``, in that order."""
    f = np.asarray(f, dtype=np.float64)
    return [best_grouping(f, g, kind, exact_max=exact_max) for g in group_counts(f.shape[0]) for kind in KINDS]


def table(found: list[Grouping]) -> list[dict]:
    """``groupings``' result as JSON-able rows: ``groups`` (G), ``kind``, ``exact``, ``cost``
    (the mean residual), ``max_residual``, ``grouping`` (the groups as lists)."""
    return [{"groups": g.n_groups, "kind": g.kind, "exact": g.exact, "cost": g.cost,
             "max_residual": float(np.nanmax(g.residuals)) if np.isfinite(g.residuals).any() else math.nan,
             "grouping": [list(x) for x in g.groups]} for g in found]
