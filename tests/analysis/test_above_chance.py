""""Above chance" as a test: empirical p-values against the null draws, Benjamini-Hochberg over a
metric's heads, float64 references; random layers rarely called, planted structure found."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from analysis import above_chance
from analysis.chance import attach_weight_chance, random_layer
from analysis.weights import weight_metrics
from loaders.canonical import AttentionWeights
from tests.analysis._threads import one_thread  # noqa: F401  (autouse: one torch thread)


def test_p_value_counts_the_value_as_one_more_draw():
    null = list(range(1, 100))                       # 99 draws 1..99
    assert above_chance.p_value(20, null) == pytest.approx(2 * 21 / 100)  # 1 + 20 draws <= 20, of 100
    assert above_chance.p_value(50, null) == 1.0
    assert above_chance.p_value(99, null) == pytest.approx(2 * 2 / 100)
    assert above_chance.p_value(0.5, null) == pytest.approx(min(2 / 100, math.erfc(
        abs(0.5 - 50) / np.std(null, ddof=1) / math.sqrt(2))))
    # far beyond every draw: the normal tail, far below the empirical floor
    assert above_chance.p_value(1000, null) < 1e-100
    assert math.isnan(above_chance.p_value(float("nan"), null)) and math.isnan(above_chance.p_value(1, []))
    assert math.isnan(above_chance.p_value(3.0, [3.0, 3.0])) and above_chance.p_value(4.0, [3.0, 3.0]) == 0.0


def test_bh_reject_against_a_float64_reference():
    """Benjamini & Hochberg (1995), step-up: the largest k with p_(k) <= k q / m rejects the k smallest,
    even where a smaller p_(j) is above its own line."""
    p = np.array([0.01, 0.04, 0.03, 0.005, 0.5, np.nan])
    # m = 5; sorted 0.005, 0.01, 0.03, 0.04, 0.5 vs 0.01, 0.02, 0.03, 0.04, 0.05: k = 4
    assert above_chance.bh_reject(p).tolist() == [True, True, True, True, False, False]
    assert above_chance.bh_reject(np.array([0.02, 0.03])).tolist() == [True, True]     # 0.03 <= 2 x 0.05 / 2
    assert above_chance.bh_reject(np.array([0.03, 0.2])).tolist() == [False, False]     # 0.03 > 0.05 / 2
    assert above_chance.bh_reject(np.array([])).tolist() == []


def _rows(values, null, *, ci=None, degenerate=None):
    n = len(values)
    lo, hi = np.quantile(null, [0.025, 0.975])
    return pd.DataFrame({
        "layer": [0] * n, "head": pd.array(range(n), dtype="Int64"), "head_label": [f"L0H{i}" for i in range(n)],
        "metric": ["kv_cka"] * n, "value": values, "chance": [float(np.median(null))] * n,
        "n_tokens": pd.array([pd.NA] * n, dtype="Int64"),
        "ci_low": [c[0] for c in ci] if ci else [math.nan] * n, "ci_high": [c[1] for c in ci] if ci else [math.nan] * n,
        "chance_low": [lo] * n, "chance_high": [hi] * n, "above_chance": pd.array([pd.NA] * n, dtype="boolean"),
        "degenerate": degenerate or [False] * n,
        "p_null": [above_chance.p_value(v, sorted(null)) for v in values]})


def test_flag_needs_rejection_and_a_value_outside_the_band_and_skips_degenerate_rows():
    null = np.random.default_rng(0).normal(0.2, 0.02, 500)
    out = above_chance.flag(_rows([0.2, 0.21, 0.9, 0.95], null, degenerate=[False, False, False, True]))
    assert "p_null" not in out.columns
    assert out["above_chance"].tolist()[:3] == [False, False, True]
    assert out["above_chance"].isna().tolist() == [False, False, False, True]      # degenerate: not tested
    # activations: the whole interval must lie outside the band
    out = above_chance.flag(_rows([0.9, 0.9], null, ci=[(0.85, 0.95), (0.1, 0.95)]))
    assert out["above_chance"].tolist() == [True, False]


def _layer_meta(h, g, d, e):
    return SimpleNamespace(n_heads=h, n_kv_heads=g, d_model=d, d_head=e, norm="layernorm", variant="qkv",
                           dtype="float32")


def _called(layers, m):
    frame = pd.concat([weight_metrics(lay, m, device="cpu")[0] for lay in layers], ignore_index=True)
    return above_chance.flag(attach_weight_chance(frame, m, query_free=False, device="cpu"))


def test_random_layers_are_rarely_called_and_planted_structure_is():
    """Known answers: 6 random layers (other draws than the chance's) have at most 10% of their tested
    per-head rows called above chance; in a layer with planted structure (kv head 0: V = K rotated in
    the head's basis; kv head 1: V = K's 2-dimensional part), those heads are called on kv_cka and
    kv_share_r2, and the random heads of the same metric are not."""
    h, g, d, e = 4, 2, 64, 16
    m = _layer_meta(h, g, d, e)
    gen = torch.Generator().manual_seed(777)
    layers = [random_layer(m, query_free=False, generator=gen) for _ in range(6)]
    layers = [AttentionWeights(i, x.W_Q, x.W_K, x.W_V, x.W_O) for i, x in enumerate(layers)]
    out = _called(layers, m)
    heads = out[out["head"].notna() & out["above_chance"].notna()]
    assert len(heads) > 300
    assert heads["above_chance"].mean() <= 0.10
    # planted: rotated and low-rank V from K
    k = layers[0].W_K.clone()
    rot = torch.linalg.qr(torch.randn(e, e, generator=gen))[0]
    v = layers[0].W_V.clone()
    v[0] = k[0] @ rot                                                   # a rotation of K: CKA 1, R^2 1
    u, s, vt = torch.linalg.svd(k[1], full_matrices=False)
    v[1] = (u[:, :2] * s[:2]) @ vt[:2] + 0.01 * v[1]                    # K's top-2 part: R^2 high
    planted = AttentionWeights(0, layers[0].W_Q, k, v, layers[0].W_O)
    out = _called([planted] + layers[1:], m)
    for metric in ("kv_cka", "kv_share_r2"):
        rows = out[(out.metric == metric) & (out.layer == 0)]
        assert rows["above_chance"].tolist()[0] is True, metric
        others = out[(out.metric == metric) & (out.layer > 0)]
        assert not others["above_chance"].fillna(False).any(), metric
    assert out[(out.metric == "kv_share_r2") & (out.layer == 0)]["above_chance"].tolist()[1] is True
