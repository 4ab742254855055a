"""Known answers, invariances and float64 references for the weight-level metrics."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from analysis import kv_similarity, qk_geometry, query_absorb, registry, spectra
from analysis._linalg import identity_queries, kv_index, spectrum_stats
from analysis.errors import AnalysisError
from analysis.weights import weight_metrics

torch.manual_seed(0)
D, E = 48, 8


def rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def rotation(n, seed=1):
    q, _ = torch.linalg.qr(rand(n, n, seed=seed).double())
    return q.float()


# -- float64 references: the straightforward formulas, numpy ------------------
def ref_cos(k, v):
    k, v = k.ravel(), v.ravel()
    return k @ v / np.linalg.norm(k) / np.linalg.norm(v)


def ref_cka(k, v, center=False):
    if center:
        k, v = k - k.mean(0), v - v.mean(0)
    return np.linalg.norm(k.T @ v) ** 2 / (np.linalg.norm(k.T @ k) * np.linalg.norm(v.T @ v))


def ref_r2(k, v):
    t = np.linalg.lstsq(k, v, rcond=None)[0]
    return 1 - np.linalg.norm(v - k @ t) ** 2 / np.linalg.norm(v) ** 2


def ref_sym(m):
    return np.linalg.norm((m + m.T) / 2) ** 2 / np.linalg.norm(m) ** 2


def ref_stats(a, keep=None):
    s = np.linalg.svd(a, compute_uv=False)[:keep]
    p = s / s.sum()
    e = s ** 2
    frac = np.cumsum(e) / e.sum()
    return {"erank": math.exp(-(p * np.log(p)).sum()), "stable_rank": e.sum() / e[0],
            "energy_rank90": int(np.searchsorted(frac, 0.9) + 1),
            "energy_rank99": int(np.searchsorted(frac, 0.99) + 1)}


# -- known answers -----------------------------------------------------------
def test_k_equals_v_gives_one():
    k = rand(3, D, E)
    for f in (kv_similarity.cosine_flat, kv_similarity.linear_cka, kv_similarity.share_r2):
        np.testing.assert_allclose(f(k, k.clone()).numpy(), 1.0, atol=1e-6)


def test_q_equals_k_symmetric_and_antisymmetric_zero():
    k = rand(2, D, E)
    np.testing.assert_allclose(qk_geometry.symmetry_per_head(k.clone(), k, torch.arange(2)).numpy(), 1.0, atol=1e-6)
    assert qk_geometry.symmetry_layer(k.clone(), k) == pytest.approx(1.0, abs=1e-6)
    # M = A B^T - B A^T is antisymmetric: Q = [A, B], K = [B, -A] (d_head 2E)
    a, b = rand(1, D, E, seed=3), rand(1, D, E, seed=4)
    q, kk = torch.cat([a, b], -1), torch.cat([b, -a], -1)
    assert float(qk_geometry.symmetry_per_head(q, kk, torch.arange(1))[0]) == pytest.approx(0.0, abs=1e-6)


def test_identity_slice_has_full_erank():
    eye = identity_queries(6, D, E, "cpu")
    st = spectra.tall_stats(eye)
    np.testing.assert_allclose(st["erank"].numpy(), E, rtol=1e-6)
    np.testing.assert_allclose(st["stable_rank"].numpy(), E, rtol=1e-6)
    np.testing.assert_allclose(st["energy_rank99"].numpy(), E)


def test_zero_head_is_nan_not_zero():
    k = rand(2, D, E)
    v = k.clone()
    v[1] = 0
    r2 = kv_similarity.share_r2(k, v)
    assert math.isnan(float(r2[1])) and float(r2[0]) == pytest.approx(1.0, abs=1e-6)
    assert math.isnan(float(spectrum_stats(torch.zeros(1, 4))["erank"][0]))


# -- invariance ----------------------------------------------------------------
def test_rotation_invariance_and_flat_cosine_changes():
    k = rand(1, D, E, seed=5)
    v = k + 0.3 * rand(1, D, E, seed=6)
    r1, r2 = rotation(E, 7), rotation(E, 8)
    kr, vr = k @ r1, v @ r2
    for f in (kv_similarity.linear_cka, kv_similarity.share_r2):
        assert float(f(kr, vr)[0]) == pytest.approx(float(f(k, v)[0]), rel=1e-4)
    assert abs(float(kv_similarity.cosine_flat(kr, vr)[0]) - float(kv_similarity.cosine_flat(k, v)[0])) > 0.1
    q = rand(1, D, E, seed=9)
    s0 = float(qk_geometry.symmetry_per_head(q, k, torch.arange(1))[0])
    s1 = float(qk_geometry.symmetry_per_head(q @ r1, k @ r1, torch.arange(1))[0])
    assert s1 == pytest.approx(s0, rel=1e-4)
    e0 = spectra.qk_stats(q, k, torch.arange(1))["erank"]
    e1 = spectra.qk_stats(q @ r1, k @ r1, torch.arange(1))["erank"]
    np.testing.assert_allclose(e1.numpy(), e0.numpy(), rtol=1e-4)


# -- float64 references on random weights ------------------------------------
def test_kv_metrics_match_reference():
    k, v = rand(4, D, E, seed=10), rand(4, D, E, seed=11) + 0.5 * rand(4, D, E, seed=10)
    kn, vn = k.double().numpy(), v.double().numpy()
    for h in range(4):
        assert float(kv_similarity.cosine_flat(k, v)[h]) == pytest.approx(ref_cos(kn[h], vn[h]), abs=1e-5)
        assert float(kv_similarity.linear_cka(k, v)[h]) == pytest.approx(ref_cka(kn[h], vn[h]), abs=1e-5)
        assert float(kv_similarity.linear_cka(k, v, center=True)[h]) == pytest.approx(
            ref_cka(kn[h], vn[h], center=True), abs=1e-5)
        assert float(kv_similarity.share_r2(k, v)[h]) == pytest.approx(ref_r2(kn[h], vn[h]), abs=1e-5)


@pytest.mark.parametrize("n_heads,n_kv", [(6, 6), (6, 2), (6, 1)])
def test_qk_and_spectra_match_reference(n_heads, n_kv):
    q, k = rand(n_heads, D, E, seed=12), rand(n_kv, D, E, seed=13)
    o = rand(n_heads, E, D, seed=14)
    kv_of = kv_index(n_heads, n_kv, "cpu")
    qn, kn, on = q.double().numpy(), k.double().numpy(), o.double().numpy()
    sym = qk_geometry.symmetry_per_head(q, k, kv_of)
    qks = spectra.qk_stats(q, k, kv_of)
    qs, os_ = spectra.tall_stats(q), spectra.wide_stats(o)
    for h in range(n_heads):
        m = qn[h] @ kn[int(kv_of[h])].T                      # d_model x d_model, fine in a test
        assert float(sym[h]) == pytest.approx(ref_sym(m), abs=1e-5)
        for stats, a in ((qks, m), (qs, qn[h]), (os_, on[h])):
            # M has rank d_head: its other singular values are round-off zeros
            ref = ref_stats(a, keep=E)
            for name, val in ref.items():
                assert float(stats[name][h]) == pytest.approx(val, rel=1e-4), name
    m_layer = sum(qn[h] @ kn[int(kv_of[h])].T for h in range(n_heads))
    assert qk_geometry.symmetry_layer(q, k) == pytest.approx(ref_sym(m_layer), abs=1e-5)


def test_qk_spectra_of_rank_deficient_heads():
    # Q_h of rank 4 (of d_head 8): M_h has 4 nonzero singular values, the rest exact zeros
    q = rand(3, D, 4, seed=15) @ rand(3, 4, E, seed=16)
    k = rand(1, D, E, seed=17)
    qn, kn = q.double().numpy(), k.double().numpy()
    st = spectra.qk_stats(q, k, kv_index(3, 1, "cpu"))
    for h in range(3):
        for name, val in ref_stats(qn[h] @ kn[0].T, keep=4).items():
            assert float(st[name][h]) == pytest.approx(val, rel=1e-4), name


def ref_defect(s):
    """log(arithmetic / geometric mean of sigma^2), float64."""
    e = s.astype(np.float64) ** 2
    return math.log(e.mean()) - np.log(e).mean()


def test_condition_and_defect_reference():
    q = rand(6, D, E, seed=21)                               # 6*8 = 48 = D, square
    a = q.permute(1, 0, 2).reshape(D, D).double().numpy()
    s = np.linalg.svd(a, compute_uv=False)
    cond, defect = query_absorb.condition_and_defect(q)
    assert cond == pytest.approx(s[0] / s[-1], rel=1e-3)
    assert defect == pytest.approx(ref_defect(s), rel=1e-4)
    st = query_absorb.stacked_spectrum(q)
    assert st.sigma_max == pytest.approx(s[0], rel=1e-5)
    assert st.fro2 == pytest.approx((s ** 2).sum(), rel=1e-5)
    assert st.log_abs_det == pytest.approx(np.linalg.slogdet(a)[1], abs=1e-3)
    rot = rotation(D, 22).view(D, 6, E).permute(1, 0, 2) * 3.0   # scaled orthogonal
    c2, d2 = query_absorb.condition_and_defect(rot)
    assert c2 == pytest.approx(1.0, abs=1e-4) and d2 == pytest.approx(0.0, abs=1e-5)


def _with_singular_values(s, seed):
    """A square stacked W_Q ``[heads, n, d_head]`` (d_head = 8) with singular values ``s`` (float64 build)."""
    n = len(s)
    u = torch.linalg.qr(rand(n, n, seed=seed).double())[0]
    v = torch.linalg.qr(rand(n, n, seed=seed + 1).double())[0]
    a = (u * torch.as_tensor(s, dtype=torch.float64)) @ v.T              # [n, n]
    return a.float().view(n, n // 8, 8).permute(1, 0, 2).contiguous()


@pytest.mark.parametrize("top_gap", [1e-1, 1e-3, 0.0])
def test_stacked_spectrum_known_singular_values(top_gap):
    # clustered top singular values are Lanczos' slow case; the answer is exact by construction
    n = 256
    s = np.geomspace(1.0, 1e-3, n)
    s[:4] = [1.0, 1.0 - top_gap, 1.0 - 2 * top_gap, 1.0 - 3 * top_gap]
    st = query_absorb.stacked_spectrum(_with_singular_values(s, seed=40))
    # sigma_max is computed to max(1e-6, eps32 * condition / 10) = 1.2e-5 here; allow twice that
    assert st.sigma_max == pytest.approx(1.0, rel=2.4e-5)
    assert st.sigma_min == pytest.approx(1e-3, rel=1e-3)           # float32 LU: ~eps32 * condition
    assert st.condition == pytest.approx(1e3, rel=1e-3)
    assert st.orth_defect == pytest.approx(ref_defect(s), rel=1e-4)


@pytest.mark.parametrize("cond, separated, float64_lu", [(1e4, True, False), (1e6, True, False),
                                                         (1e4, False, True), (1e8, True, True)])
def test_ill_conditioned_stack_refined_through_the_float32_lu(cond, separated, float64_lu, monkeypatch):
    # past REDO_CONDITION sigma_min is refined through the float32 LU and certified; a smallest
    # singular value inside a tight cluster (the 16 smallest 1.2% apart) is not certified in _STEPS
    # steps, and past REFINE_CONDITION (~2e6) the refinement cannot converge: both take a float64
    # LU. Either way: float64 svdvals / slogdet to 1e-4. (A plain geometric spectrum, neighbours
    # 3.6% apart, is certified since the Lanczos vectors it starts from converge further:
    # query_absorb._GAP_DISTRUST.)
    n = 256
    s = np.concatenate([np.geomspace(1.0, 1.3 / cond, n - 16), np.geomspace(1.2 / cond, 1.0 / cond, 16)])
    if separated:                                   # sigma_min a third of the next (a Gaussian's is apart too)
        s = np.geomspace(1.0, 3.0 / cond, n)
        s[-1] = 1.0 / cond
    q = _with_singular_values(s, seed=44)
    a = query_absorb.stack_queries(q).double()
    ref = torch.linalg.svdvals(a)
    factorised = []
    real = torch.linalg.lu_factor_ex
    monkeypatch.setattr(torch.linalg, "lu_factor_ex", lambda x, **kw: factorised.append(x.dtype) or real(x, **kw))
    st = query_absorb.stacked_spectrum(q)
    assert (torch.float64 in factorised) == float64_lu
    assert st.condition == pytest.approx(float(ref[0] / ref[-1]), rel=1e-4)
    ld = float(torch.linalg.slogdet(a)[1])
    assert st.orth_defect == pytest.approx(math.log(float((ref ** 2).mean())) - 2 * ld / n, rel=1e-4)


def test_refined_solve_gives_up_when_the_lu_is_not_accurate_enough():
    # an LU of another matrix: the corrections do not shrink, so the refinement says so (None)
    a = torch.linalg.qr(rand(64, 64, seed=45).double())[0].float() * torch.linspace(1, 2, 64)
    other = a + 0.5 * rand(64, 64, seed=46)
    lu, piv = torch.linalg.lu_factor(other)
    assert query_absorb._refined_solve(a.double(), lu, piv, torch.ones(64, 2, dtype=torch.float64),
                                       adjoint=False) is None


@pytest.mark.parametrize("block", [1, 8])
def test_top_singular_value_blocks(block):
    # plain Lanczos (CPU) and block Lanczos (GPU) on clustered top singular values
    s = np.geomspace(1.0, 1e-2, 256)
    s[:4] = [1.0, 0.9995, 0.999, 0.9985]
    a = query_absorb.stack_queries(_with_singular_values(s, seed=43))
    top = query_absorb._largest_sv_squared(lambda x: a @ x, lambda y: a.mT @ y, 256, "cpu", block=block, rtol=1e-6)
    assert top == pytest.approx(1.0, rel=2e-6)


def test_stacked_spectrum_singular_and_zero():
    q = rand(6, D, E, seed=41)
    q[2] = 0                                                # 8 zero columns: exactly singular
    st = query_absorb.stacked_spectrum(q)
    assert st.condition == math.inf and st.orth_defect == math.inf and st.sigma_min == 0.0
    z = query_absorb.stacked_spectrum(torch.zeros(6, D, E))
    assert z.condition == math.inf and math.isnan(z.orth_defect)


def test_stacked_spectrum_not_square_uses_svd():
    q = rand(4, D, E, seed=42)                              # 48 x 32
    a = q.permute(1, 0, 2).reshape(D, 4 * E).double().numpy()
    s = np.linalg.svd(a, compute_uv=False)
    st = query_absorb.stacked_spectrum(q)
    assert st.condition == pytest.approx(s[0] / s[-1], rel=1e-4)
    assert math.isnan(st.orth_defect)


def test_absorb_error_is_round_off_for_no_norm_model():
    q, k = rand(6, D, E, seed=23), rand(2, D, E, seed=24)
    bq, bk = rand(6, E, seed=25), rand(2, E, seed=26)
    assert query_absorb.absorb_error(q, k, bq, bk) < 1e-4
    # a singular W_Q cannot be absorbed: the error is large
    q2 = q.clone()
    q2[1] = q2[0]
    assert query_absorb.absorb_error(q2, k, None, None) > 1e-2 or not math.isfinite(
        query_absorb.absorb_error(q2, k, None, None))


# -- the layer orchestrator ---------------------------------------------------
def _layer(n_heads=6, n_kv=2, identity=False, seed=30):
    return SimpleNamespace(layer=3, W_Q=None if identity else rand(n_heads, D, E, seed=seed),
                           W_K=rand(n_kv, D, E, seed=seed + 1), W_V=rand(n_kv, D, E, seed=seed + 2),
                           W_O=rand(n_heads, E, D, seed=seed + 3), b_Q=None, b_K=None)


def _meta(n_heads=6, n_kv=2, norm="layernorm", variant="qkv"):
    return SimpleNamespace(n_heads=n_heads, n_kv_heads=n_kv, d_model=D, d_head=E, norm=norm, variant=variant)


STATS = ("erank", "stable_rank", "energy_rank90", "energy_rank99")


def layer_note(what, width=D):
    return (f"{what}: per head only; the per-layer value needs the full spectrum of the layer's stacked "
            f"{D} x {width} matrix, an O(d_model^3) eigen-decomposition per layer that the default "
            f"analysis leaves out")


PER_LAYER = {m.name for m in registry.METRICS if m.level == "weights" and m.axis != "layer_pair"}


def test_weight_metrics_all_registered_and_tidy():
    df, notes = weight_metrics(_layer(), _meta(), device="cpu")
    assert list(df.columns) == registry.COLUMNS + registry.PAIR_COLUMNS + ["degenerate"]
    assert not df["degenerate"].any()
    # the layer_pair metrics come from the model-level pass (analysis.cross_layer), not per layer
    assert set(df["metric"]) | set(notes) == PER_LAYER
    per_layer_absent = {f"{s}_{p}": layer_note(w) for p, w in (("q", "W_Q"), ("o", "W_O")) for s in STATS}
    assert notes == {"wq_absorb_error": "model uses layernorm: the conversion is not exact through the norm, "
                                        "see wq_basis_orth_defect", **per_layer_absent}
    # the only notes on metrics that do have rows: their per-layer values are absent
    assert set(df["metric"]) & set(notes) == set(per_layer_absent)
    assert df[(df.metric.isin(per_layer_absent)) & df["head"].isna()].empty
    assert df[df.metric == "kv_cka"]["head_label"].tolist() == ["L3KV0", "L3KV1"]
    assert df[(df.metric == "qk_symmetry") & df["head"].isna()]["head_label"].tolist() == ["L3"]
    assert len(df[df.metric == "erank_q"]) == 6
    assert df[df.metric == "erank_k"]["head_label"].tolist() == ["L3KV0", "L3KV1", "L3"]


def test_weight_metrics_identity_query_says_why():
    df, notes = weight_metrics(_layer(identity=True), _meta(variant="wq_identity"), device="cpu")
    why = "W_Q is the identity slice (query-free model): there is no query projection"
    for m in ("erank_q", "stable_rank_q", "wq_condition", "wq_basis_orth_defect", "wq_absorb_error", "norm_q"):
        assert notes[m] == why
        assert m not in set(df.metric)
    assert notes["erank_o"] == layer_note("W_O")
    assert set(df.metric) | set(notes) == PER_LAYER
    qk = df[df.metric == "qk_symmetry"]
    assert qk["value"].notna().all() and len(qk) == 7


def test_weight_metrics_no_norm_reports_absorb_error():
    df, notes = weight_metrics(_layer(), _meta(norm="none"), device="cpu")
    assert float(df[df.metric == "wq_absorb_error"]["value"].iloc[0]) < 1e-4
    assert notes["wq_basis_orth_defect"] == (
        "no normalisation: any invertible change of basis is absorbable, see wq_absorb_error")
    assert "wq_absorb_error" not in notes


def _layer_value(df, metric):
    (val,) = df[(df.metric == metric) & df["head"].isna()]["value"].tolist()
    return val


def test_layer_kv_spectra_match_reference():
    layer = _layer(n_heads=6, n_kv=2, seed=50)
    df, _ = weight_metrics(layer, _meta(), device="cpu")
    for p, w in (("k", layer.W_K), ("v", layer.W_V)):
        stacked = w.double().permute(1, 0, 2).reshape(D, 2 * E).numpy()     # [d_model, n_kv*d_head]
        for name, val in ref_stats(stacked).items():
            assert _layer_value(df, f"{name}_{p}") == pytest.approx(val, rel=1e-5), (p, name)


def test_layer_kv_spectra_known_answers():
    layer = _layer(n_heads=6, n_kv=2, seed=51)
    layer.W_K = identity_queries(6, D, E, "cpu")[:2].clone()          # distinct identity slices
    layer.W_V = identity_queries(6, D, E, "cpu")[:1].repeat(2, 1, 1)  # both kv heads read the same slice
    df, _ = weight_metrics(layer, _meta(), device="cpu")
    # stacked W_K = [I_16; 0]: 16 equal singular values
    assert _layer_value(df, "erank_k") == pytest.approx(2 * E, rel=1e-6)
    assert _layer_value(df, "stable_rank_k") == pytest.approx(2 * E, rel=1e-6)
    assert _layer_value(df, "energy_rank90_k") == 15 and _layer_value(df, "energy_rank99_k") == 16
    # stacked W_V = [E_0 | E_0]: rank d_head, per layer as per head
    assert _layer_value(df, "erank_v") == pytest.approx(E, rel=1e-6)
    per_head = df[(df.metric == "erank_v") & df["head"].notna()]["value"]
    np.testing.assert_allclose(per_head.to_numpy(), E, rtol=1e-6)


def test_norms_and_layer_values_match_reference():
    layer = _layer(seed=52)
    df, _ = weight_metrics(layer, _meta(), device="cpu")
    for p in "QKVO":
        ref = float(np.linalg.norm(getattr(layer, f"W_{p}").double().numpy()))
        assert _layer_value(df, f"norm_{p.lower()}") == pytest.approx(ref, rel=1e-6)
    a = layer.W_Q.permute(1, 0, 2).reshape(D, D).double().numpy()
    s = np.linalg.svd(a, compute_uv=False)
    assert _layer_value(df, "wq_condition") == pytest.approx(s[0] / s[-1], rel=1e-3)
    assert _layer_value(df, "wq_basis_orth_defect") == pytest.approx(ref_defect(s), rel=1e-4)


def test_layer_kv_spectra_absent_for_full_multi_head():
    df, notes = weight_metrics(_layer(n_heads=6, n_kv=6), _meta(n_heads=6, n_kv=6), device="cpu")
    for p, w in (("k", "W_K"), ("v", "W_V")):
        for s in STATS:
            assert notes[f"{s}_{p}"] == layer_note(w)
            assert df[(df.metric == f"{s}_{p}") & df["head"].isna()].empty
            assert len(df[df.metric == f"{s}_{p}"]) == 6


def test_weight_metrics_shape_error_message():
    layer = _layer()
    layer.W_V = rand(2, D, E + 1)
    with pytest.raises(AnalysisError) as exc:
        weight_metrics(layer, _meta(), device="cpu")
    assert str(exc.value) == ("layer 3: expected W_V of shape [2, 48, 8] (from n_heads=6, n_kv_heads=2, "
                              "d_model=48, d_head=8), found [2, 48, 9]")


def test_inputs_not_modified():
    layer = _layer()
    before = {n: getattr(layer, n).clone() for n in ("W_Q", "W_K", "W_V", "W_O")}
    weight_metrics(layer, _meta(norm="none"), device="cpu")
    for n, t in before.items():
        assert torch.equal(getattr(layer, n), t)


def test_registry_names_unique_and_documented():
    names = registry.names()
    assert len(names) == len(set(names))
    assert all(m.help and m.level in ("weights", "activations") for m in registry.METRICS)
    assert list(registry.describe().columns) == ["name", "level", "axis", "family", "help"]


def _as_stored_by_loaders(layer):
    """The same weights in the layout the loaders hand out (``loaders/layouts/_common.py``):
    W_Q/W_K/W_V as transposed views of nn.Linear rows, W_O as columns of one matrix."""
    def linear_rows(w):                                   # [n, D, E] -> rows [n*E, D] -> view [n, D, E]
        n = w.shape[0]
        rows = w.mT.reshape(n * E, D).clone()
        return rows.reshape(n, E, D).transpose(1, 2)
    h = layer.W_O.shape[0]
    cols = layer.W_O.permute(2, 0, 1).reshape(D, h * E).clone()      # [D, h*E]
    return SimpleNamespace(layer=layer.layer, W_Q=linear_rows(layer.W_Q), W_K=linear_rows(layer.W_K),
                           W_V=linear_rows(layer.W_V), W_O=cols.reshape(D, h, E).permute(1, 2, 0),
                           b_Q=None, b_K=None)


@pytest.mark.parametrize("norm", ["layernorm", "none"])
def test_weight_metrics_independent_of_memory_layout(norm):
    layer = _layer()
    stored = _as_stored_by_loaders(layer)
    assert not stored.W_Q.is_contiguous() and torch.equal(stored.W_Q, layer.W_Q)
    assert torch.equal(stored.W_O, layer.W_O)
    a, notes_a = weight_metrics(layer, _meta(norm=norm), device="cpu")
    b, notes_b = weight_metrics(stored, _meta(norm=norm), device="cpu")
    assert notes_a == notes_b
    assert a[["layer", "head", "head_label", "metric"]].equals(b[["layer", "head", "head_label", "metric"]])
    np.testing.assert_allclose(b["value"].to_numpy(), a["value"].to_numpy(), rtol=1e-4, atol=1e-6)


def test_stack_heads_and_sum_groups_in_both_layouts():
    from analysis._linalg import stack_heads, sum_groups
    q = rand(6, D, E, seed=5)
    stored = _as_stored_by_loaders(SimpleNamespace(layer=0, W_Q=q, W_K=q[:2], W_V=q[:2],
                                                   W_O=rand(6, E, D, seed=6))).W_Q
    expect = torch.cat(list(q), dim=1)                                # [D, 6*E], head-major columns
    for a in (q, stored):
        s = stack_heads(a)
        assert torch.equal(s, expect) and s.stride() == (1, D)        # column-major either way
        torch.testing.assert_close(sum_groups(a, 2), q.reshape(2, 3, D, E).sum(1))
    assert stack_heads(stored).data_ptr() == stored.data_ptr()        # the loaders' layout: no copy


@pytest.mark.gpu
def test_cpu_and_gpu_agree():
    a, _ = weight_metrics(_layer(), _meta(norm="none"), device="cpu")
    b, _ = weight_metrics(_layer(), _meta(norm="none"), device="cuda")
    np.testing.assert_allclose(a["value"].to_numpy(), b["value"].to_numpy(), rtol=2e-3, atol=1e-4)


@pytest.mark.gpu
def test_small_decompositions_on_the_host_or_the_gpu_give_the_same_rows(monkeypatch):
    # analysis._linalg.HOST_SMALL moves the d_head x d_head float64 problems off the GPU: the
    # same problems, so the same values up to the two solvers' float64 round-off
    from analysis import _linalg
    rows = {}
    for host in (True, False):
        monkeypatch.setattr(_linalg, "HOST_SMALL", host)
        rows[host], _ = weight_metrics(_layer(), _meta(norm="none"), device="cuda")
    assert rows[True][["layer", "head", "metric"]].equals(rows[False][["layer", "head", "metric"]])
    np.testing.assert_allclose(rows[True]["value"].to_numpy(), rows[False]["value"].to_numpy(), rtol=1e-6, atol=1e-9)


def test_chunked_float64_products_match_direct_ones_across_chunk_edges(monkeypatch):
    # 5 heads in chunks of 2 (the last one short), heads stored transposed as the loaders hand them out
    from analysis import _linalg, qk_geometry
    monkeypatch.setattr(_linalg, "CHUNK", 2 * 40 * 8)
    monkeypatch.setattr(qk_geometry, "CHUNK", 2 * 40 * 8)
    a = rand(5, 8, 40, seed=60).mT                                       # [5, 40, 8], per head transposed
    b = rand(5, 8, 40, seed=61).mT
    a64, b64 = a.double(), b.double()
    kk, vv, kv = _linalg.grams_and_cross(a, b)
    for got, want in ((_linalg.gram(a), a64.mT @ a64), (_linalg.row_gram(a.mT), a64.mT @ a64), (kk, a64.mT @ a64),
                      (vv, b64.mT @ b64), (kv, a64.mT @ b64)):
        assert got.dtype == torch.float64 and torch.allclose(got, want, rtol=1e-13, atol=0)
    q = rand(10, 8, 40, seed=62).mT                                      # 10 query heads, 2 per kv head
    gq, c = qk_geometry.query_products(q, a, kv_index(10, 5, "cpu"))
    q64 = q.double()
    assert torch.allclose(gq, q64.mT @ q64, rtol=1e-13, atol=0)
    assert torch.allclose(c, a64[kv_index(10, 5, "cpu")].mT @ q64, rtol=1e-13, atol=0)


def test_top_singular_value_of_a_gaussian_stack_to_its_stated_accuracy():
    # A Gaussian 2048 x 2048 W_Q of bf16 values (cond 2.8e4): stacked_spectrum promises sigma_max to
    # max(1e-6, min(1e-4, eps32 * cond / 10)) = 1e-4; the Ritz gap's error estimate alone stopped
    # Lanczos at 2.3e-4 (query_absorb._GAP_DISTRUST)
    gen = torch.Generator().manual_seed(0)
    q = (torch.randn(32, 2048, 64, generator=gen) / math.sqrt(2048)).bfloat16().float()
    ref = torch.linalg.svdvals(query_absorb.stack_queries(q).double())
    st = query_absorb.stacked_spectrum(q)
    assert st.sigma_max == pytest.approx(float(ref[0]), rel=1e-4)
    assert st.condition == pytest.approx(float(ref[0] / ref[-1]), rel=1e-4)
