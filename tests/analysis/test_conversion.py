"""Known answers of the post-hoc conversions (float64)."""
import pytest
import torch

from analysis.conversion import ConversionError, convert, gqa, input_stats, k_eq_v, latent, psd_share, q_eq_k
from loaders.canonical import AttentionWeights

D, DH = 12, 3


def _layer(h=4, g=4, kv_equal=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    wk = r(g, D, DH)
    return AttentionWeights(0, r(h, D, DH), wk, wk.clone() if kv_equal else r(g, D, DH), r(h, DH, D))


def _x(n=400, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, D, generator=gen, dtype=torch.float64) @ torch.randn(D, D, generator=gen, dtype=torch.float64)


def _attn(layer, x):
    """Causal attention output of one sequence x [T, D] (query head h reads kv head h // per)."""
    per = layer.W_O.shape[0] // layer.W_K.shape[0]
    out = torch.zeros(x.shape[0], D, dtype=torch.float64)
    mask = torch.ones(x.shape[0], x.shape[0]).tril().bool()
    for h in range(layer.W_O.shape[0]):
        q, k, v = x @ layer.W_Q[h], x @ layer.W_K[h // per], x @ layer.W_V[h // per]
        p = torch.softmax((q @ k.T / DH ** 0.5).masked_fill(~mask, -torch.inf), -1)
        out += p @ v @ layer.W_O[h]
    return out


@pytest.mark.parametrize("method", ["lstsq", "keep_k", "keep_v", "avg"])
def test_k_eq_v_of_a_k_eq_v_layer_changes_nothing(method):
    layer, x = _layer(kv_equal=True), _x()
    out = convert(layer, "k_eq_v", method, input_stats(x))
    assert torch.equal(out.W_K, out.W_V)
    assert torch.allclose(_attn(out, x[:40]), _attn(layer, x[:40]), atol=1e-8)


def test_lstsq_fits_values_no_worse_than_keep_k():
    layer, x = _layer(), _x()
    st = input_stats(x)
    err = {m: (_attn(k_eq_v(layer, m, st), x[:60]) - _attn(layer, x[:60])).norm() for m in ("lstsq", "keep_k")}
    assert err["lstsq"] < err["keep_k"]
    # in value space, on the captured inputs: ||K T - V|| <= ||K - V||
    conv = k_eq_v(layer, "lstsq", st)
    fit = sum(((x @ layer.W_K[g]) @ t - x @ layer.W_V[g]).norm() ** 2 for g, t in enumerate(
        __import__("analysis.conversion", fromlist=["share_map"]).share_map(layer, st)))
    keep = sum((x @ layer.W_K[g] - x @ layer.W_V[g]).norm() ** 2 for g in range(4))
    assert fit <= keep
    assert conv.W_O.shape == layer.W_O.shape


def test_input_is_not_modified():
    layer = _layer()
    before = {k: v.clone() for k, v in layer.tensors().items()}
    for target, m in (("k_eq_v", "lstsq"), ("q_eq_k", "psd"), ("gqa", "aligned"), ("latent", "svd")):
        convert(layer, target, m, input_stats(_x()), groups=2, rank=4)
    assert all(torch.equal(before[k], v) for k, v in layer.tensors().items())


@pytest.mark.parametrize("method", ["mean", "aligned"])
def test_gqa_with_every_head_its_own_group_changes_nothing(method):
    layer, x = _layer(), _x()
    out = gqa(layer, 4, method, input_stats(x))
    assert all(torch.allclose(a, b) for a, b in zip(out.tensors().values(), layer.tensors().values()))


@pytest.mark.parametrize("method", ["mean", "aligned"])
def test_gqa_with_a_grouping_pools_heads_that_are_equal_though_not_adjacent(method):
    """kv heads 0 = 2 and 1 = 3 (8 query heads): the grouping {0, 2}, {1, 3} (the best free one,
    analysis.head_grouping) converts to 2 kv heads without changing the output; contiguous pooling does not."""
    from analysis.head_grouping import best_grouping, frobenius_gram

    layer, x = _layer(h=8, g=4), _x()
    for t in (layer.W_K, layer.W_V):
        t[2], t[3] = t[0], t[1]
    grouping = best_grouping(frobenius_gram(layer.W_K), 2).groups
    assert grouping == ((0, 2), (1, 3))
    out = convert(layer, "gqa", method, input_stats(x), groups=2, grouping=grouping)
    assert out.W_K.shape == (2, D, DH)
    assert torch.allclose(_attn(out, x[:40]), _attn(layer, x[:40]), atol=1e-8)
    plain = convert(layer, "gqa", method, input_stats(x), groups=2)
    assert not torch.allclose(_attn(plain, x[:40]), _attn(layer, x[:40]), atol=1e-3)


def test_regroup_is_the_same_function_and_refuses_a_grouping_that_is_no_partition():
    from analysis.conversion import regroup

    layer, x = _layer(h=8, g=4), _x()
    moved = regroup(layer, ((3, 1), (0, 2)))
    assert torch.equal(moved.W_K[0], layer.W_K[3]) and torch.equal(moved.W_Q[0], layer.W_Q[6])
    assert torch.allclose(_attn(moved, x[:40]), _attn(layer, x[:40]), atol=1e-10)
    with pytest.raises(ConversionError, match=r"^layer 0: grouping \[\[0, 1\], \[1, 2\]\] is not a partition of "
                                              r"its 4 kv heads into groups of one size$"):
        regroup(layer, ((0, 1), (1, 2)))
    with pytest.raises(ConversionError, match=r"^layer 0: grouping has 1 groups, expected 2$"):
        gqa(layer, 2, grouping=((0, 1, 2, 3),))


@pytest.mark.parametrize("method", ["mean", "aligned"])
def test_mqa_of_equal_kv_heads_changes_nothing(method):
    layer, x = _layer(), _x()
    layer.W_K[:] = layer.W_K[0]
    layer.W_V[:] = layer.W_V[0]
    out = convert(layer, "mqa", method, input_stats(x))
    assert out.W_K.shape == (1, D, DH)
    assert torch.allclose(_attn(out, x[:40]), _attn(layer, x[:40]), atol=1e-8)


def test_aligned_recovers_rotated_heads_that_mean_pooling_loses():
    """Two kv heads that differ by an orthogonal map of d_head: aligned pooling is exact, mean is not."""
    layer, x = _layer(h=2, g=2), _x()
    rot = torch.linalg.qr(torch.randn(DH, DH, dtype=torch.float64, generator=torch.Generator().manual_seed(5)))[0]
    layer.W_K[1] = layer.W_K[0] @ rot
    layer.W_V[1] = layer.W_V[0] @ rot
    ref = _attn(layer, x[:40])
    aligned = (_attn(convert(layer, "mqa", "aligned", input_stats(x)), x[:40]) - ref).abs().max()
    mean = (_attn(convert(layer, "mqa", "mean", input_stats(x)), x[:40]) - ref).abs().max()
    assert aligned < 1e-8 < mean


def test_psd_of_a_psd_head_is_exact_and_beats_keeping_k():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(D, DH, generator=gen, dtype=torch.float64)
    got = psd_share(w[None], w)
    assert torch.allclose(got @ got.T, w @ w.T, atol=1e-10)
    layer = _layer()
    for h in range(4):
        m = layer.W_Q[h] @ layer.W_K[h].T
        sym = (m + m.T) / 2
        psd = q_eq_k(layer, "psd").W_K[h]
        keep = layer.W_K[h]
        assert (psd @ psd.T - sym).norm() <= (keep @ keep.T - sym).norm()


def test_q_eq_k_ties_query_to_key():
    out = q_eq_k(_layer(h=4, g=2), "keep_k")
    assert torch.equal(out.W_Q, out.W_K.repeat_interleave(2, dim=0))


def test_latent_of_full_rank_is_exact_and_rank_checked():
    layer, x = _layer(h=2, g=2), _x()
    out, down, up = latent(layer, 2 * 2 * DH, input_stats(x))
    assert torch.allclose(out.W_K, layer.W_K) and torch.allclose(out.W_V, layer.W_V)
    assert down.shape == (D, 12) and up.shape == (12, 12)
    with pytest.raises(ConversionError, match=r"layer 0: latent rank 13 outside 1\.\.12 \(2 n_kv_heads d_head\)"):
        latent(layer, 13, input_stats(x))


def test_errors_name_the_problem():
    with pytest.raises(ConversionError, match=r"layer 0: 4 kv heads cannot be pooled into 3 groups \(expected a divisor of 4\)"):
        gqa(_layer(), 3)
    with pytest.raises(ConversionError, match="k_eq_v: unknown method 'x': expected one of lstsq, keep_k, keep_v, avg"):
        convert(_layer(), "k_eq_v", "x")


def test_absorbing_the_query_is_exact_on_the_changed_basis():
    """Theorem (query-free attention): without norms, x~ = x A + b_Q gives the same logits and values."""
    from analysis.conversion import absorb_query, polar_remainder

    layer = _layer(h=4, g=2)                                  # 4 heads x 3 = 12 = d_model
    gen = torch.Generator().manual_seed(7)
    layer.b_Q, layer.b_K, layer.b_V = (torch.randn(n, DH, generator=gen, dtype=torch.float64) for n in (4, 2, 2))
    out, a = absorb_query(layer)
    x = _x(20)
    xt = x @ a + layer.b_Q.reshape(-1)
    for h in range(4):
        q, q2 = x @ layer.W_Q[h] + layer.b_Q[h], xt[:, h * DH:(h + 1) * DH]
        k, k2 = x @ layer.W_K[h // 2] + layer.b_K[h // 2], xt @ out.W_K[h // 2] + out.b_K[h // 2]
        v, v2 = x @ layer.W_V[h // 2] + layer.b_V[h // 2], xt @ out.W_V[h // 2] + out.b_V[h // 2]
        assert torch.allclose(q @ k.T, q2 @ k2.T, atol=1e-8) and torch.allclose(v, v2, atol=1e-8)
    assert out.W_Q is None
    q = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=torch.float64))[0]
    assert polar_remainder(3 * q) < 1e-12 < polar_remainder(a)
    with pytest.raises(ConversionError, match="layer 0: n_heads \\* d_head = 6 is not d_model = 12"):
        absorb_query(_layer(h=2, g=2))


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_query_basis_is_the_nearest_rotation_and_keeps_the_mean_direction_under_layernorm(norm):
    from analysis.conversion import query_basis

    gen = torch.Generator().manual_seed(11)
    u = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=torch.float64))[0]
    if norm == "layernorm":   # a rotation fixing 1 (or mapping it to -1): what LayerNorm commutes with
        ones = torch.full((D, 1), D ** -0.5, dtype=torch.float64)
        n = torch.linalg.qr(torch.cat([ones, torch.eye(D, dtype=torch.float64)[:, :D - 1]], 1))[0][:, 1:]
        u = ones @ ones.T + n @ torch.linalg.qr(torch.randn(D - 1, D - 1, generator=gen, dtype=torch.float64))[0] @ n.T
    m, minv = query_basis([2.0 * u, 5.0 * u], norm)
    assert torch.allclose(m, u, atol=1e-12) and torch.allclose(m @ minv, torch.eye(D, dtype=torch.float64), atol=1e-12)
    m, _ = query_basis([-2.0 * u, 5.0 * u], norm)               # a sign moves into the key: +-u
    assert min((m - u).abs().max(), (m + u).abs().max()) < 1e-12
    m, _ = query_basis([torch.randn(D, D, generator=gen, dtype=torch.float64) for _ in range(3)], norm)
    assert torch.allclose(m.T @ m, torch.eye(D, dtype=torch.float64), atol=1e-12)
    if norm == "layernorm":
        assert torch.allclose(m @ torch.ones(D, dtype=torch.float64), torch.ones(D, dtype=torch.float64), atol=1e-12)


def test_wq_identity_is_a_whole_model_conversion():
    with pytest.raises(ConversionError, match="wq_identity changes the basis of the whole residual stream"):
        convert(_layer(), "wq_identity")
