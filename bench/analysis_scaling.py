"""Benchmark: how each phase of the weight analysis grows with d_model, and MHA against GQA.

For d_model 1024, 2048 and 4096 at a fixed number of layers (``--layers``, default
2) and fixed d_head 128 (``--d-head``) (full multi-head: ``n_heads = n_kv_heads = d_model / 128``),
and for grouped-query attention at d_model 2048 (16 heads, ``--gqa-kv`` kv heads,
default 4), writes a random attention-only Llama folder (``bench/_shapes.py``) and
runs ``bench/analysis_speed.py``'s analysis phase in a fresh process: seconds per
phase in CPU seconds (one torch thread by default; ``read``: opening, reading and converting the tensors; ``stacked_wq``: the
LU and Lanczos runs of ``wq_condition``/``wq_basis_orth_defect``; ``layer_m``: the
layer-level ``qk_symmetry``/``qk_directionality``; ``per_head``: every other metric;
``chance``: the chance levels, cold; ``store``: writing the rows to DuckDB), and
the least-squares exponent of each phase in d_model over the three MHA sizes,
beside the exponent it should have:

* ``read``, ``per_head``: 2 (``d_model^2`` weights; at fixed d_head every per-head
  metric costs ``d_model d_head^2`` per head, ``d_model / d_head`` heads);
* ``stacked_wq``: 3 (one ``d_model x d_model`` LU);
* ``layer_m``: 3 for a full multi-head layer (``M`` is ``d_model x d_model``, from a
  product of inner dimension ``n_kv d_head = d_model``);
* ``chance``: 2 (a few random layers of the same shape: drawing them and their
  per-head metrics; a square stack's ``wq_condition``/``wq_basis_orth_defect`` and
  the ``qk_*`` scores have closed-form chance levels, so the draws skip the LU and ``M``);
* ``store``: 1 (rows: one per head and metric, ``d_model / d_head`` heads).

A phase whose fitted exponent exceeds its expected one by more than 0.5 is a
FAIL row (the fit over three sizes on a shared machine is noisy: compare CPU
seconds, printed too). Rows are printed as ``BENCH_ROW {json}`` for ``bench/run_all.py``.
``--one-process`` runs every analysis in this process instead of a fresh one each (a smoke
run: one process's imports and reading child; the chance levels are still computed cold).

    .venv/bin/python bench/analysis_scaling.py [--layers 2] [--sizes 1024 2048 4096] [--gqa-kv 4]
                                               [--threads N] [--device cpu|cuda] [--dir DIR] [--one-process]
                                               [--d-head 128]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _shapes  # noqa: E402
import _child  # noqa: E402
from analysis_speed import child_json, phase_analysis  # noqa: E402

BENCH = Path(__file__).resolve().parent
PHASES = ("read", "stacked_wq", "layer_m", "per_head", "chance", "store")
EXPECTED = {"read": 2, "stacked_wq": 3, "layer_m": 3, "per_head": 2, "chance": 2, "store": 1}
D_HEAD = 128


def measure(folder: Path, shape: _shapes.Shape, threads: int, device: str = "cpu",
            one_process: bool = False) -> dict[str, float]:
    """Seconds per phase of one analysis of ``shape`` (a fresh process: bench/analysis_speed.py;
    ``one_process``: its analysis phase in this process, the chance levels still cold)."""
    _shapes.build(folder, shape)
    if one_process:
        import torch
        torch.set_num_threads(threads)
        out = phase_analysis(folder, device)
    else:
        cmd = [sys.executable, str(BENCH / "analysis_speed.py"), "--phase", "analysis", "--dir", str(folder),
               "--threads", str(threads), "--device", device]
        out = child_json(cmd)
    # CPU seconds per phase (one torch thread by default: on a shared machine wall-clock phases
    # swing by 10x, CPU seconds far less); store is wall-clock (DuckDB's own threads)
    return {**out["cpu"], "store": out["store_seconds"], "total": out["cpu_seconds"], "wall": out["seconds"]}


def exponent(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ``log y`` on ``log x`` (nan when a time is 0)."""
    if min(ys) <= 0:
        return math.nan
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def row(measured: str, figure: str, against: str, target: str, ok: bool | None) -> None:
    print("BENCH_ROW " + json.dumps({"bench": "analysis_scaling", "measured": measured, "figure": figure,
                                     "against": against, "target": target,
                                     "result": "-" if ok is None else ("pass" if ok else "FAIL")}), flush=True)


def run(layers: int, sizes: list[int], gqa_kv: int, threads: int, folder: Path, device: str = "cpu",
        one_process: bool = False, d_head: int = D_HEAD) -> dict:
    """``{"mha": {d_model: phases}, "gqa": phases, "exponents": {phase: fitted}}``; prints the table and rows."""
    mha = {}
    for d in sizes:
        h = d // d_head
        shape = _shapes.Shape(f"mha-{d}", layers, d, h, h, d_head)
        mha[d] = measure(folder / f"mha-{d}", shape, threads, device, one_process)
    d_gqa = sizes[len(sizes) // 2]
    h = d_gqa // d_head
    gqa = measure(folder / f"gqa-{d_gqa}", _shapes.Shape(f"gqa-{d_gqa}", layers, d_gqa, h, gqa_kv, d_head), threads,
                  device, one_process)
    exps = {p: exponent(sizes, [mha[d][p] for d in sizes]) for p in PHASES}
    print(f"CPU seconds per phase (store, wall: wall-clock), {layers} layers, d_head {d_head}:")
    print(f"{'phase':<11}" + "".join(f"{'MHA d=' + str(d):>13}" for d in sizes)
          + f"{'GQA-' + str(h // gqa_kv) + ' d=' + str(d_gqa):>14}{'exponent':>10}{'expected':>10}")
    for p in (*PHASES, "total", "wall"):
        fit = f"{exps[p]:>10.2f}{EXPECTED[p]:>10}" if p in exps else ""
        print(f"{p:<11}" + "".join(f"{mha[d][p]:>13.3f}" for d in sizes) + f"{gqa[p]:>14.3f}" + fit)
    for p in PHASES:
        ok = None if math.isnan(exps[p]) else exps[p] <= EXPECTED[p] + 0.5
        row(f"exponent in d_model of phase '{p}' (MHA, d_model {'/'.join(map(str, sizes))}, {layers} layers)",
            f"{exps[p]:.2f} ({' / '.join(f'{mha[d][p]:.2f}' for d in sizes)} s)", "the expected exponent",
            f"<= {EXPECTED[p]} (+0.5)", ok)
    mt, gt = mha[d_gqa]["total"], gqa["total"]
    row(f"GQA-{h // gqa_kv} against MHA at d_model {d_gqa} ({layers} layers)", f"{gt / mt:.2f}x ({gt:.2f} s)",
        f"MHA ({mt:.2f} s)", "-", None)
    return {"mha": mha, "gqa": gqa, "exponents": exps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--gqa-kv", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: CPU seconds add up)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dir", type=Path, default=None, help="where to write the folders (kept)")
    ap.add_argument("--d-head", type=int, default=D_HEAD, help=f"head width (default {D_HEAD})")
    ap.add_argument("--one-process", action="store_true",
                    help="every analysis in this process (a smoke run: the imports and the reading child shared)")
    args = ap.parse_args()
    _child.outlive_abort()
    with tempfile.TemporaryDirectory(prefix="qkvscope-scaling-") as tmp:
        run(args.layers, args.sizes, args.gqa_kv, args.threads, args.dir or Path(tmp), args.device,
            args.one_process, args.d_head)


if __name__ == "__main__":
    main()
