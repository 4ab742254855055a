"""Cross-head maps (``analysis.metrics.cross_head``): float64 numpy references, planted structure
(two heads that are rotations of each other, heads already grouped), random layers inside the null band."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from analysis import chance
from analysis.above_chance import flag
from analysis.chance import attach_weight_chance, weight_chance
from analysis.layer import AttentionWeights
from analysis.registry import BY_NAME
from analysis.weights import weight_metrics
from tests.analysis._threads import one_thread  # noqa: F401  (autouse: one torch thread)

SIMS = ("xhead_sim_k", "xhead_sim_k_aligned", "xhead_sim_v_aligned")


def meta(h=8, g=4, d=32, e=8):
    return SimpleNamespace(n_heads=h, n_kv_heads=g, d_model=d, d_head=e, norm="layernorm", variant="qkv")


def layer_of(wk, wv, h=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    g, d, e = wk.shape
    return AttentionWeights(0, torch.randn(h, d, e, generator=gen), wk.float(), wv.float(),
                            torch.randn(h, e, d, generator=gen))


def random_kv(g=4, d=32, e=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(g, d, e, generator=gen, dtype=torch.float64), torch.randn(g, d, e, generator=gen,
                                                                                   dtype=torch.float64)


def orthogonal(e, seed):
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((e, e)))
    return torch.from_numpy(q)


def matrices(frame, metric, n):
    """``[n, n]`` of ``metric``'s pair rows (NaN on the diagonal)."""
    out = np.full((n, n), np.nan)
    rows = frame[frame["metric"] == metric]
    for h, h2, v in zip(rows["head"], rows["head2"], rows["value"]):
        out[int(h), int(h2)] = v
    return out


def reference(w: np.ndarray, aligned: bool) -> np.ndarray:
    n = w.shape[0]
    out = np.full((n, n), np.nan)
    for i, j in itertools.permutations(range(n), 2):
        a, b = w[i], w[j]
        num = np.linalg.svd(a.T @ b, compute_uv=False).sum() if aligned else (a * b).sum()
        out[i, j] = num / (np.linalg.norm(a) * np.linalg.norm(b))
    return out


def pool_reference(w: np.ndarray, groups: int) -> float:
    """Best mean residual over every assignment of heads to equal groups (brute force over permutations)."""
    n = w.shape[0]
    s = n // groups
    best = np.inf
    for perm in itertools.permutations(range(n)):
        r = []
        for g in range(groups):
            idx = list(perm[g * s:(g + 1) * s])
            m = w[idx].mean(0)
            r += [np.linalg.norm(w[h] - m) / np.linalg.norm(w[h]) for h in idx]
        best = min(best, float(np.mean(r)))
    return best


def test_every_cross_head_metric_equals_a_float64_numpy_reference():
    wk, wv = random_kv(g=4)
    m = meta(g=4)
    frame, _ = weight_metrics(layer_of(wk, wv), m, device="cpu")
    k, v = wk.float().double().numpy(), wv.float().double().numpy()
    for metric, w, aligned in (("xhead_sim_k", k, False), ("xhead_sim_k_aligned", k, True),
                               ("xhead_sim_v_aligned", v, True)):
        got = matrices(frame, metric, 4)
        np.testing.assert_allclose(got, reference(w, aligned), atol=1e-3, equal_nan=True)
        assert (frame[frame["metric"] == metric]["head"] != frame[frame["metric"] == metric]["head2"]).all()
        assert len(frame[frame["metric"] == metric]) == 12            # every ordered pair, no diagonal
    row = frame[frame["metric"] == "gqa_pool_residual"]
    assert len(row) == 1 and row["head"].isna().all()
    assert row["value"].iloc[0] == pytest.approx(pool_reference(k, 2), abs=1e-3)


def test_rotated_heads_align_to_one_and_above_chance_while_the_flat_cosine_does_not():
    """kv head 1 is head 0 times an orthogonal R (K) and head 2 is head 3 times another (V)."""
    wk, wv = random_kv(g=4, seed=3)
    wk[1] = wk[0] @ orthogonal(8, 1)
    wv[2] = wv[3] @ orthogonal(8, 2)
    m = meta(g=4)
    frame, _ = weight_metrics(layer_of(wk, wv), m, device="cpu")
    k_flat, k_al, v_al = (matrices(frame, x, 4) for x in SIMS)
    assert k_al[0, 1] == pytest.approx(1.0, abs=1e-5) and k_al[1, 0] == pytest.approx(1.0, abs=1e-5)
    assert v_al[2, 3] == pytest.approx(1.0, abs=1e-5)
    assert abs(k_flat[0, 1]) < 0.8
    assert np.nanmax(np.delete(k_al.ravel(), [1, 4])) < 0.9        # the other pairs are unrelated
    rows = flag(attach_weight_chance(frame, m, query_free=False, device="cpu"))
    hit = rows[(rows["metric"] == "xhead_sim_k_aligned") & (rows["head"] == 0) & (rows["head2"] == 1)]
    assert hit["above_chance"].iloc[0] and hit["value"].iloc[0] > hit["chance_high"].iloc[0]
    hit = rows[(rows["metric"] == "xhead_sim_v_aligned") & (rows["head"] == 3) & (rows["head2"] == 2)]
    assert hit["above_chance"].iloc[0]
    flat = rows[(rows["metric"] == "xhead_sim_k") & (rows["head"] == 0) & (rows["head2"] == 1)]
    assert flat["chance"].iloc[0] == 0.0


def test_heads_already_grouped_pool_without_residual():
    """kv heads 0 = 2 and 1 = 3: the free grouping {0, 2}, {1, 3} pools them exactly; the contiguous one does not."""
    wk, wv = random_kv(g=4, seed=5)
    wk[2], wk[3] = wk[0], wk[1]
    frame, _ = weight_metrics(layer_of(wk, wv), meta(g=4), device="cpu")
    assert frame[frame["metric"] == "gqa_pool_residual"]["value"].iloc[0] == pytest.approx(0.0, abs=1e-6)
    from analysis import head_grouping

    f = head_grouping.frobenius_gram(wk)
    assert head_grouping.best_grouping(f, 2).groups == ((0, 2), (1, 3))
    assert head_grouping.best_grouping(f, 2, "contiguous").cost > 0.5


def test_random_layers_sit_inside_the_null_band():
    m = meta(g=4)
    table = weight_chance(m, query_free=False, device="cpu").set_index(["metric", "whole"])
    inside = {x: [] for x in (*SIMS, "gqa_pool_residual")}
    for seed in range(100, 110):
        frame, _ = weight_metrics(layer_of(*random_kv(g=4, seed=seed), seed=seed), m, device="cpu")
        for x in inside:
            lo, hi = table.loc[(x, x == "gqa_pool_residual"), ["chance_low", "chance_high"]]
            vals = frame[frame["metric"] == x]["value"]
            inside[x] += ((vals >= lo) & (vals <= hi)).tolist()
    for x, got in inside.items():
        assert np.mean(got) >= 0.8, (x, np.mean(got))


def test_chance_draws_of_pairs_exclude_the_diagonal_and_wide_layers_give_disjoint_pairs():
    """A wide random layer (per-head values only) gives the pairs (2m, 2m+1), each once, and no grouping search."""
    wide = SimpleNamespace(n_heads=8, n_kv_heads=8, d_model=32, d_head=4, norm="layernorm", variant="qkv")
    lay = chance.random_layer(wide, query_free=False, generator=torch.Generator().manual_seed(0))
    frame, _ = weight_metrics(lay, wide, device="cpu", whole=False)
    for x in SIMS:
        rows = frame[(frame["metric"] == x) & frame["value"].notna()]
        assert sorted(zip(rows["head"], rows["head2"])) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert "gqa_pool_residual" not in set(frame["metric"])
    table = weight_chance(meta(g=4), query_free=False, device="cpu").set_index(["metric", "whole"])
    for x in SIMS:
        null = table.loc[(x, False), "null"]
        assert len(null) > 0 and 1.0 not in null          # a head with itself (value 1) is never drawn
    assert BY_NAME["gqa_pool_residual"].axis == "layer"


def test_one_kv_head_has_no_pairs_and_nothing_to_pool():
    wk, wv = random_kv(g=1)
    frame, notes = weight_metrics(layer_of(wk, wv), meta(g=1), device="cpu")
    assert not set(frame["metric"]) & {*SIMS, "gqa_pool_residual"}
    assert notes["gqa_pool_residual"] == "one kv head: nothing to pool"
    assert all(notes[x] == "one kv head: no pair of kv heads" for x in SIMS)


def test_chance_medians_of_equal_shapes_agree_within_one_percent():
    """Two sets of draws (seeds 0 and 1) of four kv heads, whose grouping search has three groupings to
    choose from: each Monte Carlo median within 1% of the larger of its magnitude and its band's width."""
    m = meta(g=4)
    a, b = (weight_chance(m, query_free=False, device="cpu", seed=s).set_index(["metric", "whole"]) for s in (0, 1))
    for key in (("xhead_sim_k_aligned", False), ("xhead_sim_v_aligned", False), ("gqa_pool_residual", True)):
        assert "not stable" not in a.loc[key, "how"], a.loc[key, "how"]
        scale = max(abs(a.loc[key, "chance"]), a.loc[key, "chance_high"] - a.loc[key, "chance_low"])
        assert abs(a.loc[key, "chance"] - b.loc[key, "chance"]) <= 0.01 * scale, key
