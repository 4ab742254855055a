"""Coverage study: how often the 95% intervals of the activation metrics and of the weight-decay
statistics hold the population value they estimate.

**Activations.** A synthetic layer per ``d_head`` ``e`` (``d_model = 2e``, two query heads on one kv
head, no biases): ``W_K`` Gaussian ``N(0, 1/d)``, ``W_V = 0.7 W_K R + 0.7 N`` (``R`` a random
rotation: V partly shares K's subspace), ``W_Q[h] = 0.5 W_K + N`` (partly symmetric logits). Its
input tokens are i.i.d. ``x ~ N(mu, Sigma)``, ``Sigma``'s eigenvalues geometric from 1 to 0.1 on a
random basis, ``|mu| = 0.5`` (residual streams have a mean). With ``M = Sigma + mu mu^T`` and
``q = A^T x``, ``k = B^T x``, ``v = C^T x`` the population values are

    kv_cosine_act    tr(B^T M C) / sqrt(tr(B^T M B) tr(C^T M C))
    kv_cka_act       ||B^T S C||_F^2 / (||B^T S B||_F ||C^T S C||_F)
    kv_share_r2_act  tr(C^T M B (B^T M B)^-1 B^T M C) / tr(C^T M C)
    erank_kcache     erank of sqrt(eig(B^T M B))  (Roy & Vetterli 2007), erank_vcache alike
    logit_symmetry   (1 + E tr(L L) / E ||L||_F^2) / 2 over windows of T tokens:
                     E tr(L L) = T(T-1) tr(P^2) + T E(q.k)^2,  P = A^T M B,
                     E ||L||_F^2 = T(T-1) tr(A^T M A B^T M B) + T E(q.k)^2,
                     E(q.k)^2 = (tr(U S) + mu^T U mu)^2 + 2 tr(U S U S) + 4 mu^T U S U mu,
                     U = (A B^T + B A^T) / 2

(``S = Sigma``; the layer's symmetry with ``A`` the query heads summed per kv head, ``B`` all kv
heads). Each replicate draws fresh tokens (``windows x T``, the default budget of
``experiments.activation_runs.wanted`` in 512-token windows), feeds them through
``analysis.activations.ActivationAccumulator`` and counts the rows whose ``[ci_low, ci_high]``
holds the population value; the table gives that fraction per metric and ``d_head`` (heads pooled)
and the mean error of the value.

**Weight decay.** Simulated sweeps with a known answer: loss ``= 2 + 0.05 (u - u*)^2 + seed noise``
(``u = log10 wd``, ``u*`` = -1.3, noise sd 0.02) at 4 weight decays (1e-3 ... 1e-1, plus 0), 2 or 3
seeds each, through ``analysis.wd_sensitivity.group_statistics``: coverage of each wd's mean
interval, of the slope interval (population slope: the least-squares line through the true means
over ``u``) and the calibration of ``best_wd_share`` (mean claimed share against the fraction of
sweeps whose best weight decay is the true one) on two families of truths: the bowl, and
*scattered* true means ``N(2, tau^2)`` with ``tau`` log-uniform from 0.1 to 10 standard errors of
a wd's mean (ties and clear winners alike).

    .venv/bin/python bench/interval_coverage.py --json [--quick] [--reps N] [--d-heads 16,64]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.activations import ActivationAccumulator  # noqa: E402
from analysis._linalg import spectrum_stats  # noqa: E402
from analysis.wd_sensitivity import group_statistics  # noqa: E402

#: d_head values of the study.
D_HEADS = (16, 64, 128, 256)
WINDOW = 512


def population(e: int, *, seed: int = 0, heads: int = 2):
    """The synthetic layer and input distribution of ``d_head`` ``e`` (module docstring):
    ``(layer, meta, mu [d], root [d, d] with Sigma = root root^T)``, all float64 but the layer."""
    d = 2 * e
    g = torch.Generator().manual_seed(seed)
    n = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)   # noqa: E731
    basis, _ = torch.linalg.qr(n(d, d))
    root = basis * torch.logspace(0, -0.5, d, dtype=torch.float64)     # Sigma eigenvalues 1 ... 0.1
    mu = n(d)
    mu = 0.5 * mu / mu.norm()
    wk = n(1, d, e) / math.sqrt(d)
    rot, _ = torch.linalg.qr(n(e, e))
    wv = 0.7 * wk @ rot + 0.7 * n(1, d, e) / math.sqrt(d)
    wq = 0.5 * wk.expand(heads, d, e) + n(heads, d, e) / math.sqrt(d)
    lay = SimpleNamespace(layer=0, W_Q=wq.float(), W_K=wk.float(), W_V=wv.float(),
                          W_O=n(heads, e, d).float(), b_Q=None, b_K=None, b_V=None)
    meta = SimpleNamespace(n_heads=heads, n_kv_heads=1, d_model=d, d_head=e, norm="layernorm", variant="qkv")
    return lay, meta, mu, root


def _erank(gram: torch.Tensor) -> float:
    return float(spectrum_stats(torch.linalg.eigvalsh(gram).clamp_min(0).sqrt())["erank"])


def _logit_symmetry(a: torch.Tensor, b: torch.Tensor, mu: torch.Tensor, sig: torch.Tensor, T: int) -> float:
    m = sig + torch.outer(mu, mu)
    u = (a @ b.T + b @ a.T) / 2
    qk2 = (torch.trace(u @ sig) + mu @ u @ mu) ** 2 + 2 * torch.trace(u @ sig @ u @ sig) + 4 * mu @ u @ sig @ u @ mu
    p = a.T @ m @ b
    num = T * (T - 1) * torch.trace(p @ p) + T * qk2
    den = T * (T - 1) * torch.trace(a.T @ m @ a @ b.T @ m @ b) + T * qk2
    return float((1 + num / den) / 2)


def population_values(lay, mu: torch.Tensor, root: torch.Tensor, T: int) -> dict[str, list[float]]:
    """Population value of every metric per head (module docstring), float64."""
    sig = root @ root.T
    m = sig + torch.outer(mu, mu)
    b, c = lay.W_K[0].double(), lay.W_V[0].double()
    kk, vv, kv = b.T @ m @ b, c.T @ m @ c, b.T @ m @ c
    ckk, cvv, ckv = b.T @ sig @ b, c.T @ sig @ c, b.T @ sig @ c
    out = {"kv_cosine_act": [float(torch.trace(kv) / (torch.trace(kk) * torch.trace(vv)).sqrt())],
           "kv_cka_act": [float(ckv.square().sum() / (ckk.norm() * cvv.norm()))],
           "kv_share_r2_act": [float(torch.trace(kv.T @ torch.linalg.solve(kk, kv)) / torch.trace(vv))],
           "erank_kcache": [_erank(kk)], "erank_vcache": [_erank(vv)]}
    wq = lay.W_Q.double()
    out["logit_symmetry"] = [_logit_symmetry(wq[h], b, mu, sig, T) for h in range(wq.shape[0])]
    out["logit_symmetry_layer"] = [_logit_symmetry(wq.sum(0), b, mu, sig, T)]
    # one kv head: the whole layer's K and V are the head's (the layer's CKA is the authors' plain,
    # uncorrected estimator of the same population value)
    out |= {"kv_cka_layer_act": out["kv_cka_act"], "erank_kcache_layer": out["erank_kcache"],
            "erank_vcache_layer": out["erank_vcache"]}
    return out


def activation_coverage(e: int, *, reps: int, tokens: int, seed: int = 0) -> dict[str, dict]:
    """Coverage and mean error per metric at ``d_head`` ``e``, ``reps`` replicates of ``tokens``."""
    lay, meta, mu, root = population(e, seed=seed)
    windows = max(1, tokens // WINDOW)
    truth = population_values(lay, mu, root, WINDOW)
    hits: dict[str, list[float]] = {}
    errs: dict[str, list[float]] = {}
    widths: dict[str, list[float]] = {}
    g = torch.Generator().manual_seed(seed + 1)
    for r in range(reps):
        z = torch.randn(windows, WINDOW, meta.d_model, generator=g, dtype=torch.float64)
        x = (z @ root.T + mu).float()
        acc = ActivationAccumulator(lay, meta, logits=True, seed=r, n_random=1, device="cpu")
        acc.add(x)
        df, _ = acc.result()
        for row in df.itertuples():
            name = "logit_symmetry_layer" if row.metric == "logit_symmetry" and row.head is None or (
                row.metric == "logit_symmetry" and str(row.head) == "<NA>") else row.metric
            idx = 0 if name == "logit_symmetry_layer" or row.head is None or str(row.head) == "<NA>" else int(row.head)
            pop = truth[name][idx]
            hits.setdefault(name, []).append(float(row.ci_low <= pop <= row.ci_high))
            errs.setdefault(name, []).append(row.value - pop)
            widths.setdefault(name, []).append(row.ci_high - row.ci_low)
    return {m: {"coverage": float(np.mean(hits[m])), "bias": float(np.mean(errs[m])),
                "width": float(np.mean(widths[m])), "population": truth[m][0], "rows": len(hits[m])}
            for m in hits}


#: The simulated sweep: weight decays, the true mean loss per log10 wd, seed noise.
WDS = (0.0, 1e-3, 1e-2, 3e-2, 1e-1)
NOISE = 0.02


def true_loss(wd: float, *, curved: bool) -> float:
    """Mean loss at ``wd``: a line in ``u = log10 wd`` (wd 0 at u = -4), or a bowl with its
    minimum at ``u = -1.3`` whose wds 1e-2 ... 1e-1 lie within about one seed's noise."""
    u = math.log10(wd) if wd > 0 else -4.0
    return 2.0 + (0.05 * (u + 1.3) ** 2 if curved else 0.01 * u)


def wd_coverage(seeds: int, *, reps: int, seed: int = 0) -> dict[str, float]:
    """Coverage of the per-wd mean and slope intervals (linear truth: the slope is 0.01) and the
    calibration of ``best_wd_share`` (curved truth) over ``reps`` simulated sweeps of ``seeds`` runs
    per weight decay."""
    rng = np.random.default_rng(seed)
    wds = [w for w in WDS for _ in range(seeds)]
    mean_hits, slope_hits = [], []
    shares: dict[str, list[float]] = {"bowl": [], "scattered": []}
    right: dict[str, list[bool]] = {"bowl": [], "scattered": []}
    pos = [w for w in WDS if w > 0]
    u = np.log10(pos)
    for r in range(reps):
        for kind in ("line", "bowl", "scattered"):
            if kind == "scattered":      # true means N(2, tau^2), tau 0.1-10 standard errors of a mean
                tau = NOISE / math.sqrt(seeds) * 10 ** rng.uniform(-1, 1)
                truth = {w: 2.0 + tau * rng.standard_normal() for w in WDS}
            else:
                truth = {w: true_loss(w, curved=kind == "bowl") for w in WDS}
            losses = [truth[w] + NOISE * rng.standard_normal() for w in wds]
            st = group_statistics(wds, losses, rng=np.random.default_rng([seed, r, len(kind)]))
            for row in st["per_wd"]:
                mean_hits.append(row["ci_low"] <= truth[row["weight_decay"]] <= row["ci_high"])
            if kind == "line":
                slope = float(np.polyfit(u, [truth[w] for w in pos], 1)[0])
                slope_hits.append(st["slope_ci_low"] <= slope <= st["slope_ci_high"])
            else:
                shares[kind].append(st["best_wd_share"])
                right[kind].append(st["best_weight_decay"] == min(WDS, key=truth.get))
    out = {"mean_coverage": float(np.mean(mean_hits)), "slope_coverage": float(np.mean(slope_hits))}
    for kind in shares:
        out[f"best_wd_share_claimed_{kind}"] = float(np.mean(shares[kind]))
        out[f"best_wd_right_{kind}"] = float(np.mean(right[kind]))
    return out


#: Replicates from which a coverage row is judged against 0.9 (binomial sd at 0.95: 0.015 at 200).
MIN_JUDGED = 100


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--quick", action="store_true", help="a smoke-test size: d_head 16 only, 5 replicates, 3 sweeps")
    ap.add_argument("--reps", type=int, default=200, help="replicates per d_head (default 200)")
    ap.add_argument("--d-heads", default=",".join(map(str, D_HEADS)))
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per replicate (default 4096)")
    ap.add_argument("--wd-reps", type=int, default=400, help="simulated sweeps per seed count (default 400)")
    ap.add_argument("--wd-only", action="store_true", help="the weight-decay study alone")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    d_heads = [16] if args.quick else [int(v) for v in args.d_heads.split(",")]
    reps = 5 if args.quick else args.reps
    t0 = time.perf_counter()
    act = {} if args.wd_only else {str(e): activation_coverage(e, reps=reps, tokens=args.tokens)
                                   for e in d_heads}
    wd_reps = 3 if args.quick else args.wd_reps
    wd = {str(k): wd_coverage(k, reps=wd_reps) for k in (2, 3)}
    out = {"replicates": reps, "tokens": args.tokens, "window": WINDOW, "activations": act,
           "wd_replicates": wd_reps, "weight_decay": wd, "seconds": round(time.perf_counter() - t0, 1)}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for e, rows in act.items():
        for m, v in rows.items():
            print(f"d_head {e:>4} {m:<22} coverage {v['coverage']:.3f}  bias {v['bias']:+.4f}  "
                  f"width {v['width']:.4f}  population {v['population']:.4f}")
    for k, v in wd.items():
        print(f"{k} seeds: " + "  ".join(f"{name} {val:.3f}" for name, val in v.items()))
    # one row per activation metric and d_head for bench/run_all.py: coverage is judged only
    # where the replicates are enough to tell 0.9 from 0.95
    judged = reps >= MIN_JUDGED
    for e, rows in act.items():
        for m, v in rows.items():
            row = {"bench": "interval_coverage", "measured": f"coverage of the 95% interval of {m}, d_head {e}",
                   "figure": f"{v['coverage']:.3f} ({reps} replicates)", "against": "the population value",
                   "target": ">= 0.9" if judged else f"- ({reps} replicates: too few to judge)",
                   "result": ("pass" if v["coverage"] >= 0.9 else "FAIL") if judged else "-"}
            print("BENCH_ROW " + json.dumps(row))


if __name__ == "__main__":
    main()
