"""Benchmark: ``analysis.activations.ActivationAccumulator`` on one Llama-1B-shaped layer.

d_model 2048, 32 heads, 8 kv heads, d_head 64 (random weights), 4,096 tokens
fed as ``--batches`` calls of ``add()`` (8 windows of 512 tokens in all), then
``result()``; with and without logits. Prints the seconds of the
``add()`` calls (the layer's projections, ``n_random`` random ones for the
chance levels, float64 statistics) and of ``result()`` (metrics, chance, the
jackknife over windows); and, side by side, the floor: the layer's own K and V projections and their
Grams alone (what any activation metric must compute), with the ratio of the
whole to it (the price of chance levels, float64 statistics and intervals).

    .venv/bin/python bench/activations_speed.py [--device cpu|cuda] [--threads N] [--repeat 3] [--quick]

``--quick``: a smoke run's layer, d_model 256, 4 heads, 2 kv heads, d_head 64, 4 windows of
128 tokens (windows shorter than d_model, as at full size).

On a machine other processes keep busy, run it with ``--threads 1`` or
``OMP_WAIT_POLICY=PASSIVE`` (see bench/analysis_speed.py).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.activations import ActivationAccumulator


#: (heads, kv heads, d_model, d_head, windows, tokens per window): Llama-1B's layer, 8 x 512 tokens;
#: ``--quick``'s.
FULL = (32, 8, 2048, 64, 8, 512)
QUICK = (4, 2, 256, 64, 4, 128)


def _sync(dev: str) -> None:
    if dev.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batches", type=int, default=2, help="add() calls (windows split among them)")
    ap.add_argument("--quick", action="store_true",
                    help="a small layer (d_model 256, 4 heads, 2 kv heads, 4 windows of 128 tokens): a smoke run")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    h, g, d, e, windows, t = QUICK if args.quick else FULL
    gen = torch.Generator().manual_seed(0)
    w = lambda *s: torch.randn(*s, generator=gen) / d ** 0.5          # noqa: E731
    lay = SimpleNamespace(layer=0, W_Q=w(h, d, e), W_K=w(g, d, e), W_V=w(g, d, e), W_O=w(h, e, d),
                          b_Q=None, b_K=None, b_V=None)
    meta = SimpleNamespace(n_heads=h, n_kv_heads=g, d_model=d, d_head=e, norm="rmsnorm", variant="qkv")
    x = torch.randn(windows, t, d, generator=gen).to(args.device)        # [8, 512, 2048]
    print(f"device {args.device}, threads {torch.get_num_threads()}, {windows} windows x {t} tokens, "
          f"d_model {d}, {h} heads, {g} kv heads, d_head {e}, n_random 3")
    # the floor, side by side: the layer's own K and V projections and their float32 Grams alone
    wk, wv = lay.W_K.permute(1, 0, 2).reshape(d, g * e).to(args.device), lay.W_V.permute(1, 0, 2).reshape(
        d, g * e).to(args.device)                                        # [d_model, g*d_head]
    floors = []
    for _ in range(args.repeat):
        _sync(args.device)
        t0 = time.perf_counter()
        k = (x @ wk).view(-1, g, e).transpose(0, 1)                      # [g, tokens, d_head]
        v = (x @ wv).view(-1, g, e).transpose(0, 1)
        _ = (k.mT @ k, v.mT @ v, k.mT @ v)
        _sync(args.device)
        floors.append(time.perf_counter() - t0)
    floor = statistics.median(floors)
    print(f"floor: the layer's K, V projections and Grams alone {floor:.3f} s")
    for logits in (False, True):
        adds, results = [], []
        for _ in range(args.repeat):
            acc = ActivationAccumulator(lay, meta, logits=logits, device=args.device)
            _sync(args.device)
            t0 = time.perf_counter()
            for part in torch.tensor_split(x, args.batches):
                acc.add(part)
            _sync(args.device)
            t1 = time.perf_counter()
            acc.result()
            _sync(args.device)
            t2 = time.perf_counter()
            adds.append(t1 - t0)
            results.append(t2 - t1)
        a, r = (statistics.median(v) for v in (adds, results))
        print(f"logits={logits!s:5}: add() {a:.2f} s, result() {r:.2f} s, "
              f"total {a + r:.2f} s  (median of {args.repeat}); "
              f"total / floor = {(a + r) / floor:.1f}x")


if __name__ == "__main__":
    main()
