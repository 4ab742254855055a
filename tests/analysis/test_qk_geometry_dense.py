"""``qk_geometry.dense_layer_scores``: the layer's scores from ``M`` formed once in float32
(bf16 inputs on oneDNN where the weights are bfloat16 values), against the float64
references of ``test_qk_geometry.py``, and the weight analysis choosing it for wide kv stacks."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from analysis import qk_geometry, weights
from tests.analysis.test_qk_geometry import D, E, ill_conditioned, layer_m, rand, ref_directionality, ref_sym


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("n_heads,n_kv", [(6, 6), (6, 2), (6, 1)])
def test_dense_scores_match_float64(n_heads, n_kv, bf16):
    q, k = rand(n_heads, D, E, seed=1), rand(n_kv, D, E, seed=2)
    k[:, :3] *= 6.0                                      # key-side outliers: a directionality well above 0
    if bf16:                                             # bfloat16 values held as float32 (the fast path)
        q, k = q.bfloat16().float(), k.bfloat16().float()
    assert qk_geometry._exact_bf16(q) is bf16 and qk_geometry._exact_bf16(k) is bf16
    m = layer_m(q, k)
    sym, direction = qk_geometry.dense_layer_scores(q, k)
    assert sym == pytest.approx(ref_sym(m), rel=1e-6)
    assert direction == pytest.approx(ref_directionality(m), rel=1e-5)
    assert direction > 0.1


@pytest.mark.parametrize("cond", [1e3, 1e6])
def test_dense_scores_on_ill_conditioned_heads(cond):
    q = ill_conditioned(4, D, E, cond, seed=10)
    k = ill_conditioned(4, D, E, cond, seed=40)
    k[:, :2] *= 5.0
    m = layer_m(q, k)
    sym, direction = qk_geometry.dense_layer_scores(q, k)
    assert sym == pytest.approx(ref_sym(m), rel=1e-6)
    assert direction == pytest.approx(ref_directionality(m), rel=1e-3, abs=1e-9)


def test_the_bf16_switch_is_restored():
    flag = torch.backends.mkldnn.matmul
    before = flag.fp32_precision
    with qk_geometry._bf16_inputs(True):
        assert flag.fp32_precision == "bf16"
    assert flag.fp32_precision == before
    with pytest.raises(ValueError), qk_geometry._bf16_inputs(True):
        raise ValueError
    assert flag.fp32_precision == before


def test_weight_metrics_takes_the_dense_path_for_a_wide_kv_stack(monkeypatch):
    """MHA (n_kv d_head = d_model): ``M`` once; a narrow GQA stack: the thin float64 pieces."""
    used = []
    real_dense, real_form = qk_geometry.dense_layer_scores, qk_geometry.layer_form
    monkeypatch.setattr(qk_geometry, "dense_layer_scores", lambda *a, **kw: used.append("dense") or real_dense(*a, **kw))
    monkeypatch.setattr(qk_geometry, "layer_form", lambda *a, **kw: used.append("thin") or real_form(*a, **kw))
    for h, g, expect in ((8, 8, "dense"), (8, 1, "thin")):
        d, e = 64, 8                                     # d_model < 8 * g * e only for g = 8
        layer = SimpleNamespace(layer=0, W_Q=rand(h, d, e, seed=1), W_K=rand(g, d, e, seed=2),
                                W_V=rand(g, d, e, seed=3), W_O=rand(h, e, d, seed=4), b_Q=None, b_K=None)
        meta = SimpleNamespace(n_heads=h, n_kv_heads=g, d_model=d, d_head=e, norm="rmsnorm", variant="qkv")
        used.clear()
        df, _ = weights.weight_metrics(layer, meta, device="cpu")
        assert used == [expect]
        (sym,) = df[(df.metric == "qk_symmetry") & df["head"].isna()]["value"].tolist()
        assert sym == pytest.approx(ref_sym(layer_m(layer.W_Q, layer.W_K)), rel=1e-6)


def test_exact_bf16_reads_every_layout():
    w = torch.randn(6, 40, 8).bfloat16().float()                       # [heads, d_model, d_head]
    for t in (w, w.mT, qk_geometry.stack_heads(w), w[:, ::2]):            # contiguous, transposed, strided
        assert qk_geometry._exact_bf16(t)
        bumped = t.clone()
        at = (1,) * t.dim()
        bumped[at] = 1.0 + 2 ** -20                                     # a float32 that bfloat16 cannot hold
        assert not qk_geometry._exact_bf16(bumped)
