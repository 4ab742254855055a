"""Profile: where one layer's weight metrics spend their time, op by op (torch profiler).

    .venv/bin/python scripts/layer_profile.py [--shape 7B|1.1B] [--device cpu|cuda] [--repeat 3] [--rows 15]

Writes a one-layer folder of the shape (``bench/_shapes.py``: random bfloat16
attention weights), reads its layer as the analysis does
(``loaders.checkpoints.open_checkpoint``), runs ``analysis.weights.weight_metrics``
once to warm up, then times ``--repeat`` calls (the median) and prints the
profiler's table of one more call: each op's self CPU time and, on CUDA, its
self CUDA time. On CUDA it does this twice, with the ``d_head x d_head``
eigen-decompositions and SVDs on the host (``analysis._linalg.HOST_SMALL``, the
default) and on the GPU, and prints the two medians side by side. Context for
the README's profile of the 7B case (issue 20). A tool, not a benchmark: it
prints tables, no target, and ``python -m app bench`` does not run it.
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

SHAPES = {"1.1B": _shapes.LLAMA_1B, "7B": _shapes.LLAMA_7B}


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
    with profile(activities=acts) as prof:
        call()
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=rows), flush=True)
    if device == "cuda":
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows), flush=True)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="7B")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rows", type=int, default=15, help="ops per table")
    args = ap.parse_args()
    import torch

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
            settings = [True, False] if args.device == "cuda" else [linalg.HOST_SMALL]
            medians = {}
            for host in settings:
                linalg.HOST_SMALL = host
                where = "host" if host else "GPU"
                print(f"\n-- d_head x d_head decompositions on the {where}" if args.device == "cuda" else "")
                medians[where] = profile_layer(layer, meta, args.device, args.repeat, args.rows)
                print(f"weight_metrics of the layer: median {medians[where]:.4f} s of {args.repeat}", flush=True)
    if len(medians) == 2:
        print(f"\nsmall decompositions on the host {medians['host']:.4f} s, on the GPU {medians['GPU']:.4f} s "
              f"per layer ({medians['GPU'] / medians['host']:.2f}x)")


if __name__ == "__main__":
    main()
