"""Grouping kv heads for mean-pooling (``analysis.head_grouping``): residuals against numpy, the
partitions, the heuristic against exhaustive search, planted groups, and the reported group counts."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from analysis import head_grouping as hg


def heads(n, d=24, e=4, seed=0):
    return np.random.default_rng(seed).standard_normal((n, d, e))


def clustered(n_groups, size, seed=0, noise=0.05):
    """``n_groups * size`` heads, each a small perturbation of its cluster's centre, in shuffled order;
    returns the heads and the planted grouping."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_groups, 24, 4))
    order = rng.permutation(n_groups * size)
    w = np.empty((n_groups * size, 24, 4))
    planted = [[] for _ in range(n_groups)]
    for slot, h in enumerate(order):
        c = slot // size
        w[h] = centres[c] + noise * rng.standard_normal((24, 4))
        planted[c].append(int(h))
    return w, tuple(sorted(tuple(sorted(g)) for g in planted))


def test_residuals_equal_the_direct_float64_formula():
    w = heads(6)
    groups = [(0, 3, 4), (1, 2, 5)]
    got = hg.residuals(hg.frobenius_gram(w), groups)
    for g in groups:
        m = w[list(g)].mean(0)
        for h in g:
            assert got[h] == pytest.approx(np.linalg.norm(w[h] - m) / np.linalg.norm(w[h]), rel=1e-10)


def test_partitions_are_every_equal_grouping_once():
    for n, g in ((4, 2), (6, 3), (6, 2), (8, 4), (8, 2)):
        got = [hg._canonical(p) for p in hg.partitions(n, g)]
        assert len(got) == len(set(got)) == hg.partition_count(n, g)
        assert all(sorted(itertools.chain(*p)) == list(range(n)) and {len(x) for x in p} == {n // g} for p in got)
    assert hg.partition_count(8, 4) == 105 and hg.partition_count(16, 8) == 2027025


@pytest.mark.parametrize("n,groups", [(6, 3), (6, 2), (8, 4), (8, 2)])
def test_heuristic_matches_exhaustive_search_on_small_layers(n, groups):
    """On 8 random layers the greedy + swap search is never below the exhaustive optimum (it is a
    grouping too) and reaches it within 2% of the cost, exactly in most layers."""
    exact_hits = 0
    for seed in range(8):
        f = hg.frobenius_gram(heads(n, seed=seed))
        exact = hg.best_grouping(f, groups)
        found = hg.best_grouping(f, groups, exact_max=0)
        assert exact.exact and not found.exact
        assert found.cost >= exact.cost - 1e-12
        assert found.cost <= exact.cost * 1.02
        exact_hits += math.isclose(found.cost, exact.cost, rel_tol=1e-12)
    assert exact_hits >= 5


def test_planted_groups_are_found_exactly_and_by_the_heuristic():
    w, planted = clustered(4, 2, seed=1)
    f = hg.frobenius_gram(w)
    assert hg.best_grouping(f, 4).groups == planted
    w, planted = clustered(4, 4, seed=2)                # 2,627,625 partitions: the heuristic
    f = hg.frobenius_gram(w)
    found = hg.best_grouping(f, 4)
    assert not found.exact and found.groups == planted and found.cost < 0.1
    assert hg.best_grouping(f, 4, "contiguous").cost > 0.5


def test_free_grouping_never_costs_more_than_the_contiguous_one():
    for seed in range(5):
        f = hg.frobenius_gram(heads(16, seed=seed))
        for g in (8, 4):
            assert hg.best_grouping(f, g).cost <= hg.best_grouping(f, g, "contiguous").cost + 1e-12


def test_group_counts_and_default():
    assert hg.group_counts(8) == [4, 2, 1]
    assert hg.group_counts(6) == [3, 1]
    assert hg.group_counts(2) == [1]
    assert hg.group_counts(9) == [3, 1]
    assert hg.group_counts(1) == []
    assert [hg.default_groups(n) for n in (2, 4, 6, 9, 7, 1)] == [1, 2, 3, 3, 1, 1]


def test_groupings_table_rows():
    f = hg.frobenius_gram(heads(4))
    rows = hg.table(hg.groupings(f))
    assert [(r["groups"], r["kind"]) for r in rows] == [(2, "contiguous"), (2, "free"), (1, "contiguous"),
                                                         (1, "free")]
    assert rows[0]["grouping"] == [[0, 1], [2, 3]] and rows[2]["cost"] == rows[3]["cost"]
    assert all(r["max_residual"] >= r["cost"] for r in rows)


def test_bad_inputs_are_refused_with_the_reason():
    f = hg.frobenius_gram(heads(6))
    with pytest.raises(ValueError, match=r"^head grouping: 6 heads cannot form 4 groups of equal size "
                                         r"\(expected a divisor of 6\)$"):
        hg.best_grouping(f, 4)
    with pytest.raises(ValueError, match=r"^head grouping: unknown kind 'best': expected one of contiguous, free$"):
        hg.best_grouping(f, 3, "best")
    with pytest.raises(ValueError, match=r"^head grouping: expected a square Frobenius Gram \[n, n\], "
                                         r"found shape \(6, 5\)$"):
        hg.best_grouping(f[:, :5], 3)
