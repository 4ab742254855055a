"""The whole layer's K and V caches: ``layer_metrics`` and the accumulator's per-layer rows against
float64 numpy references on the concatenated caches."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from analysis.activations import ActivationAccumulator, layer_groups
from analysis.layer_caches import LAYER_METRICS, layer_metrics
from tests.analysis._threads import one_thread  # noqa: F401  (autouse: one torch thread)


#: Student t 97.5% quantiles by degrees of freedom (tables; the tests use 7 and 1).
T975 = {1: 12.706204736174698, 7: 2.3646242515927849}


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def np_erank(m):
    s = np.linalg.svd(m, compute_uv=False)
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def np_cka(k, v):
    """Linear CKA as kv_similarity_llm.py's ``linear_cka`` computes it, in float64 numpy."""
    k, v = k - k.mean(0), v - v.mean(0)
    return float(np.linalg.norm(v.T @ k) ** 2 / (np.linalg.norm(k.T @ k) * np.linalg.norm(v.T @ v)))


def caches(lay, x):
    """The layer's ``[tokens, n_kv_heads*d_head]`` K and V caches, float64 numpy, head-major."""
    xs = x.double().reshape(-1, x.shape[-1]).numpy()
    out = []
    for w, b in ((lay.W_K, lay.b_K), (lay.W_V, lay.b_V)):
        a = np.concatenate(list(w.double().numpy()), 1)                 # [d, g*e]
        out.append(xs @ a + (0 if b is None else b.double().numpy().reshape(-1)))
    return out


def reference(lay, x, groups):
    """Value and interval of every per-layer metric as stored: the plain CKA, the eranks corrected
    by the delete-one-group jackknife (window w in group w % groups), the interval value -+
    t_{N-1} se."""
    def plain(xw):
        k, v = caches(lay, xw)
        return {"kv_cka_layer_act": np_cka(k, v), "erank_kcache_layer": np_erank(k), "erank_vcache_layer": np_erank(v)}

    full = plain(x)
    idx = np.arange(x.shape[0]) % groups
    used = sorted(set(idx.tolist()))
    loo = [plain(x[torch.from_numpy(idx != j)]) for j in used]
    n = len(used)
    c = lay.W_K.shape[0] * lay.W_K.shape[2]
    out = {}
    for m in LAYER_METRICS:
        th = np.array([o[m] for o in loo])
        se = math.sqrt((n - 1) / n * ((th - th.mean()) ** 2).sum())
        value = full[m] if m == "kv_cka_layer_act" else n * full[m] - (n - 1) * th.mean()
        hi = 1.0 if m == "kv_cka_layer_act" else c
        lo_ = 0.0 if m == "kv_cka_layer_act" else 1.0
        t = T975[n - 1]
        out[m] = (value, max(lo_, value - t * se), min(hi, value + t * se))
    return out


def gqa_layer(d=24, h=4, g=2, e=6, bias=True, seed=1):
    k = rand(g, d, e, seed=seed)
    v = 0.6 * k + 0.4 * rand(g, d, e, seed=seed + 1)                    # K and V partly alike
    return SimpleNamespace(layer=3, W_Q=rand(h, d, e, seed=seed + 2), W_K=k, W_V=v, W_O=rand(h, e, d, seed=seed + 3),
                           b_Q=None, b_K=rand(g, e, seed=seed + 4) if bias else None,
                           b_V=0.5 * rand(g, e, seed=seed + 5) if bias else None)


def anisotropic(windows, tokens, d, seed=20):
    return rand(windows, tokens, d, seed=seed) * torch.logspace(0, -1, d) + 0.5 * rand(d, seed=seed + 1)


@pytest.mark.parametrize("bias", [True, False])
def test_layer_metrics_equal_a_float64_reference(bias):
    lay = gqa_layer(bias=bias)
    x = anisotropic(3, 40, 24)
    xs = x.double().reshape(-1, 24)
    a = torch.cat(list(lay.W_K.double()), 1)
    b = torch.cat(list(lay.W_V.double()), 1)
    got = layer_metrics(a, b, None if not bias else lay.b_K.double().reshape(-1),
                        None if not bias else lay.b_V.double().reshape(-1), xs.T @ xs, xs.sum(0), float(len(xs)))
    k, v = caches(lay, x)
    assert float(got["kv_cka_layer_act"]) == pytest.approx(np_cka(k, v), rel=1e-9)
    assert float(got["erank_kcache_layer"]) == pytest.approx(np_erank(k), rel=1e-9)
    assert float(got["erank_vcache_layer"]) == pytest.approx(np_erank(v), rel=1e-9)


def test_equal_caches_read_cka_one_and_equal_ranks():
    lay = gqa_layer()
    lay.W_V, lay.b_V = lay.W_K.clone(), lay.b_K.clone()
    x = anisotropic(2, 50, 24)
    xs = x.double().reshape(-1, 24)
    a = torch.cat(list(lay.W_K.double()), 1)
    got = layer_metrics(a, a, lay.b_K.double().reshape(-1), lay.b_K.double().reshape(-1), xs.T @ xs, xs.sum(0),
                        float(len(xs)))
    assert float(got["kv_cka_layer_act"]) == pytest.approx(1.0, abs=1e-12)
    assert float(got["erank_kcache_layer"]) == pytest.approx(float(got["erank_vcache_layer"]), abs=1e-12)


def test_groups_are_a_power_of_two_within_the_byte_budget():
    assert [layer_groups(d) for d in (64, 1024, 1448, 2048, 4096)] == [8, 8, 4, 2, 2]


# windows of 64 tokens take the Gram path at d_model 24, of 16 tokens at d_model 48 the projection path
@pytest.mark.parametrize("d,tokens,windows", [(24, 64, 10), (48, 16, 11)])
def test_accumulator_layer_rows_equal_the_reference(d, tokens, windows):
    lay = gqa_layer(d=d)
    meta = SimpleNamespace(n_heads=4, n_kv_heads=2, d_model=d, d_head=6, norm="layernorm", variant="qkv")
    x = anisotropic(windows, tokens, d)
    acc = ActivationAccumulator(lay, meta, logits=True, device="cpu")
    acc.add(x[:4])
    acc.add(x[4:])                                       # two batches: the groups continue across them
    frame, notes = acc.result()
    rows = frame[frame["head"].isna()].set_index("metric")
    ref = reference(lay, x, layer_groups(d))
    for m in LAYER_METRICS:
        value, lo, hi = ref[m]
        r = rows.loc[m]
        assert r["layer"] == 3 and r["head_label"] == "L3" and r["n_tokens"] == windows * tokens
        assert r["value"] == pytest.approx(value, rel=1e-6), m
        assert r["ci_low"] == pytest.approx(lo, rel=1e-6) and r["ci_high"] == pytest.approx(hi, rel=1e-6), m
        assert r["chance_low"] <= r["chance"] <= r["chance_high"] and not r["degenerate"]
    assert not set(LAYER_METRICS) & set(notes)


def test_few_tokens_for_the_whole_layer_are_flagged_with_the_count_needed():
    lay = gqa_layer()
    meta = SimpleNamespace(n_heads=4, n_kv_heads=2, d_model=24, d_head=6, norm="layernorm", variant="qkv")
    acc = ActivationAccumulator(lay, meta, logits=False, device="cpu")
    acc.add(anisotropic(2, 40, 24))                      # 80 tokens: >= 8 x 6 per head, < 8 x 12 per layer
    frame, notes = acc.result()
    flagged = frame.set_index("metric")["degenerate"]
    assert not flagged["erank_kcache"].any() and flagged[list(LAYER_METRICS)].all()
    assert notes["erank_kcache_layer"] == ("degenerate: 80 tokens < 8 x n_kv_heads*d_head = 96: the value is biased "
                                           "low (the singular values of a nearly square sample spread out) (more "
                                           "tokens: analyze --tokens 96)")


def test_random_layers_sit_inside_the_null_band():
    """Layers whose K and V are drawn as the chance draws are (N(0, 1/d_model), no biases): each
    value is exchangeable with the draws, so it falls inside their 2.5-97.5% band about 90% of
    the time; 10 layers of 19 draws each."""
    d, g, e = 24, 2, 6
    meta = SimpleNamespace(n_heads=2, n_kv_heads=g, d_model=d, d_head=e, norm="layernorm", variant="qkv")
    x = anisotropic(8, 40, d)
    inside = {m: 0 for m in LAYER_METRICS}
    for seed in range(10):
        w = lambda s: rand(g, d, e, seed=100 * seed + s) / math.sqrt(d)   # noqa: E731
        lay = SimpleNamespace(layer=0, W_Q=None, W_K=w(1), W_V=w(2), W_O=rand(2, e, d), b_Q=None, b_K=None, b_V=None)
        acc = ActivationAccumulator(lay, meta, logits=False, device="cpu", n_random=19, seed=seed)
        acc.add(x)
        rows = acc.result()[0].set_index("metric")
        for m in LAYER_METRICS:
            inside[m] += bool(rows.loc[m, "chance_low"] <= rows.loc[m, "value"] <= rows.loc[m, "chance_high"])
    assert all(k >= 7 for k in inside.values()), inside


def test_related_k_and_v_read_above_the_null_band():
    lay = gqa_layer()
    meta = SimpleNamespace(n_heads=4, n_kv_heads=2, d_model=24, d_head=6, norm="layernorm", variant="qkv")
    acc = ActivationAccumulator(lay, meta, logits=False, device="cpu")
    acc.add(anisotropic(8, 40, 24))
    row = acc.result()[0].set_index("metric").loc["kv_cka_layer_act"]
    assert row["ci_low"] > row["chance_high"]


def test_two_windows_give_a_two_group_jackknife():
    lay = gqa_layer()
    meta = SimpleNamespace(n_heads=4, n_kv_heads=2, d_model=24, d_head=6, norm="layernorm", variant="qkv")
    x = anisotropic(2, 60, 24)
    acc = ActivationAccumulator(lay, meta, logits=False, device="cpu")
    acc.add(x)
    rows = acc.result()[0].set_index("metric")
    for m, (value, lo, hi) in reference(lay, x, 2).items():
        assert rows.loc[m, "value"] == pytest.approx(value, rel=1e-6)
        assert rows.loc[m, "ci_low"] == pytest.approx(lo, rel=1e-6) and rows.loc[m, "ci_high"] == pytest.approx(hi, rel=1e-6)
