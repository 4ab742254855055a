"""The accumulator's two ways to the same statistics: windows reduced through their float64 Grams
(``d_model <= tokens per window``) and windows projected (longer ``d_model``); the chance draws'
K and V totals from the input's Gram. Checked against float64 projections built in code."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import analysis.activations as act
from analysis.activations import ActivationAccumulator
from tests.analysis._devices import DEVICES
from tests.analysis._threads import one_thread  # noqa: F401  (autouse: one torch thread)


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def ints(*shape, lo=-2, hi=3, seed=0):
    """Small integers as float32: every float32 product and sum of them below is exact."""
    return torch.randint(lo, hi, shape, generator=torch.Generator().manual_seed(seed)).float()


def meta(h, g, d, e):
    return SimpleNamespace(n_heads=h, n_kv_heads=g, d_model=d, d_head=e, norm="layernorm", variant="qkv")


def layer(wq, wk, wv, *, bq=None, bk=None, bv=None, heads=None):
    h = wq.shape[0] if wq is not None else heads
    return SimpleNamespace(layer=0, W_Q=wq, W_K=wk, W_V=wv, W_O=rand(h, wk.shape[2], wk.shape[1], seed=99),
                           b_Q=bq, b_K=bk, b_V=bv)


def projected(x, wk, wv, wq, bk=None, bv=None, bq=None):
    """Per-window sums of float64 projections of ``x: [N, T, d]`` (``w*: [heads, d, e]``), with the
    logits formed as ``[T, T]`` matrices: the definitions in analysis/activations.py."""
    x = x.double()
    def proj(w, b):
        p = torch.einsum("ntd,hde->nhte", x, w.double())                # [N, heads, T, e]
        return p if b is None else p + b.double()[None, :, None, :]
    k, v = proj(wk, bk), proj(wv, bv)
    rep = wq.shape[0] // wk.shape[0]
    st = {"sk": k.sum(2), "sv": v.sum(2), "kk": k.mT @ k, "vv": v.mT @ v, "kv": k.mT @ v}
    q = proj(wq, bq)
    logits = q @ k.repeat_interleave(rep, 1).mT                          # L_h: [N, h, T, T]
    st["lsym"] = (logits * logits.mT).sum((-2, -1))
    st["lsq"] = logits.square().sum((-2, -1))
    lay = logits.sum(1)                                                  # the layer's L: [N, T, T]
    st["lsym_layer"] = (lay * lay.mT).sum((-2, -1))
    st["lsq_layer"] = lay.square().sum((-2, -1))
    return st


def heads_of(wk, wv, wq, bk=None, bv=None, bq=None):
    """``analysis.activations._heads`` of one set of projections given per head ``[heads, d, e]``."""
    cat = lambda ws: torch.cat([w.double().permute(1, 0, 2).reshape(w.shape[1], -1) for w in ws], 1)  # noqa: E731
    g, _, e = wk.shape
    b = None if bk is None else torch.cat([bk.reshape(-1), bv.reshape(-1), bq.reshape(-1)]).double()
    return act._heads(cat([wk, wv, wq])[None], b, g, wq.shape[0], e, identity_q=False)


@pytest.mark.parametrize("biases", [False, True])
def test_gram_stats_equal_float64_projections(biases):
    N, T, d, h, g, e = 5, 20, 12, 4, 2, 3                             # GQA: 2 query heads per kv head
    x = rand(N, T, d, seed=1) + 0.3 * rand(d, seed=2)
    wk, wv, wq = rand(g, d, e, seed=3), rand(g, d, e, seed=4), rand(h, d, e, seed=5)
    b = (rand(g, e, seed=6), rand(g, e, seed=7), rand(h, e, seed=8)) if biases else (None, None, None)
    x64 = x.double()
    G, s = x64.mT @ x64, x64.sum(1)                                      # [N, d, d], [N, d]
    n = torch.full((N,), float(T), dtype=torch.float64)
    got = act._gram_stats(G, s, n, heads_of(wk, wv, wq, *b), h // g, with_q=True)
    want = projected(x, wk, wv, wq, *b)
    for key, val in want.items():
        np.testing.assert_allclose(got[key][0].numpy(), val.numpy(), rtol=1e-10, atol=1e-10 * float(val.abs().max()),
                                   err_msg=key)
    assert got["n"].tolist() == [float(T)] * N


def test_gram_stats_of_several_sets_and_identity_queries():
    """Three sets of projections at once (the chance draws' layout), and W_Q absent: Q_h = x slices."""
    N, T, d, h, g, e = 3, 9, 8, 4, 2, 2
    x = rand(N, T, d, seed=10)
    x64 = x.double()
    G, s, n = x64.mT @ x64, x64.sum(1), torch.full((N,), float(T), dtype=torch.float64)
    draws = rand(3, d, 2 * g * e + h * e, seed=11).double()              # [sets, d, K | V | Q]
    got = act._gram_stats(G, s, n, act._heads(draws, None, g, h, e, identity_q=False), h // g, with_q=True)
    for i in range(3):
        split = lambda lo, hi, m: draws[i][:, lo:hi].reshape(d, m, e).permute(1, 0, 2)   # noqa: E731
        want = projected(x, split(0, g * e, g), split(g * e, 2 * g * e, g), split(2 * g * e, None, h))
        for key, val in want.items():
            np.testing.assert_allclose(got[key][i].numpy(), val.numpy(), rtol=1e-10, err_msg=f"set {i} {key}")
    wk, wv = rand(g, d, e, seed=12), rand(g, d, e, seed=13)
    w = torch.cat([wk.permute(1, 0, 2).reshape(d, -1), wv.permute(1, 0, 2).reshape(d, -1)], 1).double()
    bq = rand(h * e, seed=14)
    got = act._gram_stats(G, s, n, act._heads(w[None], None, g, h, e, identity_q=True, b_q=bq), h // g,
                          with_q=True)
    eye = torch.eye(d).reshape(d, h, e).permute(1, 0, 2)                 # Q_h = x[:, h*e:(h+1)*e] + b_Q[h]
    want = projected(x, wk, wv, eye, bq=bq.view(h, e), bk=torch.zeros(g, e), bv=torch.zeros(g, e))
    for key in ("lsym", "lsq", "lsym_layer", "lsq_layer"):
        np.testing.assert_allclose(got[key][0].numpy(), want[key].numpy(), rtol=1e-10, err_msg=key)


def accumulate(lay, m, x, *, gram, monkeypatch, logits=True, calls=2, device="cpu"):
    monkeypatch.setattr(act, "_gram_path", lambda d, T: gram)
    acc = ActivationAccumulator(lay, m, logits=logits, device=device, seed=3)
    for part in torch.tensor_split(x, calls):
        acc.add(part)
    return acc


def integer_layer(h=4, g=2, d=16, e=4):
    """GQA weights and biases of small integers (exact float32 projections of integer x)."""
    return layer(ints(h, d, e, lo=-1, hi=2, seed=1), ints(g, d, e, lo=-1, hi=2, seed=2),
                 ints(g, d, e, lo=-1, hi=2, seed=3), bq=ints(h, e, seed=4), bk=ints(g, e, seed=5),
                 bv=ints(g, e, seed=6)), meta(h, g, d, e)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("logits", [True, False])
def test_gram_path_and_projection_path_give_the_same_rows(monkeypatch, logits, device):
    lay, m = integer_layer()
    x = ints(6, 24, m.d_model, seed=7)                                  # 144 tokens, windows of 24
    rows = {}
    for gram in (True, False):
        acc = accumulate(lay, m, x, gram=gram, monkeypatch=monkeypatch, logits=logits, device=device)
        rows[gram] = acc.result()[0]
    one, two = rows[True], rows[False]
    assert one[["metric", "head_label"]].equals(two[["metric", "head_label"]])
    for col in ("value", "ci_low", "ci_high"):                          # exact projections: round-off only
        np.testing.assert_allclose(one[col].to_numpy(), two[col].to_numpy(), rtol=1e-10, err_msg=col)
    # the draws' logits are float32 projections on the projection path, float64 Grams on the other
    np.testing.assert_allclose(one["chance"].to_numpy(), two["chance"].to_numpy(), rtol=1e-5)


def test_identity_queries_on_both_paths(monkeypatch):
    h, g, d, e = 4, 2, 16, 4                                            # h * e == d: Q_h = x slices
    lay = layer(None, ints(g, d, e, lo=-1, hi=2, seed=1), ints(g, d, e, lo=-1, hi=2, seed=2),
                bq=ints(h, e, seed=3), heads=h)
    x = ints(4, 20, d, seed=4)
    vals = [accumulate(lay, meta(h, g, d, e), x, gram=gram, monkeypatch=monkeypatch).result()[0]
            for gram in (True, False)]
    np.testing.assert_allclose(vals[0]["value"].to_numpy(), vals[1]["value"].to_numpy(), rtol=1e-10)
    assert "logit_symmetry" in set(vals[0].metric)


@pytest.mark.parametrize("gram", [True, False])
def test_chance_totals_equal_float64_projections_of_the_draws(monkeypatch, gram):
    lay, m = integer_layer()
    x = rand(6, 24, m.d_model, seed=8) * torch.logspace(0, -2, m.d_model) + 0.5   # anisotropic, offset
    acc = accumulate(lay, m, x, gram=gram, monkeypatch=monkeypatch)
    g, h, e = m.n_kv_heads, m.n_heads, m.d_head
    for r, (got, _) in zip(acc.r, acc._chance_stats()):                      # the seeded draws [d, K | V | Q]
        split = lambda lo, hi, k: r[:, lo:hi].reshape(m.d_model, k, e).permute(1, 0, 2)   # noqa: E731
        want = projected(x, split(0, g * e, g), split(g * e, 2 * g * e, g), split(2 * g * e, None, h))
        for key, val in want.items():
            # K and V from the input's Gram on both paths; the logits in float32 on the projection path
            tol = 1e-10 if gram or key in ("sk", "sv", "kk", "vv", "kv") else 1e-5
            np.testing.assert_allclose(got[key].numpy(), val.sum(0).numpy(), rtol=tol, err_msg=key)
        assert float(got["n"]) == x.shape[0] * x.shape[1]


@pytest.mark.parametrize("gram", [True, False])
def test_without_logits_the_draws_are_drawn_again_for_the_chance_not_held(monkeypatch, gram):
    """Without the logits add() never uses the draws: none is held through the forward, and the
    ones drawn again from the seed give the chance totals of float64 projections through them."""
    lay, m = integer_layer()
    x = rand(6, 24, m.d_model, seed=16) + 0.5
    acc = accumulate(lay, m, x, gram=gram, monkeypatch=monkeypatch, logits=False)
    assert acc._r is None
    g, e = m.n_kv_heads, m.d_head
    assert [tuple(r.shape) for r in acc.r] == [(m.d_model, 2 * g * e)] * 3
    assert all(torch.equal(a, b) for a, b in zip(acc.r, acc.r))        # the same matrices at each use
    for r, (got, _) in zip(acc.r, acc._chance_stats()):
        split = lambda lo, hi: r[:, lo:hi].reshape(m.d_model, g, e).permute(1, 0, 2)   # noqa: E731
        want = projected(x, split(0, g * e), split(g * e, 2 * g * e), split(0, g * e))
        for key in ("sk", "sv", "kk", "vv", "kv"):
            np.testing.assert_allclose(got[key].numpy(), want[key].sum(0).numpy(), rtol=1e-10, err_msg=key)


def test_draws_logit_sums_on_long_offset_windows_hold_the_symmetry_score_to_1e5(monkeypatch):
    """Projection path: a chance draw's per-head and layer logit sums take float32 products over
    the window's tokens (float64 sums). On windows of 512 tokens whose mean is 10x their spread
    (every logit shares one large term) the symmetry score (1 + lsym / lsq) / 2 of every draw
    stays within 1e-5 of float64 projections of the same draw (1.5e-6 measured; 1e-6 with the
    products in float64), against a 1e-3 promise and draws that differ from each other by far more."""
    h, g, d, e = 4, 2, 32, 8
    lay = layer(rand(h, d, e, seed=11), rand(g, d, e, seed=12), rand(g, d, e, seed=13))
    m = meta(h, g, d, e)
    x = rand(2, 512, d, seed=14) + 10.0 * rand(d, seed=15)              # [N, T, d], offset
    acc = accumulate(lay, m, x, gram=False, monkeypatch=monkeypatch)
    for r, (got, _) in zip(acc.r, acc._chance_stats()):
        split = lambda lo, hi, k: r[:, lo:hi].reshape(d, k, e).permute(1, 0, 2)   # noqa: E731
        want = projected(x, split(0, g * e, g), split(g * e, 2 * g * e, g), split(2 * g * e, None, h))
        for sym, sq in (("lsym", "lsq"), ("lsym_layer", "lsq_layer")):
            score = (1 + got[sym] / got[sq]) / 2
            ref = (1 + want[sym].sum(0) / want[sq].sum(0)) / 2
            np.testing.assert_allclose(score.numpy(), ref.numpy(), rtol=0, atol=1e-5, err_msg=sym)
            np.testing.assert_allclose(got[sq].numpy(), want[sq].sum(0).numpy(), rtol=1e-5, err_msg=sq)


@pytest.mark.parametrize("gram", [True, False])
def test_small_batches_of_windows_equal_one_batch(monkeypatch, gram):
    """Gram path: the held Grams reduced after every add(), one window at a time; projection
    path: the layer's [T, T] logits one window at a time."""
    lay, m = integer_layer()
    x = rand(8, 24, m.d_model, seed=9)
    whole = accumulate(lay, m, x, gram=gram, monkeypatch=monkeypatch, calls=4).result()[0]
    monkeypatch.setattr(act, "_PENDING_BYTES", 1)                       # reduce after every add()
    monkeypatch.setattr(act, "_CHUNK_BYTES", 1)                         # one window per batch
    parts = accumulate(lay, m, x, gram=gram, monkeypatch=monkeypatch, calls=4).result()[0]
    for col in ("value", "chance", "ci_low", "ci_high"):
        np.testing.assert_allclose(parts[col].to_numpy(), whole[col].to_numpy(), rtol=1e-12, err_msg=col)


def test_paths_mixed_across_calls_keep_the_windows_in_order(monkeypatch):
    """Windows reduced through their Grams, then projected ones: the same rows as one path."""
    lay, m = integer_layer()
    x = ints(6, 24, m.d_model, seed=10)
    ref = accumulate(lay, m, x, gram=True, monkeypatch=monkeypatch, calls=3).result()[0]
    acc = accumulate(lay, m, x[:2], gram=True, monkeypatch=monkeypatch, calls=1)
    monkeypatch.setattr(act, "_gram_path", lambda d, T: False)
    for part in torch.tensor_split(x[2:], 2):
        acc.add(part)
    mixed = acc.result()[0]
    for col in ("value", "ci_low", "ci_high"):
        np.testing.assert_allclose(mixed[col].to_numpy(), ref[col].to_numpy(), rtol=1e-10, err_msg=col)
