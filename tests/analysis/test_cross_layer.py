"""The cross-layer metrics (analysis.cross_layer, analysis.metrics.cross_layer): float64 numpy
references, planted structure, the null band, the row estimator's error, the rows' shape."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from analysis import cross_layer, registry
from analysis.above_chance import flag
from analysis.cross_layer import CacheSample, WeightPairs, linear_cka, sample_rows, sampled_gram
from analysis.result_rows import json_rows, rows_frame

D, E, G = 48, 8, 2


def _meta(d=D, g=G, e=E):
    return SimpleNamespace(n_heads=2 * g, n_kv_heads=g, d_model=d, d_head=e, norm="layernorm", variant="qkv")


def _layer(i, gen, d=D, g=G, e=E, w_k=None):
    w = lambda: torch.randn(g, d, e, generator=gen)                      # noqa: E731
    return SimpleNamespace(layer=i, W_Q=None, W_K=w() if w_k is None else w_k, W_V=w(), W_O=None, b_Q=None,
                           b_K=None)


def _stacked(w: torch.Tensor) -> np.ndarray:
    """[heads, d, e] -> [d, heads*e] float64 (head-major columns)."""
    return w.double().permute(1, 0, 2).reshape(w.shape[1], -1).numpy()


def ref_cka(a: np.ndarray, b: np.ndarray) -> float:
    """Linear CKA (Kornblith et al. 2019) of two matrices whose rows are the samples, float64."""
    a, b = a - a.mean(0), b - b.mean(0)
    return np.linalg.norm(a.T @ b) ** 2 / (np.linalg.norm(a.T @ a) * np.linalg.norm(b.T @ b))


def ref_debiased_cka(k: np.ndarray, v: np.ndarray) -> float:
    """kv_cka_act's debiased linear CKA over the rows (tokens), float64."""
    n = len(k)
    k, v = k - k.mean(0), v - v.mean(0)
    kv, kk, vv = (np.linalg.norm(k.T @ v) ** 2, np.linalg.norm(k.T @ k) ** 2, np.linalg.norm(v.T @ v) ** 2)
    tk, tv = np.trace(k.T @ k), np.trace(v.T @ v)
    return (kv - tk * tv / (n - 1)) / np.sqrt((kk - tk ** 2 / (n - 1)) * (vv - tv ** 2 / (n - 1)))


def _weight_rows(layers, meta):
    pairs = WeightPairs()
    for lay in layers:
        pairs.add(lay, meta)
    frame, notes = pairs.result()
    return flag(frame), notes


def _value(frame, metric, l, l2):
    (v,) = frame[(frame.metric == metric) & (frame.layer == l) & (frame.layer2 == l2)]["value"].tolist()
    return v


def test_registered_as_layer_pairs():
    for name in ("xlayer_cka_wk", "xlayer_cka_wv", "xlayer_cka_kcache", "xlayer_cka_vcache", "xlayer_cos_adjacent"):
        m = registry.BY_NAME[name]
        assert (m.axis, m.family, m.direction) == ("layer_pair", "cross_layer", "max")
    assert registry.BY_NAME["xlayer_cka_wk"].chance == "monte_carlo"
    assert registry.BY_NAME["xlayer_cka_kcache"].chance == "random_projection"


def test_weight_cka_equals_float64_reference():
    gen = torch.Generator().manual_seed(1)
    layers = [_layer(i, gen) for i in range(3)]
    frame, notes = _weight_rows(layers, _meta())
    assert notes == {}
    for metric, attr in (("xlayer_cka_wk", "W_K"), ("xlayer_cka_wv", "W_V")):
        got = frame[frame.metric == metric]
        assert list(zip(got.layer, got.layer2)) == [(0, 1), (0, 2), (1, 2)]      # l < l2, no (l, l)
        assert got["head_label"].tolist() == ["L0-L1", "L0-L2", "L1-L2"] and got["head"].isna().all()
        for l, l2, v in zip(got.layer, got.layer2, got.value):
            ref = ref_cka(_stacked(getattr(layers[l], attr)), _stacked(getattr(layers[l2], attr)))
            assert v == pytest.approx(ref, abs=1e-3)


def test_equal_wk_reads_one_and_above_chance_random_inside_band():
    gen = torch.Generator().manual_seed(2)
    layers = [_layer(i, gen) for i in range(5)]
    layers[3].W_K = layers[1].W_K.clone()                              # planted: layers 1 and 3 share W_K
    frame, _ = _weight_rows(layers, _meta())
    wk = frame[frame.metric == "xlayer_cka_wk"]
    planted = (wk.layer == 1) & (wk.layer2 == 3)
    assert wk[planted]["value"].item() == pytest.approx(1.0, abs=1e-6)
    assert wk[planted]["above_chance"].item() == True  # noqa: E712
    # every other pair is a pair of independent random layers: inside the null band, not flagged
    rest = frame[~((frame.metric == "xlayer_cka_wk") & (frame.layer == 1) & (frame.layer2 == 3))]
    assert ((rest.value >= rest.chance_low) & (rest.value <= rest.chance_high)).all()
    assert not rest["above_chance"].fillna(False).any()
    # the null is that of random layers of these shapes: the chance level sits near p / (n + p)
    assert wk["chance"].iloc[0] == pytest.approx(G * E / (D + G * E), abs=0.05)


def test_rows_are_json_rows_with_layer2():
    from app.commands.analyze import _row

    gen = torch.Generator().manual_seed(3)
    frame, _ = _weight_rows([_layer(i, gen) for i in range(2)], _meta())
    rows = json_rows(frame)
    back = rows_frame(rows)
    assert back["layer2"].tolist() == [1, 1] and back["head2"].isna().all()
    out = _row(next(frame.itertuples()))
    assert out["layer"] == 0 and out["layer2"] == 1 and out["head"] is None and "head2" not in out


def test_one_layer_has_a_note_instead_of_rows():
    gen = torch.Generator().manual_seed(4)
    frame, notes = _weight_rows([_layer(0, gen)], _meta())
    assert frame.empty
    assert notes["xlayer_cka_wk"] == "no pair of layers of the same shapes (one layer, or each of its own shapes)"


def test_non_finite_layer_gives_nan_pairs():
    gen = torch.Generator().manual_seed(5)
    pairs = WeightPairs()
    for i in range(3):
        pairs.add(_layer(i, gen), _meta(), finite=i != 1)
    frame, _ = pairs.result()
    wk = frame[frame.metric == "xlayer_cka_wk"]
    assert wk["value"].isna().tolist() == [True, False, True]            # (0,1), (0,2), (1,2)


@pytest.mark.parametrize("kind", ["random", "shared", "anisotropic", "low_rank"])
def test_row_sample_estimate_within_tolerance(kind):
    """Above ROW_BOUND the CKA is estimated from sampled input dimensions (Horvitz-Thompson): its
    error against the exact value over all rows, d_model 2048 sampled to 512."""
    d, w, k = 2048, 256, 512
    gen = torch.Generator().manual_seed(6)
    a = torch.randn(d, w, generator=gen, dtype=torch.float64)
    noise = torch.randn(d, w, generator=gen, dtype=torch.float64)
    mix = torch.randn(w, w, generator=gen, dtype=torch.float64) / 16
    if kind == "random":
        b = noise
    elif kind == "shared":
        b = a @ mix + noise
    elif kind == "anisotropic":
        scale = torch.logspace(0, -2, d, dtype=torch.float64)[:, None]
        a, b = a * scale, a * scale @ mix + 0.5 * noise * scale
    else:
        u = torch.randn(d, 8, generator=gen, dtype=torch.float64)
        a = u @ torch.randn(8, w, generator=gen, dtype=torch.float64) + 0.1 * a
        b = u @ torch.randn(8, w, generator=gen, dtype=torch.float64) + 0.1 * noise
    exact = ref_cka(a.numpy(), b.numpy())
    rows = sample_rows(d, k)
    est = linear_cka(sampled_gram(a, rows), sampled_gram(b, rows), d)
    assert abs(est - exact) < 0.015
    # the plain CKA of the sampled rows is no estimate of it: its floor rises as rows are dropped
    if kind == "random":
        plain = linear_cka(sampled_gram(a[rows], None), sampled_gram(b[rows], None))
        assert plain - exact > 0.15


def test_sample_rows_bounded_and_seeded():
    assert sample_rows(100, 128) is None
    rows = sample_rows(4096)
    assert len(rows) == cross_layer.ROW_BOUND and bool((rows[1:] > rows[:-1]).all())
    assert torch.equal(rows, sample_rows(4096))


# -- activations ---------------------------------------------------------------
def _projections(gen, n_layers, d=D, g=G, e=E, bias=True, same=()):
    out = []
    for i in range(n_layers):
        w = torch.randn(d, 2 * g * e, generator=gen) / math.sqrt(d)
        b = torch.randn(2 * g * e, generator=gen) if bias else None
        out.append([i, w, b, g * e])
    for i, j in same:                                                   # planted: layer j's projections = i's
        out[j][1], out[j][2] = out[i][1], out[i][2]
    return [tuple(p) for p in out]


def _feed(sample: CacheSample, xs: list[torch.Tensor], batch: int):
    """Add each layer's input ``[N, T, d]`` in batches of windows, layer by layer within a batch (as
    the forward's hooks do)."""
    n = xs[0].shape[0]
    for lo in range(0, n, batch):
        for i, x in enumerate(xs):
            sample.add(i, x[lo:lo + batch])


def _inputs(gen, n_layers, n=8, t=24, d=D):
    base = torch.randn(n, t, d, generator=gen)
    # a residual stream: each layer's input is the previous one plus an update
    xs = [base]
    for _ in range(n_layers - 1):
        xs.append(xs[-1] + 0.7 * torch.randn(n, t, d, generator=gen))
    return xs


def test_cache_metrics_equal_float64_reference_all_tokens():
    gen = torch.Generator().manual_seed(7)
    proj, xs = _projections(gen, 3), _inputs(gen, 3)
    sample = CacheSample(proj, n_inputs=8, t=24, bound=10_000)           # every token
    _feed(sample, xs, batch=3)
    frame, notes = sample.result()
    assert notes == {}                                                  # every token, several windows
    kv = G * E
    caches = [(x.reshape(-1, D).double() @ w.double() + b.double()).numpy() for (_, w, b, _), x in zip(proj, xs)]
    for metric, cols in (("xlayer_cka_kcache", slice(0, kv)), ("xlayer_cka_vcache", slice(kv, 2 * kv))):
        got = frame[frame.metric == metric]
        assert list(zip(got.layer, got.layer2)) == [(0, 1), (0, 2), (1, 2)]
        for l, l2, v in zip(got.layer, got.layer2, got.value):
            assert v == pytest.approx(ref_debiased_cka(caches[l][:, cols], caches[l2][:, cols]), abs=1e-3)
    cos = frame[frame.metric == "xlayer_cos_adjacent"]
    assert list(zip(cos.layer, cos.layer2)) == [(0, 1), (1, 2)]             # adjacent layers only
    for l, v in zip(cos.layer, cos.value):
        a, b = caches[l], caches[l + 1]
        per = [np.mean(np.sum(a[:, c] * b[:, c], 1) / (np.linalg.norm(a[:, c], axis=1) * np.linalg.norm(b[:, c], axis=1)))
               for c in (slice(0, kv), slice(kv, 2 * kv))]
        assert v == pytest.approx(np.mean(per), abs=1e-3)
    assert (frame["n_tokens"] == 192).all()
    assert ((frame.ci_low <= frame.value) & (frame.value <= frame.ci_high)).all()


def test_cache_metrics_on_the_sampled_tokens():
    """With fewer tokens allowed than fed, every layer's value is over the same sampled tokens."""
    gen = torch.Generator().manual_seed(8)
    proj, xs = _projections(gen, 2, bias=False), _inputs(gen, 2)
    sample = CacheSample(proj, n_inputs=8, t=24, bound=100)
    _feed(sample, xs, batch=5)
    frame, notes = sample.result()
    picks = sample.picks
    assert len(picks) == 100
    assert notes == {}                                                  # n_tokens says it
    kv = G * E
    k0, k1 = ((x.reshape(-1, D)[picks].double() @ w.double())[:, :kv].numpy() for (_, w, _, _), x in zip(proj, xs))
    assert frame[frame.metric == "xlayer_cka_kcache"]["value"].item() == pytest.approx(ref_debiased_cka(k0, k1),
                                                                                        abs=1e-3)
    assert (frame["n_tokens"] == 100).all()


def test_cache_planted_sharing_found_random_inside_band():
    gen = torch.Generator().manual_seed(9)
    n, t = 16, 32
    # no biases: the chance draws have none (as every activation metric's), so a random layer's bias
    # would move its value and not its chance level
    proj = _projections(gen, 4, bias=False, same=[(1, 2)])
    base = torch.randn(n, t, D, generator=gen)
    # layers 1 and 2 read the same input through the same projections: their caches are equal;
    # layers 0 and 3 read independent inputs
    xs = [torch.randn(n, t, D, generator=gen), base, base.clone(), torch.randn(n, t, D, generator=gen)]
    sample = CacheSample(proj, n_inputs=n, t=t, bound=256)
    _feed(sample, xs, batch=4)
    frame, _ = sample.result()
    frame = flag(frame)
    shared = (frame.layer == 1) & (frame.layer2 == 2)
    for metric in ("xlayer_cka_kcache", "xlayer_cka_vcache", "xlayer_cos_adjacent"):
        row = frame[shared & (frame.metric == metric)]
        assert row["value"].item() == pytest.approx(1.0, abs=1e-6)
        assert row["above_chance"].item() == True  # noqa: E712
    # independent layers: each interval meets the null band (an activation value is tested by its
    # interval, analysis.above_chance), none is above chance
    rest = frame[~shared]
    assert ((rest.ci_low <= rest.chance_high) & (rest.ci_high >= rest.chance_low)).all()
    assert (rest["above_chance"] == False).all()  # noqa: E712


def test_one_layer_or_one_window():
    gen = torch.Generator().manual_seed(10)
    one = CacheSample(_projections(gen, 1), n_inputs=2, t=8)
    _feed(one, _inputs(gen, 1, n=2, t=8), batch=2)
    frame, notes = one.result()
    assert frame.empty and notes["xlayer_cka_kcache"] == "no pair of layers: one layer"
    win = CacheSample(_projections(gen, 2), n_inputs=1, t=64)
    _feed(win, _inputs(gen, 2, n=1, t=64), batch=1)
    frame, notes = win.result()
    assert frame["ci_low"].isna().all()
    assert notes["xlayer_cos_adjacent"] == "one window: no interval over windows (ci_low, ci_high empty)"


def test_rows_have_result_columns_and_dtypes():
    gen = torch.Generator().manual_seed(11)
    sample = CacheSample(_projections(gen, 2), n_inputs=4, t=16)
    _feed(sample, _inputs(gen, 2, n=4, t=16), batch=2)
    frame, _ = sample.result()
    assert list(frame.columns) == registry.RESULT_COLUMNS + ["p_null"]
    assert str(frame["layer2"].dtype) == "Int64" and frame["head2"].isna().all()
    assert isinstance(frame, pd.DataFrame)


def test_cka_matrix_equals_pairwise_estimates():
    """The model-level product (cka_matrix) gives each pair's linear_cka, sampled rows included."""
    gen = torch.Generator().manual_seed(12)
    d, k = 96, 40
    rows = sample_rows(d, k)
    mats = [torch.randn(d, 24, generator=gen) for _ in range(3)]
    mats.append(mats[0] @ torch.randn(24, 24, generator=gen) + 0.3 * torch.randn(d, 24, generator=gen))
    grams = [sampled_gram(m, rows) for m in mats] + [None]
    got = cross_layer.cka_matrix(grams, d)
    for i in range(4):
        for j in range(4):
            assert float(got[i, j]) == pytest.approx(linear_cka(grams[i], grams[j], d), abs=1e-5)
    assert torch.isnan(got[4]).all() and torch.isnan(got[:, 4]).all()
