"""Values fixed by construction: the singular stacked W_Q of Q = K with grouped kv heads (no crash,
``wq_condition`` inf with a note), rank-deficient K, and the rows a tie fixes."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from analysis import degenerate, query_absorb
from analysis.tied import tied_layer
from analysis.weights import weight_metrics
from loaders.canonical import AttentionWeights
from tests.analysis._threads import one_thread  # noqa: F401  (autouse: one torch thread)


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * shape[-2] ** -0.5


def meta(h, g, d, e, dtype="float32", norm="layernorm"):
    return SimpleNamespace(n_heads=h, n_kv_heads=g, d_model=d, d_head=e, norm=norm, variant="qkv", dtype=dtype)


def values(df, metric, whole=None):
    sel = df[df.metric == metric]
    if whole is not None:
        sel = sel[sel["head"].isna() == whole]
    return sel


@pytest.mark.parametrize("tie", ["q_eq_k", "q_eq_k_eq_v"])
@pytest.mark.parametrize("h,g,d", [(4, 2, 128), (8, 2, 256), (8, 4, 128)])
def test_q_eq_k_with_grouped_kv_heads_reads_wq_condition_inf_and_every_other_metric(tie, h, g, d):
    """Known answer: W_Q[h] = W_K[h // (h/g)] stacks each kv head's block h/g times, so the stacked
    W_Q has rank g*e < d_model: exactly singular. Float64 svdvals agrees that it is singular."""
    e = d // h
    k = rand(g, d, e, seed=1)
    v = k.clone() if tie == "q_eq_k_eq_v" else rand(g, d, e, seed=2)
    q = k.repeat_interleave(h // g, dim=0)
    lay = AttentionWeights(0, q, k, v, rand(h, e, d, seed=3))
    stacked = torch.cat(list(q.double()), dim=1)                          # [d, h*e]
    sv = torch.linalg.svdvals(stacked)
    assert float(sv[-1] / sv[0]) < 1e-13                                   # float64: singular
    df, notes = weight_metrics(lay, meta(h, g, d, e), device="cpu")
    cond = values(df, "wq_condition").iloc[0]
    assert cond.value == math.inf and bool(cond.degenerate)
    assert values(df, "wq_basis_orth_defect").iloc[0].value == math.inf
    assert notes["wq_condition"].startswith("degenerate where the stacked W_Q is singular (rank < d_model")
    finite = df[~df.metric.isin(["wq_condition", "wq_basis_orth_defect", "erank_qk_skew"])]
    assert np.isfinite(finite["value"].to_numpy(dtype=float)).all()
    assert not finite["degenerate"].any()
    assert values(df, "qk_symmetry", whole=True).iloc[0].value == pytest.approx(1.0, abs=1e-6)
    # every M_h = K K^T is symmetric: no skew part, so no effective rank of it (NaN, flagged)
    assert values(df, "energy_qk_skew")["value"].tolist() == pytest.approx([0.0] * h, abs=1e-12)
    skew = values(df, "erank_qk_skew")
    assert skew["value"].isna().all() and skew["degenerate"].all()
    assert notes["erank_qk_skew"].startswith("degenerate where M_h is symmetric to working precision")


def test_stacked_spectrum_of_a_singular_stack_is_singular_and_a_regular_one_is_not():
    d, e = 64, 16
    k = rand(2, d, e, seed=4)
    sing = query_absorb.stacked_spectrum(k.repeat_interleave(2, dim=0))
    assert sing.sigma_min == 0 and sing.condition == math.inf and sing.orth_defect == math.inf
    reg = query_absorb.stacked_spectrum(rand(4, d, e, seed=5))
    ref = torch.linalg.svdvals(torch.cat(list(rand(4, d, e, seed=5).double()), dim=1))
    assert reg.condition == pytest.approx(float(ref[0] / ref[-1]), rel=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rank_deficient_k_makes_the_share_fit_degenerate(dtype):
    """An exactly rank-4 W_K[0] of d_head 16 (stored as float32 or bfloat16): its kv_share_r2 is
    flagged (the fit of V on K's columns is underdetermined), the full-rank kv head's is not."""
    d, e = 64, 16
    k = rand(2, d, e, seed=6)
    k[0] = rand(1, d, 4, seed=7)[0] @ rand(1, 4, e, seed=8)[0]
    v = rand(2, d, e, seed=9)
    lay = AttentionWeights(0, rand(4, d, e, seed=10).to(dtype).float(), k.to(dtype).float(),
                           v.to(dtype).float(), rand(4, e, d, seed=11).to(dtype).float())
    name = str(dtype).removeprefix("torch.")
    df, notes = weight_metrics(lay, meta(4, 2, d, e, dtype=name), device="cpu")
    share = values(df, "kv_share_r2")
    assert share["degenerate"].tolist() == [True, False]
    assert notes["kv_share_r2"].startswith("degenerate where W_K[g] is rank-deficient at its stored precision")
    # the other rows of that kv head are measurements, not flagged
    assert not values(df, "kv_cka")["degenerate"].any()


def test_rank_deficient_uses_the_stored_dtype_tolerance():
    sv = torch.tensor([[1.0, 0.5, 5e-7], [1.0, 0.5, 2e-6], [1.0, 0.5, 0.1], [0.0, 0.0, 0.0]], dtype=torch.float64)
    eps32 = degenerate.stored_eps("float32")
    assert degenerate.rank_deficient(sv, eps32).tolist() == [True, False, False, True]     # 8 x 1.2e-7 = 9.5e-7
    assert degenerate.rank_deficient(sv, degenerate.stored_eps("bfloat16")).tolist() == [True, True, False, True]
    assert degenerate.stored_eps("bfloat16", torch.float32) == float(torch.finfo(torch.bfloat16).eps)


def test_tie_fixed_rows_of_k_eq_v_and_q_eq_k_layers():
    d, e, h, g = 32, 8, 4, 2
    k = rand(g, d, e, seed=1)
    layers = [AttentionWeights(0, rand(h, d, e, seed=2), k, k.clone(), rand(h, e, d, seed=3)),       # K = V
              AttentionWeights(1, k.repeat_interleave(2, 0), k, rand(g, d, e, seed=4), rand(h, e, d, seed=5))]
    m = meta(h, g, d, e)
    frame = pd.concat([weight_metrics(lay, m, device="cpu")[0] for lay in layers], ignore_index=True)
    ties = [tied_layer(lay, m) for lay in layers]
    notes: dict[str, str] = {}
    out = degenerate.tie_fixed(frame, ties, notes)
    flagged = set(zip(out.loc[out.degenerate, "layer"], out.loc[out.degenerate, "metric"]))
    assert {(0, "kv_cka"), (0, "kv_share_r2"), (0, "kv_cosine_flat")} <= flagged
    assert {(1, "qk_symmetry"), (1, "qk_directionality")} <= flagged
    assert (1, "kv_cka") not in flagged and (0, "qk_symmetry") not in flagged
    assert notes["kv_cka"] == "degenerate at L0KV0, L0KV1: K = V in this layer: the K/V similarity is 1 by construction"
    assert notes["qk_directionality"].startswith("degenerate at L1: Q = K in this layer")
    assert not frame["degenerate"].any() or frame is not out                       # a copy
