"""Activation estimators against known population values: the bias corrections of the share fit
(adjusted R^2), the CKA (debiased squared norms) and the eranks (delete-one-window jackknife)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from analysis.activations import ActivationAccumulator
from tests.analysis._threads import one_thread  # noqa: F401  (autouse: one torch thread)

E, WINDOWS, T = 32, 8, 64                    # 512 tokens = 16 x d_head
SEEDS = range(12)


def _layer(sigma: float | None):
    """d_model 2E, x ~ N(0, I): K = x[:, :E]; V = x[:, E:] (independent of K) for ``sigma`` None,
    else V = K + sigma x[:, E:]. Population values: share and CKA 0, or 1 / (1 + sigma^2) both
    (K isotropic: Sigma_KV = I, Sigma_VV = (1 + sigma^2) I); eranks E (isotropic caches)."""
    eye, zero = torch.eye(E), torch.zeros(E, E)
    wk = torch.cat([eye, zero])[None]
    wv = torch.cat([zero, eye])[None] if sigma is None else torch.cat([eye, sigma * eye])[None]
    lay = SimpleNamespace(layer=0, W_Q=None, W_K=wk, W_V=wv, W_O=torch.zeros(2, E, 2 * E), b_Q=None, b_K=None,
                          b_V=None)
    return lay, SimpleNamespace(n_heads=2, n_kv_heads=1, d_model=2 * E, d_head=E, norm="layernorm", variant="qkv")


def _plain(x: torch.Tensor, lay) -> dict[str, float]:
    """The uncorrected estimators in float64 from the caches themselves."""
    xs = x.double().reshape(-1, 2 * E)
    k, v = xs @ lay.W_K[0].double(), xs @ lay.W_V[0].double()
    kc, vc = k - k.mean(0), v - v.mean(0)
    sol = torch.linalg.lstsq(k, v).solution
    s = torch.linalg.svdvals(k)
    p = s / s.sum()
    return {"kv_share_r2_act": float(1 - (v - k @ sol).square().sum() / v.square().sum()),
            "kv_cka_act": float((kc.T @ vc).square().sum() / ((kc.T @ kc).norm() * (vc.T @ vc).norm())),
            "erank_kcache": float(torch.exp(-(p * p.log()).sum()))}


@pytest.mark.parametrize("sigma", [None, 1.0])
def test_corrected_values_meet_the_population_where_the_plain_ones_miss(sigma):
    lay, m = _layer(sigma)
    truth = {"kv_share_r2_act": 0.0 if sigma is None else 0.5, "kv_cka_act": 0.0 if sigma is None else 0.5,
             "erank_kcache": float(E), "erank_vcache": float(E)}
    got, plain, covered = {k: [] for k in truth}, {k: [] for k in truth if k != "erank_vcache"}, []
    for seed in SEEDS:
        x = torch.randn(WINDOWS, T, 2 * E, generator=torch.Generator().manual_seed(seed))
        acc = ActivationAccumulator(lay, m, logits=False, device="cpu", n_random=1)
        acc.add(x)
        df, _ = acc.result()
        for k in truth:
            row = df[df.metric == k].iloc[0]
            got[k].append(row.value)
            covered.append(row.ci_low <= truth[k] <= row.ci_high)
        for k, val in _plain(x, lay).items():
            plain[k].append(val)
    n = WINDOWS * T
    for k, pop in truth.items():
        vals = np.asarray(got[k])
        se = vals.std(ddof=1) / np.sqrt(len(vals))
        # the mean of 12 corrected values within 3 of its standard errors (and 0.4% of the range)
        assert abs(vals.mean() - pop) <= 3 * se + 0.004 * max(1.0, pop), (k, vals.mean(), pop, se)
    # the plain estimators miss by their known small-sample bias: the share fit by about
    # (1 - pop) d_head / n, the erank low by more than a quarter of a column
    share_bias = np.mean(plain["kv_share_r2_act"]) - truth["kv_share_r2_act"]
    assert share_bias == pytest.approx((1 - truth["kv_share_r2_act"]) * E / n, rel=0.15)
    assert np.mean(plain["kv_cka_act"]) - truth["kv_cka_act"] > 0.02
    assert np.mean(plain["erank_kcache"]) < E - 0.25
    assert np.mean(covered) >= 0.85                                    # 48 intervals
