"""Activation metrics on caches and logits built in code."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from analysis.activations import activation_metrics
from analysis.errors import AnalysisError
from analysis.registry import names


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_known_answers_and_reference():
    k = rand(2, 40, 8, seed=1)
    v = k.clone()
    q = rand(4, 40, 8, seed=2)
    logits = q @ k.repeat_interleave(2, 0).mT                       # [4, 40, 40]
    sym = k.repeat_interleave(2, 0) @ k.repeat_interleave(2, 0).mT  # q = k: symmetric
    df, notes = activation_metrics(0, k, v, sym, device="cpu")
    assert notes == {} and set(df.metric) == set(names("activations"))
    for m in ("kv_cka_act", "kv_cosine_act", "kv_share_r2_act", "logit_symmetry"):
        assert df[df.metric == m]["value"].to_numpy() == pytest.approx(1.0, abs=1e-6), m
    df, _ = activation_metrics(0, k, rand(2, 40, 8, seed=3), logits, device="cpu")
    s = np.linalg.svd(k[1].double().numpy(), compute_uv=False)
    p = s / s.sum()
    ref = math.exp(-(p * np.log(p)).sum())
    got = df[(df.metric == "erank_kcache") & (df["head"] == 1)]["value"].iloc[0]
    assert got == pytest.approx(ref, rel=1e-4)
    lg = logits[2].double().numpy()
    ref_sym = np.linalg.norm((lg + lg.T) / 2) ** 2 / np.linalg.norm(lg) ** 2
    got = df[(df.metric == "logit_symmetry") & (df["head"] == 2)]["value"].iloc[0]
    assert got == pytest.approx(ref_sym, abs=1e-5)
    whole = df[(df.metric == "logit_symmetry") & df["head"].isna()]
    assert whole["head_label"].tolist() == ["L0"]


def test_fewer_tokens_than_d_head_and_missing_logits():
    k, v = rand(1, 3, 8, seed=4), rand(1, 3, 8, seed=5)
    df, notes = activation_metrics(2, k, v, None, logits_reason="positions are rotary", device="cpu")
    assert notes == {"logit_symmetry": "positions are rotary"}
    er = df[df.metric == "erank_kcache"]["value"].iloc[0]
    assert 1 < er <= 3


def test_shape_error_message():
    with pytest.raises(AnalysisError) as exc:
        activation_metrics(1, rand(2, 5, 4), rand(2, 5, 3), None)
    assert str(exc.value) == ("layer 1: expected K and V caches of one shape [n_kv_heads, tokens, d_head], "
                              "found [2, 5, 4] and [2, 5, 3]")
