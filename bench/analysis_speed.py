"""Benchmark: full weight-level analysis of a Llama-shaped checkpoint against its exact floor.

Writes a Hugging Face Llama folder with random bfloat16 attention weights of a
known geometry (``bench/_shapes.py``; ``--shape 1.1B``: TinyLlama-1.1B's 22
layers, d_model 2048, 32 heads, 4 kv heads, d_head 64, 0.4 GB; ``--shape 7B``:
Llama-2-7B's 32 layers, d_model 4096, 32 heads MHA, d_head 128, 4.3 GB in 4
shards; ``--shape tiny``: 1 layer, d_model 256, 4 heads, 2 kv heads, a smoke run's; ``--layers N`` keeps that geometry with fewer layers; MLPs and
embeddings left out: the analysis does not read them), then measures, side by
side in this one run, each phase in a fresh process:

* ``read``: reading the same attention tensors into float32 memory
  (safetensors ``safe_open``, one tensor at a time; the page cache is warmed first),
* ``analysis``: ``app.jobs.weight_frame`` over ``loaders.checkpoints.open_checkpoint``
  (reading included): every weight-level metric of every layer and their chance
  levels, then ingesting the folder into a fresh DuckDB (``ingest``: hashing
  and the checkpoint row) and storing the rows (``store``), as ``analyze`` does;
  its phases are timed inside: ``stacked_wq`` (``wq_condition``,
  ``wq_basis_orth_defect``: one LU and Lanczos runs per layer), ``layer_m`` (the
  layer-level ``qk_symmetry`` / ``qk_directionality``), ``per_head`` (every other
  metric), ``chance`` (``analysis.chance``, cold), ``reading`` (opening,
  reading, converting); and the peak RSS above the imports,
* ``floor``: reading plus the bare float32 LU of every layer's stacked W_Q (no
  exact condition number or log-determinant comes cheaper), timed in the analysis
  process right after it,
* ``naive``: a straightforward version (a Python loop over heads, full SVDs of
  every head's W_Q, W_K, W_V, W_O and of the materialised d_model x d_model
  ``M_h = W_Q[h] W_K[g]^T``, symmetry from ``M_h`` itself, stacked-W_Q SVD) on
  ``--naive-layers`` layers, scaled to all layers (``--skip-naive`` leaves it out).

``--one-process`` runs the phases in this process instead (a smoke run's cost: one
process's imports; the phases are no longer cold, their peak RSS no longer their own).

Targets: analysis <= 2x the floor; analysis without the stacked-W_Q
metrics <= 3x the read; peak RSS above the imports <= 0.25 of the file (at the
full 7B shape: the analysis holds one layer, so a smaller file holds a larger share);
naive / analysis >= 100x. Each is printed as a ``BENCH_ROW {json}`` line that
``bench/run_all.py`` collects. ``--repeat N`` (default 3) alternates the read and
analysis phases and reports the median of each (the 1-minute load average before
and after is printed); each phase also reports its CPU seconds. On a busy
machine OpenMP's spin-waiting makes multi-threaded phases erratic: measure with
``--threads 1`` there, and compare ratios, not seconds.

    .venv/bin/python bench/analysis_speed.py [--shape 1.1B|7B] [--layers N] [--device cpu|cuda]
                                             [--naive-layers 2] [--dir DIR] [--threads N] [--repeat 3]
                                             [--skip-naive] [--one-process]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import _child  # noqa: E402  (bench/ is on sys.path: this script's folder)
import _shapes  # noqa: E402

SHAPES = {"1.1B": _shapes.LLAMA_1B, "7B": _shapes.LLAMA_7B, "tiny": _shapes.TINY}


def shape_of(args) -> "_shapes.Shape":
    shape = SHAPES[args.shape]
    return shape.with_(n_layers=args.layers, shards=min(shape.shards, args.layers)) if args.layers else shape


def build(folder: Path, shape) -> None:
    _shapes.build(folder, shape)


def _files(folder: Path) -> list[Path]:
    return sorted(folder.glob("model*.safetensors"))


def peak_rss_mib() -> float:
    """Peak resident memory of this process image (MiB): ``VmHWM`` of /proc/self/status.
    Not ``ru_maxrss``: Linux keeps that across ``execve``, so a phase process would report
    the peak of the parent it was started from (the one that wrote the 4 GB folder)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mib() -> float:
    """Resident memory now (MiB), from /proc/self/statm."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def phase_read(folder: Path, device: str) -> dict:
    from safetensors import safe_open

    def once():
        n = 0
        for path in _files(folder):
            with safe_open(str(path), framework="pt") as f:
                for k in f.keys():                           # one tensor at a time, as the analysis reads
                    t = f.get_tensor(k).to(device).float()        # widened where the analysis widens it
                    n += 1
                    del t
        return n
    once()                                                        # warm the page cache
    t0, c0 = time.perf_counter(), time.process_time()
    n = once()
    if device == "cuda":
        import torch
        torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0, "n_tensors": n}


def phase_analysis(folder: Path, device: str) -> dict:
    from analysis import chance, products, weights

    base_rss = rss_mib()
    spent = {"stacked_wq": 0.0, "layer_m": 0.0, "metrics": 0.0, "chance": 0.0}
    cpu_spent = dict(spent)                                       # the same in CPU seconds (all threads)
    inside = {"chance": False}

    def timed(key, fn):
        def wrapper(*args, **kw):
            if inside["chance"] and key != "chance":              # the random layers' own metrics
                return fn(*args, **kw)
            inside[key] = True
            t, c = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kw)
            finally:
                inside[key] = False
                spent[key] += time.perf_counter() - t
                cpu_spent[key] += time.process_time() - c
        return wrapper
    # the stacked-W_Q metrics, the layer-level M scores, all metrics of a layer (reading and reshaping
    # excluded), and the chance levels (random layers of the same shapes, once per shape: analysis.chance)
    # (analysis.products calls them through its module references, per layer); put back at the end, so
    # a second call in the same process (analysis_scaling --one-process) times the functions themselves
    wrapped = [(products.query_absorb, "stacked_spectrum", "stacked_wq")]
    wrapped += [(products.qk_geometry, name, "layer_m")
                for name in ("dense_layer_scores", "layer_form", "symmetry_layer", "directionality_layer")]
    # (app.jobs.weight_frame imports these two from their modules when it runs)
    wrapped += [(weights, "weight_metrics", "metrics"), (chance, "attach_weight_chance", "chance")]
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in wrapped]
    for mod, name, key in wrapped:
        setattr(mod, name, timed(key, getattr(mod, name)))
    try:
        return _timed_analysis(folder, device, spent, cpu_spent, base_rss)
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)


def _timed_analysis(folder: Path, device: str, spent: dict, cpu_spent: dict, base_rss: float) -> dict:
    """``phase_analysis`` once its functions are wrapped to add their seconds to ``spent``/``cpu_spent``."""
    import torch

    from analysis import chance, query_absorb, weights
    from analysis._linalg import as_float32
    from app.jobs import JobResult, _store_results, resolve, weight_frame
    from loaders.checkpoints import open_checkpoint
    from loaders.store import Store

    with open_checkpoint(folder) as ck:                           # warm-up on the first layer
        weights.weight_metrics(ck.layer(0), ck.meta, device=device)
    spent.update(stacked_wq=0.0, layer_m=0.0, metrics=0.0, chance=0.0)
    cpu_spent.update(spent)
    chance.use_store(None)                                        # the chance levels are timed cold:
    chance._chance_rows.cache_clear()                             # drawn, not read from the disk store
    t0, c0 = time.perf_counter(), time.process_time()
    with open_checkpoint(folder) as ck:
        frame, notes = weight_frame(ck, device=device)
    total = time.perf_counter() - t0
    cpu = time.process_time() - c0
    peak_rss = peak_rss_mib()
    # ingest (hashing, the checkpoint row) and storing the rows, as `analyze PATH` does after computing
    with tempfile.TemporaryDirectory(prefix="qkvscope-bench-db-") as tmp:
        store = Store(Path(tmp) / "bench.duckdb")
        t = time.perf_counter()
        cid = resolve(store, str(folder))
        ingest = time.perf_counter() - t
        t = time.perf_counter()
        _store_results(store, [JobResult(cid, str(folder), "weights", frame, notes, device=device)])
        store_s = time.perf_counter() - t
    # the floor of any exact wq_condition / wq_basis_orth_defect: reading every layer plus the bare
    # LU of its stacked W_Q (float32), timed after the analysis in this process; and beside it the
    # other products no exact value of the metrics can skip (``exact_products``)
    lu_seconds, floor_read, products = 0.0, 0.0, 0.0
    with open_checkpoint(folder) as ck, torch.inference_mode():
        for i in range(ck.meta.n_layers):
            t = time.perf_counter()
            layer = ck.layer(i)
            ts = [as_float32(x, device) for x in (layer.W_Q, layer.W_K, layer.W_V, layer.W_O)]
            floor_read += time.perf_counter() - t
            a = query_absorb.stack_queries(ts[0])
            t = time.perf_counter()
            torch.linalg.lu_factor_ex(a)
            if device == "cuda":
                torch.cuda.synchronize()
            lu_seconds += time.perf_counter() - t
            products += exact_products(*ts, device=device)
            del layer, ts, a
    return {"seconds": total, "cpu_seconds": cpu, "lu_only_seconds": lu_seconds, "floor_read_seconds": floor_read,
            "exact_products_seconds": products,
            "stacked_wq_seconds": spent["stacked_wq"], "layer_m_seconds": spent["layer_m"],
            "per_head_seconds": spent["metrics"] - spent["stacked_wq"] - spent["layer_m"],
            "other_metrics_seconds": spent["metrics"] - spent["stacked_wq"],
            "chance_seconds": spent["chance"],
            "reading_seconds": total - spent["metrics"] - spent["chance"],
            "ingest_seconds": ingest, "store_seconds": store_s,
            "base_rss_mib": base_rss, "analysis_peak_rss_mib": peak_rss,
            "cpu": {"stacked_wq": cpu_spent["stacked_wq"], "layer_m": cpu_spent["layer_m"],
                    "per_head": cpu_spent["metrics"] - cpu_spent["stacked_wq"] - cpu_spent["layer_m"],
                    "chance": cpu_spent["chance"], "read": cpu - cpu_spent["metrics"] - cpu_spent["chance"]},
            "rows": len(frame), "notes": sorted(notes)}


def exact_products(q, k, v, o, *, device: str) -> float:
    """Seconds of the products that every exact value of the layer's metrics needs besides the LU,
    each once and bare (no metric read off them): the layer's ``M = Qs Ks^T`` (``d_model^2 n_kv
    d_head`` multiply-adds in float32, the cheapest way to its row and column norms and
    ``tr(M^2)``: ``analysis.qk_geometry``) and the per-head float64 products the spectra and the
    K/V and Q/K scores are read from (``Q_h^T Q_h``, ``K^T Q_h``, ``K^T K``, ``V^T V``, ``K^T V``,
    ``W_O[h] W_O[h]^T``: float64 is what keeps them to 1e-3 at condition 1e6,
    ``tests/analysis/test_precision.py``). ``q, o: [n_heads, ...]``, ``k, v: [n_kv_heads, d_model,
    d_head]``, float32 as the analysis holds them."""
    import torch

    from analysis._linalg import grams_and_cross, kv_index, row_gram, stack_heads, sum_groups
    from analysis.qk_geometry import query_products

    t = time.perf_counter()
    n_kv = k.shape[0]
    qs = stack_heads(q if q.shape[0] == n_kv else sum_groups(q, n_kv))    # [d_model, n_kv*d_head]
    m = qs @ stack_heads(k).mT                                            # M, [d_model, d_model]
    del m
    query_products(q, k, kv_index(q.shape[0], n_kv, q.device))           # Q_h^T Q_h, K^T Q_h
    grams_and_cross(k, v)                                                 # K^T K, V^T V, K^T V
    row_gram(o)                                                           # W_O[h] W_O[h]^T
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


def phase_naive(folder: Path, device: str, layers: int, shape) -> dict:
    import torch
    from safetensors import safe_open

    h_, g_, e_ = shape.n_heads, shape.n_kv_heads, shape.d_head

    def erank(s):
        p = s / s.sum()
        return float(torch.exp(-(p * torch.log(p.clamp_min(1e-30))).sum()))

    where = {}
    for path in _files(folder):
        with safe_open(str(path), framework="pt") as f:
            where.update({k: path for k in f.keys()})
    t0 = time.perf_counter()
    out = []
    with torch.inference_mode():
        for i in range(layers):
            p = f"model.layers.{i}.self_attn."
            with safe_open(str(where[p + "q_proj.weight"]), framework="pt") as f:
                wq, wk, wv, wo = (f.get_tensor(p + f"{n}_proj.weight").float().to(device) for n in "qkvo")
            for h in range(h_):                                           # wq: [H*dh, d], wo: [d, H*dh]
                g = h // (h_ // g_)
                q = wq[h * e_:(h + 1) * e_].T                             # [d, dh]
                k = wk[g * e_:(g + 1) * e_].T
                v = wv[g * e_:(g + 1) * e_].T
                o = wo[:, h * e_:(h + 1) * e_].T                          # [dh, d]
                for a in (q, k, v, o):
                    out.append(erank(torch.linalg.svd(a, full_matrices=True)[1]))
                m = q @ k.T                                               # [d, d]
                out.append(erank(torch.linalg.svd(m)[1]))
                out.append(float(((m + m.T) / 2).square().sum() / m.square().sum()))
                out.append(float((k * v).sum() / (k.norm() * v.norm())))
            out.append(float(torch.linalg.cond(wq.T)))
    if device == "cuda":
        torch.cuda.synchronize()
    sec = time.perf_counter() - t0
    return {"seconds": sec, "layers": layers, "scaled_seconds": sec * shape.n_layers / layers}


def measure_phase(args, phase: str) -> dict:
    """One phase's figures, measured in this process."""
    import torch
    torch.set_num_threads(args.threads) if args.threads else None
    folder = Path(args.dir)
    if args.device_eig:
        import analysis._linalg
        analysis._linalg.HOST_SMALL = False
    if phase == "read":
        res = phase_read(folder, args.device)
    elif phase == "analysis":
        res = phase_analysis(folder, args.device)
    else:
        res = phase_naive(folder, args.device, args.naive_layers, shape_of(args))
    res["threads"] = torch.get_num_threads()
    res["peak_rss_mib"] = peak_rss_mib()
    if args.device == "cuda":
        res["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2 ** 20
    return res


def child(args) -> None:
    print(json.dumps(measure_phase(args, args.phase)))


def run_phase(args, phase: str) -> dict:
    """One phase in a fresh process (``--one-process``: in this one, after the others)."""
    if args.one_process:
        return measure_phase(args, phase)
    cmd = [sys.executable, __file__, "--phase", phase, "--dir", args.dir, "--device", args.device,
           "--naive-layers", str(args.naive_layers), "--threads", str(args.threads), "--shape", args.shape,
           "--layers", str(args.layers), *(["--device-eig"] if args.device_eig else [])]
    return child_json(cmd)


def child_json(cmd: list[str]) -> dict:
    """The JSON of the last stdout line of ``cmd`` (a phase in a fresh process); when it fails,
    a SystemExit that names the phase and carries the end of its stderr (``_child.run``)."""
    return json.loads(_child.run(cmd).strip().splitlines()[-1])


def bench_row(measured: str, figure: str, against: str, target: str, ok: bool | None) -> dict:
    """One row of the bench table, printed as ``BENCH_ROW {json}`` for ``bench/run_all.py``."""
    row = {"bench": "analysis_speed", "measured": measured, "figure": figure, "against": against,
           "target": target, "result": "-" if ok is None else ("pass" if ok else "FAIL")}
    print("BENCH_ROW " + json.dumps(row), flush=True)
    return row


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1.1B",
                    help="checkpoint geometry (bench/_shapes.py; default 1.1B; tiny: a smoke run's)")
    ap.add_argument("--layers", type=int, default=0, help="layers to write (default: the shape's)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--naive-layers", type=int, default=2)
    ap.add_argument("--dir", default=None, help="where to write the benchmark checkpoint (kept)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per phase (default: torch's)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="alternate the read and analysis phases this many times; report the medians "
                         "(default 3: a single read swings by 2-3x)")
    ap.add_argument("--phase", choices=["read", "analysis", "naive"], help=argparse.SUPPRESS)
    ap.add_argument("--skip-naive", action="store_true", help="measure read and analysis only")
    ap.add_argument("--one-process", action="store_true",
                    help="every phase in this process, one after the other (a smoke run: the imports and the "
                         "reading child are shared, peak RSS is this process's so far)")
    ap.add_argument("--device-eig", action="store_true",
                    help="on CUDA, keep the d_head x d_head eigen-decompositions and SVDs on the GPU "
                         "(analysis._linalg.HOST_SMALL off; default: on the host)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    args = ap.parse_args()
    if args.phase:
        child(args)
        return
    _child.outlive_abort()
    shape = shape_of(args)
    tmp = None
    if args.dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="qkvscope-bench-")
        args.dir = tmp.name
    build(Path(args.dir), shape)
    size_mib = sum(p.stat().st_size for p in _files(Path(args.dir))) / 2 ** 20
    load0 = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {"read": [], "analysis": []}
    for i in range(max(1, args.repeat)):
        for ph in ("read", "analysis"):
            runs[ph].append(run_phase(args, ph))
        if args.repeat > 1:
            r, a = runs["read"][-1]["seconds"], runs["analysis"][-1]["seconds"]
            print(f"  run {i + 1}: read {r:.3f} s, analysis {a:.3f} s ({a / r:.1f}x), "
                  f"stacked W_Q {runs['analysis'][-1]['stacked_wq_seconds']:.3f} s", flush=True)
    res = {}
    for ph, rs in runs.items():                     # the median run of each phase
        res[ph] = sorted(rs, key=lambda x: x["seconds"])[(len(rs) - 1) // 2]
        if len(rs) > 1:
            res[ph]["runs_seconds"] = [round(x["seconds"], 4) for x in rs]
        print(f"{ph:9s} {json.dumps(res[ph])}", flush=True)
    if not args.skip_naive:
        res["naive"] = run_phase(args, "naive")
        print(f"{'naive':9s} {json.dumps(res['naive'])}", flush=True)
    load1 = os.getloadavg()[0]
    an, a, r = res["analysis"], res["analysis"]["seconds"], res["read"]["seconds"]
    wq, lu = an["stacked_wq_seconds"], an["lu_only_seconds"]
    floor = r + lu
    n = shape.n_layers
    geo = (f"{shape.name}-shaped attention ({n} layers, d_model {shape.d_model}, {shape.n_heads} heads, "
           f"{shape.n_kv_heads} kv heads, {size_mib:,.0f} MiB)")
    small = "" if args.device != "cuda" else (
        "; the d_head x d_head decompositions on the " + ("GPU" if args.device_eig else "host"))
    print(f"\n{geo}; device {args.device}{small}, torch threads {an['threads']}, "
          f"1-min load average {load0:.2f} -> {load1:.2f}"
          + (f", median of {args.repeat} runs" if args.repeat > 1 else ""))
    print(f"read {r:.3f} s, bare float32 LU of each stacked W_Q {lu:.3f} s: floor {floor:.3f} s; "
          f"analysis {a:.3f} s ({an['rows']} values) = {a / floor:.2f}x the floor (target <= 2x)")
    print(f"  phases: reading/converting {an['reading_seconds']:.3f} s, stacked-W_Q metrics {wq:.3f} s, "
          f"layer-level M scores {an['layer_m_seconds']:.3f} s, per-head metrics {an['per_head_seconds']:.3f} s, "
          f"chance levels {an['chance_seconds']:.3f} s; then ingest {an['ingest_seconds']:.3f} s, "
          f"store {an['store_seconds']:.3f} s")
    print(f"  without the stacked-W_Q metrics: {a - wq:.3f} s = {(a - wq) / r:.2f}x read (target <= 3x)")
    exact = floor + an["exact_products_seconds"]
    print(f"  the arithmetic no exact analysis skips (read + LU + the layer's M + per-head float64 products): "
          f"{exact:.3f} s = {exact / floor:.2f}x the floor; the analysis is {a / exact:.2f}x that")
    above = an["analysis_peak_rss_mib"] - an["base_rss_mib"]
    print(f"  peak RSS {an['analysis_peak_rss_mib']:.0f} MiB, {above:.0f} MiB above the imports' "
          f"{an['base_rss_mib']:.0f} MiB = {above / size_mib:.3f} of the file (target <= 0.25)")
    bench_row(f"weight analysis, {geo}, chance levels included",
              f"{a / floor:.2f}x ({a:.2f} s)", f"floor: read {r:.2f} s + float32 LU of each stacked W_Q {lu:.2f} s",
              "<= 2x", a / floor <= 2)
    bench_row(f"weight analysis without the stacked-W_Q metrics, {shape.name}", f"{(a - wq) / r:.2f}x ({a - wq:.2f} s)",
              f"reading the same tensors ({r:.2f} s)", "<= 3x", (a - wq) / r <= 3)
    # context for the two targets above, measured in the same process as the floor: what the metrics'
    # exact values need besides the LU (bench/analysis_speed.py:exact_products); no target of its own
    bench_row(f"the arithmetic no exact analysis skips, {shape.name}: read + LU + the layer's M (float32) "
              f"+ per-head float64 products", f"{exact / floor:.2f}x ({exact:.2f} s)",
              f"floor ({floor:.2f} s)", "-", None)
    bench_row(f"weight analysis against that arithmetic, {shape.name}", f"{a / exact:.2f}x ({a:.2f} s)",
              f"read + LU + M + per-head products ({exact:.2f} s)", "-", None)
    # the target is the attention-only 7B shape's: one layer at a time, so smaller files hold more
    full_7b = args.shape == "7B" and shape.n_layers == SHAPES["7B"].n_layers
    bench_row(f"peak RSS above imports, weight analysis, {geo}", f"{above / size_mib:.3f} of the file ({above:.0f} MiB)",
              f"file size ({size_mib:,.0f} MiB)", "<= 0.25" if full_7b else "- (the 7B shape's)",
              above / size_mib <= 0.25 if full_7b else None)
    if "naive" in res:
        nv = res["naive"]["scaled_seconds"]
        print(f"naive (scaled) / analysis = {nv / a:.0f}x   (naive {res['naive']['seconds']:.1f} s on "
              f"{args.naive_layers} layers -> {nv:.0f} s for {n}; target >= 100x)")
        bench_row(f"naive per-head SVD version, scaled to {n} layers, {shape.name}", f"{nv / a:.0f}x ({nv:.0f} s)",
                  f"the analysis ({a:.2f} s)", ">= 100x", nv / a >= 100)
    print("peak RSS MiB: " + ", ".join(f"{k} {v['peak_rss_mib']:.0f}" for k, v in res.items())
          + ("" if args.device != "cuda" else
             "; peak CUDA MiB: " + ", ".join(f"{k} {v['peak_cuda_mib']:.0f}" for k, v in res.items())))
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
