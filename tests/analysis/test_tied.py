"""Ties read from the tensors: equal projections and the identity query, MHA and GQA."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from analysis import tie_names, tied
from analysis._linalg import identity_queries
from analysis.variants import VARIANTS
from loaders.canonical import AttentionWeights

D, E = 32, 8


def rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def meta(n_heads, n_kv, dtype="float32", d_model=D, d_head=E):
    return SimpleNamespace(n_heads=n_heads, n_kv_heads=n_kv, d_model=d_model, d_head=d_head, dtype=dtype)


def layer(q, k, v, i=0):
    n_heads = q.shape[0] if q is not None else D // E
    return AttentionWeights(i, q, k, v, rand(n_heads, E, D, seed=99))


def flags(t):
    return (t["q_identity"], t["q_eq_k"], t["k_eq_v"], t["q_eq_v"])


@pytest.mark.parametrize("n_heads,n_kv", [(4, 4), (4, 2), (4, 1)])
def test_independent_projections_are_qkv(n_heads, n_kv):
    q, k, v = rand(n_heads, D, E, seed=1), rand(n_kv, D, E, seed=2), rand(n_kv, D, E, seed=3)
    t = tied.tied_layer(layer(q, k, v, i=3), meta(n_heads, n_kv))
    assert t == {"layer": 3, "q_identity": False, "q_eq_k": False, "k_eq_v": False, "q_eq_v": False}
    assert tie_names.layer_variant(t) == "qkv"


@pytest.mark.parametrize("n_heads,n_kv", [(4, 4), (4, 2), (4, 1)])
def test_query_equal_to_its_kv_head(n_heads, n_kv):
    k, v = rand(n_kv, D, E, seed=2), rand(n_kv, D, E, seed=3)
    q = k.repeat_interleave(n_heads // n_kv, dim=0)          # W_Q[h] = W_K[h // group]
    t = tied.tied_layer(layer(q, k, v), meta(n_heads, n_kv))
    assert flags(t) == (False, True, False, False)
    assert tie_names.layer_variant(t) == "q_eq_k"
    if 1 < n_kv < n_heads:                                   # the wrong grouping is not a tie
        wrong = k.repeat(n_heads // n_kv, 1, 1)              # W_K[h % n_kv]
        assert not tied.tied_layer(layer(wrong, k, v), meta(n_heads, n_kv))["q_eq_k"]


@pytest.mark.parametrize("n_heads,n_kv", [(4, 4), (4, 2)])
def test_k_equal_v_and_all_three(n_heads, n_kv):
    k = rand(n_kv, D, E, seed=2)
    t = tied.tied_layer(layer(rand(n_heads, D, E, seed=1), k, k.clone()), meta(n_heads, n_kv))
    assert flags(t) == (False, False, True, False)
    assert tie_names.layer_variant(t) == "k_eq_v"
    q = k.repeat_interleave(n_heads // n_kv, dim=0)
    t = tied.tied_layer(layer(q, k, k.clone()), meta(n_heads, n_kv))
    assert flags(t) == (False, True, True, True)
    assert tie_names.layer_variant(t) == "q_eq_k_eq_v"


def test_identity_query_present_or_absent():
    k, v = rand(4, D, E, seed=2), rand(4, D, E, seed=3)
    eye = identity_queries(4, D, E, "cpu")                   # [4, D, E], head h reads x[:, hE:(h+1)E]
    for q in (eye, None):
        t = tied.tied_layer(layer(q, k, v), meta(4, 4))
        assert flags(t) == (True, False, False, False)
        assert tie_names.layer_variant(t) == "wq_identity"
    # heads in another order are not the identity slice
    assert not tied.tied_layer(layer(eye.flip(0), k, v), meta(4, 4))["q_identity"]
    # nor is the identity when n_heads * d_head != d_model
    wide = torch.zeros(2, D, E)
    wide[0, :E], wide[1, E:2 * E] = torch.eye(E), torch.eye(E)
    assert not tied.tied_layer(layer(wide, k[:2], v[:2]), meta(2, 2))["q_identity"]


def test_tolerance_follows_the_stored_dtype():
    assert tied.tolerance("float32") == pytest.approx(8 * 1.1920929e-07)
    assert tied.tolerance("bfloat16") == pytest.approx(8 * 2 ** -7)
    assert tied.tolerance(torch.float16) == pytest.approx(8 * 2 ** -10)
    k = rand(2, D, E, seed=2)
    rel = 1e-4                                               # relative Frobenius difference
    v = k * (1 + rel)
    assert not tied.tied_layer(layer(rand(2, D, E, seed=1), k, v), meta(2, 2, "float32", d_model=D))["k_eq_v"]
    assert tied.tied_layer(layer(rand(2, D, E, seed=1), k, v), meta(2, 2, "float16", d_model=D))["k_eq_v"]
    # float32 round-off of an exact tie (V = K computed another way) stays equal
    v32 = (k.double() * 3).float() / 3
    assert tied.tied_layer(layer(rand(2, D, E, seed=1), k, v32), meta(2, 2))["k_eq_v"]


def test_zero_matrices_are_equal():
    z = torch.zeros(2, D, E)
    t = tied.tied_layer(layer(rand(2, D, E, seed=1), z, z.clone()), meta(2, 2))
    assert t["k_eq_v"] and not t["q_eq_k"]


def test_variant_over_layers():
    qkv = {"q_identity": False, "q_eq_k": False, "k_eq_v": False, "q_eq_v": False}
    kv = dict(qkv, k_eq_v=True)
    qv = dict(qkv, q_eq_v=True)                              # no canonical name
    assert tie_names.tied_variant([qkv, qkv]) == "qkv"
    assert tie_names.tied_variant([kv, kv]) == "k_eq_v"
    assert tie_names.tied_variant([qkv, kv]) == "mixed"
    assert tie_names.tied_variant([qv, qv]) is None
    assert tie_names.tied_variant([qv, qkv]) == "mixed"
    assert tie_names.tied_variant([]) is None
    named = {tie_names.layer_variant(t) for t in (qkv, kv, dict(qkv, q_eq_k=True), dict(qkv, q_identity=True),
                                               dict(qkv, q_eq_k=True, k_eq_v=True, q_eq_v=True))}
    assert named == set(VARIANTS)


def test_inputs_are_left_unchanged():
    q, k, v = rand(4, D, E, seed=1), rand(2, D, E, seed=2), rand(2, D, E, seed=3)
    before = [t.clone() for t in (q, k, v)]
    tied.tied_layer(layer(q, k, v), meta(4, 2))
    assert all(torch.equal(a, b) for a, b in zip(before, (q, k, v)))


def _reference_equal(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    """The definition on the whole stacked tensors, in float64 numpy."""
    a64, b64 = a.double().numpy(), b.double().numpy()
    top = max(np.linalg.norm(a64), np.linalg.norm(b64))
    return top == 0 or np.linalg.norm(a64 - b64) <= tol * top


@pytest.mark.parametrize("where", [0, 3])
@pytest.mark.parametrize("scale", [0.0, 0.5, 0.99, 1.01, 2.0, 1e3])
def test_stopping_at_the_first_head_past_the_tolerance_decides_as_the_whole_difference(where, scale):
    """V = K plus a perturbation in one kv head (the first or the last) of relative size
    ``scale`` x the tolerance: the decision matches the float64 definition on whole tensors."""
    tol = tied.tolerance("float32")
    k = rand(4, D, E, seed=2).double()
    bump = rand(D, E, seed=5).double()
    v = k.clone()
    v[where] += bump * (scale * tol * k.norm() / bump.norm())      # ||V - K|| = scale * tol * ||K||
    k, v = k.float(), v.float()
    t = tied.tied_layer(layer(rand(4, D, E, seed=1), k, v), meta(4, 4))
    assert t["k_eq_v"] == _reference_equal(k, v, tol) == (scale < 1)
    # the value returned when it stops is past the tolerance, as the whole one is
    norms = (float(k.double().square().sum()), float(v.double().square().sum()))
    whole = tied._rel_diff(zip(k, v), norms)
    early = tied._rel_diff(zip(k, v), norms, stop_above=tol)
    assert (early > tol) == (whole > tol) and early <= whole + 1e-15
    if scale < 1:
        assert early == whole


def test_a_query_free_layer_whose_keys_are_the_identity_slices():
    """W_Q absent (identity queries, made head by head only as far as compared) against W_K set
    to those slices: q_eq_k; against random W_V: not q_eq_v."""
    eye = identity_queries(4, D, E, "cpu")
    t = tied.tied_layer(layer(None, eye.clone(), rand(4, D, E, seed=3)), meta(4, 4))
    assert flags(t) == (True, True, False, False)


def test_a_projection_holding_nan_is_tied_to_nothing():
    """NaN equals nothing, itself included; an all-zero projection is not equal to one with a NaN
    (``max(0.0, nan)`` is 0.0, which once made that pair look like two zero matrices)."""
    z = torch.zeros(2, D, E)
    bad = z.clone()
    bad[1, 3, 2] = float("nan")
    q = rand(2, D, E, seed=1)
    assert not tied.tied_layer(layer(q, z, bad), meta(2, 2))["k_eq_v"]
    assert not tied.tied_layer(layer(q, bad, bad.clone()), meta(2, 2))["k_eq_v"]
    assert not tied.tied_layer(layer(bad.clone(), bad, rand(2, D, E, seed=3)), meta(2, 2))["q_eq_k"]
