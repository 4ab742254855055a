"""Profile: where one layer's weight metrics spend their time, op by op (torch profiler).

    .venv/bin/python scripts/layer_profile.py [--shape 7B|1.1B|tiny] [--device cpu|cuda] [--repeat 3] [--rows 15]

Writes a one-layer folder of the shape (``bench/_shapes.py``: random bfloat16
attention weights), reads its layer as the analysis does
(``loaders.checkpoints.open_checkpoint``), runs ``analysis.weights.weight_metrics``
once to warm up, then times ``--repeat`` calls (the median) and prints the
profiler's table of one more call: each op's self CPU time and, on CUDA, its
self CUDA time. On CUDA it does this twice, with the ``d_head x d_head``
eigen-decompositions and SVDs on the host (``analysis._linalg.HOST_SMALL``, the
default) and on the GPU, and prints the two medians side by side. Context for
the weight-analysis rows of docs/performance.md at the 7B shape. A tool, not a benchmark: it
prints tables, no target, and ``python -m app bench`` does not run it.

``--gpu-blocks 1 4 8`` times the layer with those Lanczos block sizes of the stacked
W_Q's spectrum on CUDA. ``--pool`` also times the layer with the stacks of small host decompositions as
one torch call each (``analysis._lapack_pool.POOL`` off: MKL's threads inside each
problem) beside the default (one problem per thread), and ``--micro`` times the
host decompositions alone: one ``[heads, d_head, d_head]`` stack pooled and not,
and single symmetric matrices of 16-512 rows (the Lanczos runs' projected
matrices) with all threads and with one.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import _shapes  # noqa: E402  (bench/_shapes.py: the benchmarks' checkpoint geometries)

SHAPES = {"1.1B": _shapes.LLAMA_1B, "7B": _shapes.LLAMA_7B, "tiny": _shapes.TINY}


def profile_layer(layer, meta, device: str, repeat: int, rows: int) -> float:
    """Median seconds of ``weight_metrics(layer)`` over ``repeat`` calls; prints one call's profile."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from analysis.weights import weight_metrics

    def call():
        weight_metrics(layer, meta, device=device)
        if device == "cuda":
            torch.cuda.synchronize()

    call()                                                            # warm-up (kernels, allocator)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts, record_shapes=True) as prof:
        call()
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=rows), flush=True)
    if device == "cuda":
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows), flush=True)
    # the decompositions by input shape: which stacks and which Lanczos steps cost what
    linalg = [e for e in prof.key_averages(group_by_input_shape=True) if "linalg_eig" in e.key or "linalg_svd" in e.key]
    linalg.sort(key=lambda e: -e.self_cpu_time_total)
    print(f"{'decomposition':<22} {'input shapes':<34} {'calls':>6} {'self CPU ms':>12}")
    for e in linalg[:rows]:
        print(f"{e.key:<22} {str(e.input_shapes)[:34]:<34} {e.count:>6} {e.self_cpu_time_total / 1e3:>12.2f}")
    return statistics.median(times)


def _median(fn, repeat: int = 15) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def micro(heads: int, d_head: int) -> None:
    """The host decompositions alone, milliseconds (medians of 15)."""
    import torch

    from analysis import _lapack_pool
    from concurrent.futures import ThreadPoolExecutor

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(heads, 4 * d_head, d_head, generator=gen, dtype=torch.float64)
    g = a.mT @ a                                                      # [heads, d_head, d_head]
    threads = torch.get_num_threads()
    print(f"\n-- the host decompositions alone ({threads} threads; ms, medians of 15)")
    for name, f, x in (("eigh", torch.linalg.eigh, g), ("eigvalsh", torch.linalg.eigvalsh, g),
                       ("svdvals", torch.linalg.svdvals, a)):
        res = {}
        for pool in (True, False):
            _lapack_pool.POOL = pool
            res[pool] = _median(lambda: _lapack_pool.pooled(f, x)) * 1e3
        _lapack_pool.POOL = True
        print(f"{name:<9} {list(x.shape)}: one problem per thread {res[True]:8.2f}, one torch call "
              f"{res[False]:8.2f} ({res[False] / res[True]:.1f}x)", flush=True)
    one = ThreadPoolExecutor(1)
    one.submit(torch.set_num_threads, 1).result()                     # that thread's count only
    for n in (16, 32, 64, 128, 256, 512):
        s = torch.randn(n, n, generator=gen, dtype=torch.float64)
        s = s + s.mT
        full = _median(lambda: torch.linalg.eigh(s)) * 1e3
        single = _median(lambda: one.submit(torch.linalg.eigh, s).result()) * 1e3
        print(f"eigh [{n}, {n}]: {threads} threads {full:8.3f}, one thread {single:8.3f}", flush=True)
    torch.set_num_threads(threads)
    one.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="7B")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rows", type=int, default=15, help="ops per table")
    ap.add_argument("--pool", action="store_true",
                    help="also time the layer with the host decompositions as one torch call per stack")
    ap.add_argument("--micro", action="store_true", help="also time the host decompositions alone")
    ap.add_argument("--gpu-blocks", type=int, nargs="*", default=[],
                    help="also time the layer (no profile) with these Lanczos block sizes on CUDA "
                         "(analysis.query_absorb.GPU_BLOCK)")
    args = ap.parse_args()
    import torch

    import analysis._lapack_pool as lapack_pool
    import analysis._linalg as linalg
    from loaders.checkpoints import open_checkpoint

    shape = SHAPES[args.shape].with_(n_layers=1, shards=1)
    with tempfile.TemporaryDirectory(prefix="qkvscope-profile-") as tmp:
        _shapes.build(Path(tmp), shape)
        with open_checkpoint(Path(tmp)) as ck:
            layer, meta = ck.layer(0), ck.meta
            print(f"one {args.shape}-shaped layer (d_model {shape.d_model}, {shape.n_heads} heads, "
                  f"{shape.n_kv_heads} kv heads, d_head {shape.d_head}) on {args.device}, "
                  f"torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
            # (label, small decompositions on the host, one problem per thread)
            settings = [("host", True, True)] + ([("host, one call per stack", True, False)] if args.pool else [])
            if args.device == "cuda":
                settings.append(("GPU", False, True))
            else:
                settings = [(label.replace("host", "CPU"), h, p) for label, h, p in settings]
            medians = {}
            for label, host, pool in settings:
                linalg.HOST_SMALL, lapack_pool.POOL = host, pool
                print(f"\n-- d_head x d_head decompositions: {label}", flush=True)
                medians[label] = profile_layer(layer, meta, args.device, args.repeat, args.rows)
                print(f"weight_metrics of the layer: median {medians[label]:.4f} s of {args.repeat}", flush=True)
            linalg.HOST_SMALL, lapack_pool.POOL = True, True
            if args.gpu_blocks and args.device == "cuda":
                from analysis import query_absorb
                from analysis.weights import weight_metrics
                default = query_absorb.GPU_BLOCK

                def call():
                    weight_metrics(layer, meta, device=args.device)
                    torch.cuda.synchronize()
                print(f"\n-- Lanczos block sizes on the GPU (default {default}; medians of {args.repeat})")
                for b in args.gpu_blocks:
                    query_absorb.GPU_BLOCK = b
                    call()
                    print(f"block {b}: {_median(call, args.repeat):.4f} s per layer", flush=True)
                query_absorb.GPU_BLOCK = default
            if args.micro:
                micro(shape.n_heads, shape.d_head)
    first = next(iter(medians))
    print("\nper layer: " + ", ".join(f"{label} {m:.4f} s ({m / medians[first]:.2f}x)" for label, m in medians.items()))


if __name__ == "__main__":
    main()
