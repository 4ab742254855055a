"""Activation metrics accumulated over windows, against float64 references built in code."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from analysis.activations import ActivationAccumulator
from analysis.errors import AnalysisError
from analysis.registry import BY_NAME, RESULT_COLUMNS, names
from tests.analysis._devices import DEVICES
from tests.analysis._threads import one_thread  # noqa: F401  (autouse: one torch thread)

KV_METRICS = ("kv_cka_act", "kv_cosine_act", "kv_share_r2_act", "erank_kcache", "erank_vcache")


def gen(seed):
    return torch.Generator().manual_seed(seed)


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=gen(seed))


def meta(h, g, d, e):
    return SimpleNamespace(n_heads=h, n_kv_heads=g, d_model=d, d_head=e, norm="layernorm", variant="qkv")


def layer(wq, wk, wv, *, bq=None, bk=None, bv=None, index=0, heads=None):
    h = wq.shape[0] if wq is not None else heads
    d, e = wk.shape[1], wk.shape[2]
    return SimpleNamespace(layer=index, W_Q=wq, W_K=wk, W_V=wv, W_O=rand(h, e, d, seed=99),
                           b_Q=bq, b_K=bk, b_V=bv)


def conditioned(d, e, cond, seed):
    """``[d, e]`` with singular values geometric from 1 down to ``1/cond``, random singular vectors."""
    u, _ = torch.linalg.qr(rand(d, e, seed=seed).double())
    w, _ = torch.linalg.qr(rand(e, e, seed=seed + 1).double())
    s = torch.logspace(0, -math.log10(cond), e, dtype=torch.float64)
    return ((u * s) @ w.T).float()


def ill_conditioned_layer(d=48, e=16, h=4, g=2):
    """GQA heads: K geometric (cond 1e3 and 1e6), V = K T + noise and rank-8 + noise, Q geometric."""
    wk = torch.stack([conditioned(d, e, 1e3, 1), conditioned(d, e, 1e6, 3)])
    t = rand(e, e, seed=5)
    rank8 = rand(d, 8, seed=6) @ rand(8, e, seed=7) / 8 + 1e-4 * rand(d, e, seed=8)
    wv = torch.stack([wk[0] @ t + 1e-3 * rand(d, e, seed=9), rank8])
    wq = torch.stack([conditioned(d, e, c, 10 + i) for i, c in enumerate((1e3, 1e4, 1e5, 1e6))])
    return layer(wq, wk, wv, bq=0.1 * rand(h, e, seed=11), bk=0.1 * rand(g, e, seed=12), bv=None), meta(h, g, d, e)


def anisotropic_x(windows, tokens, d, seed=20):
    """Tokens with a geometric spectrum over d_model and a mean offset (as real residual streams)."""
    scale = torch.logspace(0, -1.5, d)
    return rand(windows, tokens, d, seed=seed) * scale + 0.5 * rand(d, seed=seed + 1)


def reference(lay, m, x):
    """Every metric as stored, in float64: ``plain_reference``, the eranks bias-corrected by the
    delete-one-window jackknife ``N theta - (N-1) mean theta_(i)``."""
    full = plain_reference(lay, m, x)
    loo = [plain_reference(lay, m, torch.cat([x[:i], x[i + 1:]])) for i in range(x.shape[0])]
    n = x.shape[0]
    for k in ("erank_kcache", "erank_vcache"):
        full[k] = n * np.asarray(full[k]) - (n - 1) * np.mean([np.asarray(o[k]) for o in loo], axis=0)
    return full


def plain_reference(lay, m, x):
    """Every metric in float64 from the concatenated caches and the explicit T x T logits: the
    share fit's adjusted R^2 and the debiased CKA (Wishart-moment debiased squared norms)."""
    x64 = x.double()                                                  # [B, T, d]
    B, T, d = x64.shape
    xs = x64.reshape(B * T, d)
    rep = m.n_heads // m.n_kv_heads
    out = {k: [] for k in KV_METRICS}
    ks = []
    for g in range(m.n_kv_heads):
        k = xs @ lay.W_K[g].double() + (0 if lay.b_K is None else lay.b_K[g].double())
        v = xs @ lay.W_V[g].double() + (0 if lay.b_V is None else lay.b_V[g].double())
        ks.append(k)
        out["kv_cosine_act"].append(float((k * v).sum() / (k.norm() * v.norm())))
        kc, vc = k - k.mean(0), v - v.mean(0)
        n, e = k.shape
        hs = lambda a, b: (a.T @ b).square().sum() - a.square().sum() * b.square().sum() / (n - 1)   # noqa: E731
        out["kv_cka_act"].append(float(hs(kc, vc) / (hs(kc, kc) * hs(vc, vc)).sqrt()))
        sol = torch.linalg.lstsq(k, v, driver="gelsd").solution       # min_T ||V - K T||
        rss = (v - k @ sol).square().sum() / (n - e)                  # per residual degree of freedom
        out["kv_share_r2_act"].append(float(1 - rss / (v.square().sum() / n)))
        for name, c in (("erank_kcache", k), ("erank_vcache", v)):
            s = torch.linalg.svdvals(c)
            p = s / s.sum()
            out[name].append(float(torch.exp(-(p[p > 0] * p[p > 0].log()).sum())))
    if lay.W_Q is None:
        q = [xs[:, i * m.d_head:(i + 1) * m.d_head] for i in range(m.n_heads)]
    else:
        q = [xs @ lay.W_Q[i].double() for i in range(m.n_heads)]
    if lay.b_Q is not None:
        q = [qi + lay.b_Q[i].double() for i, qi in enumerate(q)]
    sym = lambda a, b: (1 + a / b) / 2                                # noqa: E731
    per_head, tot = [], torch.zeros(2, dtype=torch.float64)
    layer_l = torch.zeros(B, T, T, dtype=torch.float64)
    for i in range(m.n_heads):
        lg = (q[i] @ ks[i // rep].T).reshape(B * T, B * T)
        blocks = torch.stack([lg[w * T:(w + 1) * T, w * T:(w + 1) * T] for w in range(B)])   # [B, T, T]
        layer_l += blocks
        per_head.append(float(sym((blocks * blocks.mT).sum(), blocks.square().sum())))
    out["logit_symmetry"] = per_head
    out["logit_symmetry_layer"] = float(sym((layer_l * layer_l.mT).sum(), layer_l.square().sum()))
    return out


def values(df, metric, whole=False):
    rows = df[(df.metric == metric) & (df["head"].isna() if whole else df["head"].notna())]
    return rows.sort_values("head")["value"].to_numpy()


def run(lay, m, x, *, calls=1, logits=True, device="cpu", **kw):
    """Add ``x`` in ``calls`` batches of windows and return ``result()``."""
    acc = ActivationAccumulator(lay, m, logits=logits, device=device, **kw)
    for part in torch.tensor_split(x, calls):
        acc.add(part)
    return acc.result()


@pytest.mark.parametrize("device", DEVICES)
def test_float64_reference_on_ill_conditioned_gqa_heads(device):
    lay, m = ill_conditioned_layer()
    x = anisotropic_x(4, 64, m.d_model)                               # 256 tokens >= 8 x 16
    df, notes = run(lay, m, x, calls=2, device=device)
    ref = reference(lay, m, x)
    # one layer's accumulator: every activation metric but the pairs of layers (analysis.cross_layer)
    per_layer = {m for m in names("activations") if BY_NAME[m].axis != "layer_pair"}
    assert list(df.columns) == RESULT_COLUMNS + ["p_null"] and set(df.metric) == per_layer
    for metric in (*KV_METRICS, "logit_symmetry"):
        np.testing.assert_allclose(values(df, metric), ref[metric], rtol=1e-3, err_msg=metric)
    np.testing.assert_allclose(values(df, "logit_symmetry", whole=True), [ref["logit_symmetry_layer"]],
                               rtol=1e-3)
    assert (df.n_tokens == 256).all() and df.chance.notna().all()
    assert "kv_share_r2_act" not in notes                             # enough tokens: no note
    # GQA labels: kv-head metrics per kv head, logits per query head and one per layer
    assert df[df.metric == "kv_cka_act"]["head_label"].tolist() == ["L0KV0", "L0KV1"]
    assert df[df.metric == "logit_symmetry"]["head_label"].tolist() == ["L0H0", "L0H1", "L0H2", "L0H3", "L0"]


def test_windows_in_several_calls_equal_one_call():
    lay, m = ill_conditioned_layer()
    x = anisotropic_x(6, 40, m.d_model, seed=30)
    one, _ = run(lay, m, x, calls=1)
    three, _ = run(lay, m, x, calls=3)
    for col in ("value", "chance", "ci_low", "ci_high"):
        # the chance eranks' half-sample Gram is summed in float32: its round-off follows the calls
        tol = 1e-6 if col == "chance" else 1e-9
        np.testing.assert_allclose(three[col].to_numpy(), one[col].to_numpy(), rtol=tol, err_msg=col)


def test_known_answers_k_equal_v_and_identity_queries():
    h, d, e = 4, 32, 8
    wk = rand(2, d, e, seed=1)
    lay = layer(None, wk, wk.clone(), bk=rand(2, e, seed=2), bv=None, heads=h)
    lay.b_V = lay.b_K.clone()                                         # V = K exactly
    m = meta(h, 2, d, e)
    x = rand(3, 30, d, seed=3)
    df, notes = run(lay, m, x)
    for metric in ("kv_cka_act", "kv_cosine_act", "kv_share_r2_act"):
        assert values(df, metric) == pytest.approx(1.0, abs=1e-9), metric
    np.testing.assert_allclose(values(df, "erank_kcache"), values(df, "erank_vcache"), rtol=1e-12)
    ref = reference(lay, m, x)                                        # identity slices as W_Q
    np.testing.assert_allclose(values(df, "logit_symmetry"), ref["logit_symmetry"], rtol=1e-6)
    # q = k: every head's logits and their sum are symmetric
    sym = layer(wk.repeat_interleave(2, 0), wk, rand(2, d, e, seed=4))
    df, _ = run(sym, m, x)
    assert np.concatenate([values(df, "logit_symmetry"), values(df, "logit_symmetry", whole=True)]) \
        == pytest.approx(1.0, abs=1e-9)


def test_identity_queries_need_n_heads_d_head_equal_d_model():
    lay = layer(None, rand(1, 24, 8, seed=1), rand(1, 24, 8, seed=2), heads=2)
    df, notes = run(lay, meta(2, 1, 24, 8), rand(2, 70, 24, seed=4))
    assert "logit_symmetry" not in set(df.metric)
    assert notes["logit_symmetry"] == ("W_Q is absent but n_heads*d_head (16) != d_model (24), "
                                       "so the query is not an identity slice of x")


def test_chance_on_every_row_and_matches_random_projections():
    lay, m = ill_conditioned_layer()
    x = anisotropic_x(4, 64, m.d_model)
    df, _ = run(lay, m, x, seed=7, n_random=2)
    assert df.chance.notna().all()
    for (metric, whole), grp in df.groupby([df.metric, df["head"].isna()]):
        assert grp.chance.nunique() == 1, metric                     # one chance per metric and layer
    # chance of the kv metrics: the median of the same metrics of random heads on the same x
    g = gen(7)
    draws = [torch.randn(m.d_model, 2 * m.n_kv_heads * m.d_head + m.n_heads * m.d_head, generator=g)
             for _ in range(2)]
    got = []
    for r in draws:
        ge = m.n_kv_heads * m.d_head
        rk = r[:, :ge].reshape(m.d_model, m.n_kv_heads, m.d_head).permute(1, 0, 2)
        rv = r[:, ge:2 * ge].reshape(m.d_model, m.n_kv_heads, m.d_head).permute(1, 0, 2)
        rq = r[:, 2 * ge:].reshape(m.d_model, m.n_heads, m.d_head).permute(1, 0, 2)
        draw = layer(rq, rk, rv)
        got.append(plain_reference(draw, m, x))                      # chance: from the totals
        # the eranks bias-corrected from the even and the odd windows (equal halves: 2 theta - mean)
        halves = [plain_reference(draw, m, x[p::2]) for p in (0, 1)]
        for k in ("erank_kcache", "erank_vcache"):
            got[-1][k] = 2 * np.asarray(got[-1][k]) - (np.asarray(halves[0][k]) + np.asarray(halves[1][k])) / 2
    for metric in (*KV_METRICS, "logit_symmetry"):
        ref = float(np.median(np.concatenate([d[metric] for d in got])))
        assert df[df.metric == metric].chance.iloc[0] == pytest.approx(ref, rel=1e-3), metric
    ref = float(np.median([d["logit_symmetry_layer"] for d in got]))
    assert df[(df.metric == "logit_symmetry") & df["head"].isna()].chance.iloc[0] == pytest.approx(ref, rel=1e-3)


def test_bootstrap_contains_value_and_shrinks_with_windows():
    d, e = 32, 8
    lay = layer(rand(2, d, e, seed=1), rand(1, d, e, seed=2), rand(1, d, e, seed=3))
    m = meta(2, 1, d, e)
    widths = []
    for windows in (6, 96):                                          # 16x the tokens: ~1/4 the width
        df, _ = run(lay, m, anisotropic_x(windows, 32, d, seed=40))
        assert ((df.ci_low <= df.value) & (df.value <= df.ci_high)).all()
        widths.append((df.ci_high - df.ci_low).to_numpy())
    assert (widths[1] < widths[0]).all()
    # seeded: the same seed gives the same interval
    acc = ActivationAccumulator(lay, m, logits=True, device="cpu")
    acc.add(anisotropic_x(4, 64, d, seed=40))
    a, b = acc.result()[0], acc.result()[0]
    assert a.ci_low.tolist() == b.ci_low.tolist()


def test_single_window_has_no_interval_and_few_tokens_note():
    d, e = 32, 16
    lay = layer(rand(2, d, e, seed=1), rand(1, d, e, seed=2), rand(1, d, e, seed=3))
    acc = ActivationAccumulator(lay, meta(2, 1, d, e), logits=False, logits_reason="positions are rotary",
                                device="cpu")
    acc.add(rand(1, 40, d, seed=4))
    assert acc.n_tokens == 40
    df, notes = acc.result()
    assert df.ci_low.isna().all() and df.ci_high.isna().all() and (df.n_tokens == 40).all()
    assert "logit_symmetry" not in set(df.metric)
    assert notes["logit_symmetry"] == "positions are rotary"
    assert notes["kv_share_r2_act"] == (
        "degenerate: 40 tokens < 8 x d_head = 128: the value is biased toward 1 (a fit with nearly as many "
        "columns as samples); one window: no interval over windows (ci_low, ci_high empty)")
    assert notes["erank_kcache"].startswith("degenerate: 40 tokens < 8 x d_head = 128: the value is biased low")
    assert "kv_cosine_act" in notes and "40 tokens" not in notes["kv_cosine_act"]
    # the few-token metrics are flagged degenerate (and so never tested against chance), the others not
    few = df["metric"].isin(["kv_share_r2_act", "kv_cka_act", "erank_kcache", "erank_vcache",
                             "kv_cka_layer_act", "erank_kcache_layer", "erank_vcache_layer"])
    assert df.loc[few, "degenerate"].all() and not df.loc[~few, "degenerate"].any()


def test_an_input_of_few_directions_makes_the_kv_metrics_degenerate():
    """Known answer: 512 tokens that span 8 directions (< d_head 16) through random K and V: the caches
    span the same 8-dimensional subspace, so the share fit reads 1 by construction, and says so."""
    d, e = 32, 16
    lay = layer(rand(2, d, e, seed=1), rand(1, d, e, seed=2), rand(1, d, e, seed=3))
    acc = ActivationAccumulator(lay, meta(2, 1, d, e), logits=False, logits_reason="positions are rotary",
                                device="cpu")
    basis = rand(1, 8, d, seed=5)[0]                                     # [8, d]
    acc.add((rand(4, 128, 8, seed=6) @ basis))                          # 4 windows x 128 tokens, rank 8
    df, notes = acc.result()
    share = df[df.metric == "kv_share_r2_act"].iloc[0]
    assert share.value == pytest.approx(1.0, abs=1e-9) and bool(share.degenerate)
    assert "the captured input spans 8 directions, no more than the head's 16 columns" in notes["kv_share_r2_act"]
    assert not df.loc[df.metric == "logit_symmetry", "degenerate"].any()
    from analysis.registry import names
    assert set(notes) <= set(names("activations"))          # notes only under registered names


def test_single_window_with_logits_notes_the_registered_name():
    d, e = 32, 16
    lay = layer(rand(2, d, e, seed=1), rand(1, d, e, seed=2), rand(1, d, e, seed=3))
    acc = ActivationAccumulator(lay, meta(2, 1, d, e), logits=True, device="cpu")
    acc.add(rand(1, 200, d, seed=4))
    _, notes = acc.result()
    assert "logit_symmetry_layer" not in notes
    assert notes["logit_symmetry"] == "one window: no interval over windows (ci_low, ci_high empty)"


def test_fewer_tokens_than_d_head_still_has_values():
    d, e = 32, 16
    lay = layer(rand(2, d, e, seed=1), rand(1, d, e, seed=2), rand(1, d, e, seed=3))
    df, _ = run(lay, meta(2, 1, d, e), rand(2, 5, d, seed=4))           # 10 tokens < d_head
    assert values(df, "kv_share_r2_act") == pytest.approx(1.0, abs=1e-6)   # 1 by construction
    assert 1 < values(df, "erank_kcache")[0] <= 10


def test_random_projections_of_llama_shaped_head_read_at_chance():
    """head_dim 128, 4 heads, d_model 512, random W_K and W_V on 4,096 anisotropic tokens."""
    d, e, h = 512, 128, 4
    lay = layer(rand(h, d, e, seed=1) / math.sqrt(d), rand(h, d, e, seed=2) / math.sqrt(d),
                rand(h, d, e, seed=3) / math.sqrt(d))
    acc = ActivationAccumulator(lay, meta(h, h, d, e), logits=False, device="cpu", seed=5)
    x = rand(8, 512, d, seed=6) * torch.logspace(0, -1, d) + 0.1 * rand(d, seed=7)   # anisotropic
    for part in torch.tensor_split(x, 4):
        acc.add(part)
    df, notes = acc.result()
    share = df[df.metric == "kv_share_r2_act"]
    assert (share.value < 0.6).all() and "kv_share_r2_act" not in notes
    # each random head is one more draw of the null (a head's own population value differs from the
    # draws' median by more than its interval's width): none is called at 0.05 over the 4 heads
    for metric in KV_METRICS:
        rows = df[df.metric == metric]
        assert (rows.p_null > 0.05 / 4).all(), rows


def test_bad_input_messages():
    lay = layer(rand(2, 16, 4), rand(1, 16, 4), rand(1, 16, 4))
    acc = ActivationAccumulator(lay, meta(2, 1, 16, 4), logits=True, device="cpu")
    with pytest.raises(AnalysisError) as exc:
        acc.add(rand(10, 16))
    assert str(exc.value) == ("layer 0: expected the attention input as [windows, tokens, d_model=16], "
                              "found [10, 16]")
    with pytest.raises(AnalysisError) as exc:
        acc.result()
    assert str(exc.value) == "layer 0: no tokens were added (call add() first)"
    with pytest.raises(AnalysisError) as exc:
        ActivationAccumulator(lay, meta(2, 1, 16, 5), logits=True, device="cpu")
    assert "expected W_K of shape [1, 16, 5]" in str(exc.value)


def test_share_r2_against_least_squares_with_scaled_dead_and_deficient_columns():
    """``_share_r2`` from Grams against float64 least squares on the caches themselves: columns
    scaled 1e-9..1e9 (full rank: the Cholesky path), a dead column, fewer tokens than columns and
    a column dependent on two others up to round-off (singular: the pseudo-inverse path; the last
    one's Cholesky runs through on pivots at round-off level), side by side in one stack."""
    from analysis.activations import _share_r2

    e, n = 8, 200
    base = rand(n, e, seed=1).double()
    ks = [base * torch.logspace(-9, 9, e, dtype=torch.float64),                # badly scaled, full rank
          torch.cat([base[:, :-1], torch.zeros(n, 1, dtype=torch.float64)], 1),   # a dead column
          torch.cat([base[:5], torch.zeros(n - 5, e, dtype=torch.float64)]),     # 5 tokens < 8 columns
          torch.cat([base[:, :-1], base[:, :1] * 3 + base[:, 1:2] / 7], 1)]     # dependent to round-off
    # V in K's span at unit scale (every direction of it weighs alike) plus noise outside it
    vs = [base @ rand(e, e, seed=2 + i).double() + 0.5 * rand(n, e, seed=9 + i).double() for i in range(len(ks))]
    kk = torch.stack([k.T @ k for k in ks])
    vv = torch.stack([v.T @ v for v in vs])
    kv = torch.stack([k.T @ v for k, v in zip(ks, vs)])
    got = _share_r2(kk, vv, kv, e)
    for i, (k, v) in enumerate(zip(ks, vs)):
        norms = k.norm(dim=0)
        kd = k / torch.where(norms > 0, norms, torch.ones_like(norms))      # span(K), columns of norm 1
        fit = kd @ torch.linalg.lstsq(kd, v, driver="gelsd").solution      # the projection of V on it
        want = float(fit.square().sum() / v.square().sum())
        assert float(got[i]) == pytest.approx(want, rel=1e-9), i


def test_the_jackknife_in_batches_equals_it_in_one(monkeypatch):
    from analysis import activations

    lay, m = ill_conditioned_layer()
    accs = []
    for i, logits in enumerate((True, False, True)):                  # both kinds of chance draws
        acc = ActivationAccumulator(layer(lay.W_Q, lay.W_K, lay.W_V, bq=lay.b_Q, bk=lay.b_K, index=i), m,
                                    logits=logits, device="cpu", seed=i)
        acc.add(anisotropic_x(6, 64 if i % 2 else 32, m.d_model, seed=30 + i))   # both paths (d_model 48)
        acc._reduce()                                                 # the Gram path's windows, summed
        accs.append(acc)
    whole = [a.result() for a in accs]                                # every window's leave-one-out at once
    # a budget of batches of 2 windows: the leave-one-out sums' round-off depends on the batch,
    # and these heads (condition 1e6) magnify it
    width = sum(v[0].numel() for v in accs[0]._windows[0].values())
    monkeypatch.setattr(activations, "_BOOT_BYTES", 8 * width * 4 * 2)
    batched = [a.result() for a in accs]
    for (df1, notes1), (df2, notes2) in zip(whole, batched):
        assert notes1 == notes2
        keys = ["layer", "head", "head_label", "metric", "n_tokens"]
        assert df1[keys].equals(df2[keys]) and df1.ci_low.notna().all()
        for c in ("value", "chance", "ci_low", "ci_high"):
            np.testing.assert_allclose(df2[c].to_numpy(), df1[c].to_numpy(), rtol=1e-9, atol=1e-12)
