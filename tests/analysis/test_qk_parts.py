"""Routing and filtering (``analysis.qk_parts``, ``analysis.metrics.qk_parts``): the symmetric and
skew-symmetric parts of each head's M_h against a float64 reference on explicit d_model x d_model
matrices (full multi-head, grouped-query, query-free), planted structure (a Q = K head, a head with one
planted rotation plane, a purely skew head), random layers inside the null band, and stable chance levels."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from analysis import chance, degenerate, qk_parts, registry
from analysis.above_chance import flag
from analysis.chance import attach_weight_chance, weight_chance
from analysis.layer import AttentionWeights
from analysis.tied import tied_layer
from analysis.weights import weight_metrics
from tests.analysis._threads import one_thread  # noqa: F401  (autouse: one torch thread)

NAMES = ("erank_qk_sym", "erank_qk_skew", "energy_qk_skew")


def meta(h, g, d, e, variant="qkv"):
    return SimpleNamespace(n_heads=h, n_kv_heads=g, d_model=d, d_head=e, norm="layernorm", variant=variant,
                           dtype="float32")


def rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * shape[-2] ** -0.5


def layer(q, k, h, e, d, seed=3):
    return AttentionWeights(0, q, k, rand(k.shape[0], d, e, seed=seed), rand(h, e, d, seed=seed + 1))


def rows(df, name):
    return df[df.metric == name].sort_values("head")


# -- the float64 reference: M_h, S and A formed explicitly -----------------------------------------
def ref_erank(a):
    s = np.linalg.svd(a, compute_uv=False)
    p = s / s.sum()
    p = p[p > 0]
    return math.exp(-(p * np.log(p)).sum())


def reference(q, k, h, g, d, e):
    """``{(metric, head): value}`` from the float32 tensors in numpy float64 (``q`` None: identity slices)."""
    qs = (np.eye(d).reshape(d, h, e).transpose(1, 0, 2) if q is None else q.double().numpy())
    ks = k.double().numpy()
    ref = {}
    for i in range(h):
        m = qs[i] @ ks[i // (h // g)].T                                       # [d, d]
        s, a = (m + m.T) / 2, (m - m.T) / 2
        ref["erank_qk_sym", i] = ref_erank(s)
        ref["erank_qk_skew", i] = ref_erank(a)
        ref["energy_qk_skew", i] = np.linalg.norm(a) ** 2 / np.linalg.norm(m) ** 2
    return ref


@pytest.mark.parametrize("h,g,d,e,query_free", [(4, 4, 32, 8, False), (8, 2, 64, 8, False), (4, 1, 48, 16, False),
                                                (4, 4, 32, 8, True), (8, 2, 64, 8, True)])
def test_each_metric_equals_the_float64_reference(h, g, d, e, query_free):
    q = None if query_free else rand(h, d, e, seed=1)
    k = rand(g, d, e, seed=2)
    df, notes = weight_metrics(layer(q, k, h, e, d), meta(h, g, d, e), device="cpu")
    ref = reference(q, k, h, g, d, e)
    for name in NAMES:
        got = rows(df, name)
        assert got["head"].tolist() == list(range(h)) and not got["degenerate"].any()
        for i, value in zip(got["head"], got["value"]):
            assert value == pytest.approx(ref[name, i], rel=1e-6, abs=1e-12), (name, i)
    # the energy share is one minus the symmetry score, head by head
    sym = rows(df, "qk_symmetry").dropna(subset=["head"])["value"].to_numpy()
    assert rows(df, "energy_qk_skew")["value"].to_numpy() == pytest.approx(1 - sym, abs=1e-12)
    assert not set(NAMES) & set(notes)


def test_ill_conditioned_heads_match_the_reference():
    """Q and K of condition number 1e5 and scales 1000x apart: the balanced head space keeps both halves."""
    rng = np.random.default_rng(5)
    d, e, h = 64, 8, 2

    def geometric(scale):
        u = np.linalg.qr(rng.standard_normal((d, e)))[0]
        v = np.linalg.qr(rng.standard_normal((e, e)))[0]
        return (u * scale * np.geomspace(1, 1e-5, e)) @ v.T

    q = torch.tensor(np.stack([geometric(30.0) for _ in range(h)]), dtype=torch.float32)
    k = torch.tensor(np.stack([geometric(0.03) for _ in range(h)]), dtype=torch.float32)
    df, _ = weight_metrics(layer(q, k, h, e, d), meta(h, h, d, e), device="cpu")
    ref = reference(q, k, h, h, d, e)
    for name in NAMES:
        for i, value in zip(rows(df, name)["head"], rows(df, name)["value"]):
            assert value == pytest.approx(ref[name, i], rel=1e-3), (name, i)


def test_the_head_space_has_m_s_and_a_singular_values():
    """``B = F_1^T F_2`` has M's singular values; its parts S's and A's, A's in equal pairs."""
    h, d, e = 3, 40, 6
    q, k = rand(h, d, e, seed=7).double(), rand(h, d, e, seed=8).double()
    gq, gk, c = q.mT @ q, k.mT @ k, k.mT @ q
    sym, skew = qk_parts.part_values(gq, gk, c)
    for i in range(h):
        m = q[i] @ k[i].T
        want_s = torch.linalg.svdvals((m + m.T) / 2)[:2 * e]
        want_a = torch.linalg.svdvals((m - m.T) / 2)[:2 * e]
        assert sym[i].sort(descending=True).values == pytest.approx(want_s, rel=1e-9)
        got_a = skew[i].sort(descending=True).values
        assert got_a == pytest.approx(want_a, rel=1e-9)
        assert got_a[0::2] == pytest.approx(got_a[1::2], rel=1e-9)          # +-i sigma: pairs


def test_a_singular_head_space_is_factored_by_its_eigen_decomposition():
    q = rand(2, 16, 4, seed=9).double()
    g = qk_parts.head_space(q.mT @ q, q.mT @ q, q.mT @ q)                    # Q = K: G has rank 4 of 8
    assert bool((torch.linalg.cholesky_ex(g).info != 0).any())
    f = qk_parts.factor(g)
    assert f @ f.mT == pytest.approx(g, abs=1e-12)


# -- planted structure -------------------------------------------------------------------------------
def _planted(d=32, e=8, h=8, alpha=1.0, omega=0.5):
    """Head 0: Q = K (symmetric M); head 1: Q = K (alpha I + Omega) with Omega one rotation plane of
    weight omega and K with orthonormal columns (A = K Omega K^T: singular values omega, omega);
    head 2: Q = K J with J an invertible skew matrix (M antisymmetric); heads 3-7: Gaussian Q and K."""
    k = torch.linalg.qr(torch.randn(h, d, e, generator=torch.Generator().manual_seed(10)))[0]   # orthonormal
    k[3:] = rand(h - 3, d, e, seed=12)                                         # Gaussian, as the null's
    plane = torch.zeros(e, e)
    plane[0, 1], plane[1, 0] = omega, -omega
    j = torch.zeros(e, e)
    for i in range(0, e, 2):
        j[i, i + 1], j[i + 1, i] = 1.0, -1.0
    q = torch.cat([torch.stack([k[0], k[1] @ (alpha * torch.eye(e) + plane).T, k[2] @ j.T]),
                   rand(h - 3, d, e, seed=11)])
    return layer(q, k, h, e, d), meta(h, h, d, e)


def test_planted_symmetric_rotation_and_antisymmetric_heads_have_their_known_answers():
    lay, m = _planted()
    df, notes = weight_metrics(lay, m, device="cpu")
    energy, skew, sym = (rows(df, n) for n in ("energy_qk_skew", "erank_qk_skew", "erank_qk_sym"))
    e = m.d_head
    # head 0, Q = K: no routing part at all; its filtering part is M = K K^T (rank e, equal values)
    assert energy["value"].iloc[0] == pytest.approx(0.0, abs=1e-12)
    assert math.isnan(skew["value"].iloc[0]) and skew["degenerate"].tolist() == [True] + [False] * 7
    assert notes["erank_qk_skew"].startswith("degenerate where M_h is symmetric to working precision")
    assert sym["value"].iloc[0] == pytest.approx(e, rel=1e-6)
    # head 1: one rotation plane: erank 2 exactly, energy 2 omega^2 / (e alpha^2 + 2 omega^2)
    assert skew["value"].iloc[1] == pytest.approx(2.0, rel=1e-6)
    assert energy["value"].iloc[1] == pytest.approx(2 * 0.25 / (e + 2 * 0.25), rel=1e-6)
    assert sym["value"].iloc[1] == pytest.approx(e, rel=1e-6)
    # head 2: M = K J K^T antisymmetric: all routing, e/2 planes of equal weight
    assert energy["value"].iloc[2] == pytest.approx(1.0, abs=1e-12)
    assert skew["value"].iloc[2] == pytest.approx(e, rel=1e-6)
    assert math.isnan(sym["value"].iloc[2]) and sym["degenerate"].tolist() == [False, False, True] + [False] * 5
    assert notes["erank_qk_sym"].startswith("degenerate where M_h is antisymmetric to working precision")


def test_planted_heads_are_found_outside_the_null_band_and_gaussian_heads_are_not():
    lay, m = _planted()
    frame, _ = weight_metrics(lay, m, device="cpu")
    rows_ = attach_weight_chance(frame, m, query_free=False, device="cpu")
    out = flag(rows_)
    above = {(r.metric, int(r.head)): r.above_chance for r in out[out.metric.isin(NAMES)].itertuples()}
    p = {(r.metric, int(r.head)): r.p_null for r in rows_[rows_.metric.isin(NAMES)].itertuples()}
    assert above["energy_qk_skew", 0] and above["energy_qk_skew", 1] and above["energy_qk_skew", 2]
    assert above["erank_qk_skew", 1] and above["erank_qk_skew", 2]           # 2 and 8 of a null near 13.7
    assert above["erank_qk_sym", 0] and above["erank_qk_sym", 1]              # 8 of a null near 13.5
    assert pd.isna(above["erank_qk_skew", 0]) and pd.isna(above["erank_qk_sym", 2])   # degenerate: not tested
    assert max(p[k] for k in above if k[1] < 3 and not pd.isna(above[k])) < 1e-50
    # the Gaussian heads are draws of the null (Benjamini-Hochberg after three rejections of eight heads
    # may still call one just outside the band: its p-value is 0.02)
    assert min(p[name, h] for name in NAMES for h in range(3, 8)) > 0.01


# the shapes of the planted layer and of the stability test below: their chance tables are computed once
@pytest.mark.parametrize("h,g,d,e,query_free", [(8, 8, 32, 8, False), (4, 2, 64, 16, False), (4, 4, 32, 8, True)])
def test_random_layers_sit_inside_the_null_band(h, g, d, e, query_free):
    m = meta(h, g, d, e, variant="wq_identity" if query_free else "qkv")
    gen = torch.Generator().manual_seed(99)                                  # other draws than the chance's
    frames = [weight_metrics(chance.random_layer(m, query_free=query_free, generator=gen), m, device="cpu")[0]
              .assign(layer=i) for i in range(64 // h)]
    out = flag(attach_weight_chance(pd.concat(frames, ignore_index=True), m, query_free=query_free, device="cpu"))
    for name in NAMES:
        sel = out[out.metric == name]
        # the band's 2.5% and 97.5% quantiles come from the 96-200 draws that make the median stable, so
        # its tails are rough: most, not all, random heads inside it, and few called above chance
        inside = (sel["value"] >= sel["chance_low"]) & (sel["value"] <= sel["chance_high"])
        assert inside.mean() >= 0.85, (name, inside.mean())
        assert len(sel) == 64 and sel["above_chance"].fillna(True).sum() <= 3, name
        width = float(sel["chance_high"].iloc[0] - sel["chance_low"].iloc[0])
        # the median of 64 heads: standard error about 1.25 sd / 8, sd about width / 4: within 5 of them
        assert abs(sel["value"].median() - sel["chance"].iloc[0]) <= 0.2 * width, name


# -- chance ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("h,g,d,e,query_free", [(4, 2, 64, 16, False), (4, 4, 32, 8, True)])
def test_chance_levels_are_stable_to_one_percent_for_equal_shapes(h, g, d, e, query_free):
    m = meta(h, g, d, e)
    a, b = (weight_chance(m, query_free=query_free, device="cpu", seed=s).set_index("metric") for s in (0, 1))
    for name in ("erank_qk_sym", "erank_qk_skew"):
        assert a.loc[name, "how"].startswith("median of ") and "not stable" not in a.loc[name, "how"]
        scale = max(abs(a.loc[name, "chance"]), a.loc[name, "chance_high"] - a.loc[name, "chance_low"])
        assert abs(a.loc[name, "chance"] - b.loc[name, "chance"]) <= 0.01 * scale, name
        assert a.loc[name, "chance_low"] < a.loc[name, "chance"] < a.loc[name, "chance_high"] <= 2 * e
    # the closed form of the energy share: one minus the symmetry's, near the median of its draws
    row = a.loc["energy_qk_skew"]
    assert row["chance"] == pytest.approx((1 - 1 / d) / 2) and row["how"].startswith("closed form")
    assert row["chance"] == pytest.approx(1 - a.loc["qk_symmetry"].query("not whole")["chance"].iloc[0])
    assert row["chance"] == pytest.approx(float(np.median(row["null"])), abs=0.01)
    assert row["chance_low"] < row["chance"] < row["chance_high"]


# -- ties, absent layers, the registry ----------------------------------------------------------------
def test_a_q_eq_k_tie_fixes_the_routing_rows():
    h, d, e = 4, 32, 8
    k = rand(h, d, e, seed=12)
    lays = [layer(rand(h, d, e, seed=13), k, h, e, d), AttentionWeights(1, k.clone(), k, rand(h, d, e, seed=14),
                                                                        rand(h, e, d, seed=15))]
    m = meta(h, h, d, e)
    frame = pd.concat([weight_metrics(lay, m, device="cpu")[0] for lay in lays], ignore_index=True)
    out = degenerate.tie_fixed(frame, [tied_layer(lay, m) for lay in lays], notes := {})
    flagged = set(zip(out.loc[out.degenerate, "layer"], out.loc[out.degenerate, "metric"]))
    assert {(1, "energy_qk_skew"), (1, "erank_qk_skew")} <= flagged
    assert not {(0, n) for n in NAMES} & flagged and (1, "erank_qk_sym") not in flagged
    assert notes["energy_qk_skew"].startswith("degenerate at L1H0, L1H1, L1H2, L1H3: Q = K in this layer")


def test_a_layer_without_m_has_no_routing_rows_and_says_why():
    h, g, d, e = 4, 2, 48, 8                                                 # query-free, h*e != d
    df, notes = weight_metrics(layer(None, rand(g, d, e, seed=16), h, e, d), meta(h, g, d, e), device="cpu")
    assert not df.metric.isin(NAMES).any()
    assert {notes[n] for n in NAMES} == {notes["qk_symmetry"]}


def test_the_metrics_are_registered_after_the_symmetry_and_listed():
    assert tuple(registry.names(family="qk_parts")) == NAMES
    names = registry.names()
    assert names.index("qk_directionality") < names.index("erank_qk_sym")
    for name in NAMES:
        row = registry.BY_NAME[name]
        assert (row.level, row.axis, row.direction, row.reads) == ("weights", "head", "min", ("Q", "K"))
    assert registry.BY_NAME["energy_qk_skew"].chance == "closed"
    assert registry.BY_NAME["energy_qk_skew"].fixed_by == ("q_eq_k",) == registry.BY_NAME["erank_qk_skew"].fixed_by
    assert registry.closed_form("energy_qk_skew", meta(4, 4, 32, 8), False) == pytest.approx(31 / 64)
