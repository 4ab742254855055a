"""Benchmark: full weight-level analysis of a Llama-1B-shaped checkpoint.

Writes a Hugging Face Llama folder with random bfloat16 attention weights of
TinyLlama-1.1B's geometry (22 layers, d_model 2048, 32 heads, 4 kv heads,
d_head 64; MLPs and embeddings left out: the analysis does not read them),
then measures, side by side in this one run, each phase in a fresh process:

* ``read``: reading the same attention tensors into float32 memory
  (safetensors ``safe_open``; the page cache is warmed first),
* ``analysis``: ``app.jobs.weight_frame`` over ``loaders.checkpoints.open_checkpoint``
  (reading included): every weight-level metric of every layer,
* ``naive``: a straightforward version (a Python loop over heads, full SVDs of
  every head's W_Q, W_K, W_V, W_O and of the materialised d_model x d_model
  ``M_h = W_Q[h] W_K[g]^T``, symmetry from ``M_h`` itself, stacked-W_Q SVD) on
  ``--naive-layers`` layers, scaled to all layers.

Prints the seconds, the ratios analysis/read (target <= 5 on CPU) and
naive/analysis (target >= 100) and each phase's peak resident memory (and
peak CUDA memory on a GPU). The analysis time is broken down into the
stacked-W_Q metrics (``wq_condition``, ``wq_basis_orth_defect``: one
``d_model x d_model`` LU and two Lanczos runs per layer, the only
``O(d_model^3)`` step), the other metrics, and opening/reading/reshaping the
checkpoint, and the chance levels (``analysis.chance``: random layers of the same
shapes, computed cold once for the checkpoint), whose cost relative to the rest of
the analysis is printed (target: at most double it); the ratio without the
stacked-W_Q metrics is printed too.
The bare LU factorisations alone (every layer's stacked W_Q, float32, already
in memory) are timed too: no exact condition number or log-determinant comes
cheaper, so their ratio to ``read`` is this machine's floor for the first
ratio. ``--repeat N`` (default 3) alternates the read and analysis phases N times and reports the
median of each (wall-clock times on a shared machine vary a lot; the 1-minute
load average before and after is printed). Each phase also reports its CPU
seconds (all threads). On a machine other processes keep busy, OpenMP's
spin-waiting makes multi-threaded phases slow and erratic (10x and more: every
small parallel region waits for a descheduled thread); measure there with
``--threads 1``, or with ``OMP_WAIT_POLICY=PASSIVE`` in the environment.

    .venv/bin/python bench/analysis_speed.py [--device cpu|cuda] [--naive-layers 2] [--dir DIR]
                                             [--threads N] [--repeat 3] [--skip-naive]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

N_LAYERS, D_MODEL, N_HEADS, N_KV, D_HEAD = 22, 2048, 32, 4, 64


def build(folder: Path) -> None:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "model.safetensors").exists():
        return
    g = torch.Generator().manual_seed(0)
    sd = {}
    for i in range(N_LAYERS):
        p = f"model.layers.{i}.self_attn."
        for name, rows, cols in (("q", N_HEADS * D_HEAD, D_MODEL), ("k", N_KV * D_HEAD, D_MODEL),
                                 ("v", N_KV * D_HEAD, D_MODEL), ("o", D_MODEL, N_HEADS * D_HEAD)):
            sd[p + f"{name}_proj.weight"] = (torch.randn(rows, cols, generator=g) * 0.02).to(torch.bfloat16)
    save_file(sd, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": D_MODEL,
        "num_attention_heads": N_HEADS, "num_key_value_heads": N_KV, "num_hidden_layers": N_LAYERS,
        "intermediate_size": 5632, "vocab_size": 32000, "torch_dtype": "bfloat16"}))
    os.sync()   # write the 0.4 GB out now, not while the phases are timed


def phase_read(folder: Path, device: str) -> dict:
    from safetensors import safe_open

    def once():
        with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
            return [f.get_tensor(k).float().to(device) for k in f.keys()]
    once()                                                        # warm the page cache
    t0, c0 = time.perf_counter(), time.process_time()
    ts = once()
    if device == "cuda":
        import torch
        torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0,
            "n_tensors": len(ts)}


def phase_analysis(folder: Path, device: str) -> dict:
    import app.jobs
    from analysis import query_absorb, weights
    from app.jobs import weight_frame
    from loaders.checkpoints import open_checkpoint

    from analysis import chance

    spent = {"stacked_wq": 0.0, "metrics": 0.0, "chance": 0.0}
    inside = {"chance": False}

    def timed(key, fn):
        def wrapper(*args, **kw):
            if inside["chance"] and key != "chance":              # the random layers' own metrics
                return fn(*args, **kw)
            inside[key] = True
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                inside[key] = False
                spent[key] += time.perf_counter() - t
        return wrapper
    # the stacked-W_Q metrics, all metrics of a layer (reading and reshaping excluded), and the
    # chance levels (random layers of the same shapes, once per shape: analysis.chance)
    weights.query_absorb.stacked_spectrum = timed("stacked_wq", query_absorb.stacked_spectrum)
    app.jobs.weight_metrics = timed("metrics", weights.weight_metrics)
    app.jobs.attach_weight_chance = timed("chance", chance.attach_weight_chance)

    with open_checkpoint(folder) as ck:                           # warm-up on the first layer
        weights.weight_metrics(ck.layer(0), ck.meta, device=device)
    spent.update(stacked_wq=0.0, metrics=0.0, chance=0.0)
    chance._chance_rows.cache_clear()                             # the chance levels are timed cold
    t0, c0 = time.perf_counter(), time.process_time()
    with open_checkpoint(folder) as ck:
        frame, notes = weight_frame(ck, device=device)
    total = time.perf_counter() - t0
    cpu = time.process_time() - c0
    # the floor of any exact wq_condition / wq_basis_orth_defect: the bare LU of every
    # layer's stacked W_Q (float32, already in memory), timed after the analysis
    import torch
    lu_seconds = 0.0
    with open_checkpoint(folder) as ck, torch.inference_mode():
        for i in range(ck.meta.n_layers):
            a = query_absorb.stack_queries(ck.layer(i).W_Q.to(device))
            t = time.perf_counter()
            torch.linalg.lu_factor_ex(a)
            if device == "cuda":
                torch.cuda.synchronize()
            lu_seconds += time.perf_counter() - t
    return {"seconds": total, "cpu_seconds": cpu, "lu_only_seconds": lu_seconds,
            "stacked_wq_seconds": spent["stacked_wq"],
            "other_metrics_seconds": spent["metrics"] - spent["stacked_wq"],
            "chance_seconds": spent["chance"],
            "reading_seconds": total - spent["metrics"] - spent["chance"],
            "rows": len(frame), "notes": sorted(notes)}


def phase_naive(folder: Path, device: str, layers: int) -> dict:
    import torch
    from safetensors import safe_open

    def erank(s):
        p = s / s.sum()
        return float(torch.exp(-(p * torch.log(p.clamp_min(1e-30))).sum()))

    t0 = time.perf_counter()
    out = []
    with torch.inference_mode(), safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        for i in range(layers):
            p = f"model.layers.{i}.self_attn."
            wq = f.get_tensor(p + "q_proj.weight").float().to(device)    # [H*dh, d]
            wk = f.get_tensor(p + "k_proj.weight").float().to(device)
            wv = f.get_tensor(p + "v_proj.weight").float().to(device)
            wo = f.get_tensor(p + "o_proj.weight").float().to(device)    # [d, H*dh]
            for h in range(N_HEADS):
                g = h // (N_HEADS // N_KV)
                q = wq[h * D_HEAD:(h + 1) * D_HEAD].T                     # [d, dh]
                k = wk[g * D_HEAD:(g + 1) * D_HEAD].T
                v = wv[g * D_HEAD:(g + 1) * D_HEAD].T
                o = wo[:, h * D_HEAD:(h + 1) * D_HEAD].T                  # [dh, d]
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
    return {"seconds": sec, "layers": layers, "scaled_seconds": sec * N_LAYERS / layers}


def child(args) -> None:
    import torch
    torch.set_num_threads(args.threads) if args.threads else None
    folder = Path(args.dir)
    if args.phase == "read":
        res = phase_read(folder, args.device)
    elif args.phase == "analysis":
        res = phase_analysis(folder, args.device)
    else:
        res = phase_naive(folder, args.device, args.naive_layers)
    res["threads"] = torch.get_num_threads()
    res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.device == "cuda":
        res["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2 ** 20
    print(json.dumps(res))


def run_phase(args, phase: str) -> dict:
    cmd = [sys.executable, __file__, "--phase", phase, "--dir", args.dir, "--device", args.device,
           "--naive-layers", str(args.naive_layers), "--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--naive-layers", type=int, default=2)
    ap.add_argument("--dir", default=None, help="where to write the benchmark checkpoint (kept)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per phase (default: torch's)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="alternate the read and analysis phases this many times; report the medians "
                         "(default 3: a single read of 0.2 s swings by 2-3x)")
    ap.add_argument("--phase", choices=["read", "analysis", "naive"], help=argparse.SUPPRESS)
    ap.add_argument("--skip-naive", action="store_true", help="measure read and analysis only")
    args = ap.parse_args()
    if args.phase:
        child(args)
        return
    tmp = None
    if args.dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="qkvscope-bench-")
        args.dir = tmp.name
    build(Path(args.dir))
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
    wq = an["stacked_wq_seconds"]
    print(f"\ndevice {args.device}, torch threads {an['threads']}, 1-min load average {load0:.2f} -> {load1:.2f}"
          + (f", median of {args.repeat} runs" if args.repeat > 1 else ""))
    print(f"read {r:.3f} s, analysis {a:.3f} s ({an['rows']} values, {N_LAYERS} layers)")
    print(f"analysis / read           = {a / r:.1f}x   (target <= 5x on CPU)")
    print(f"  of which stacked-W_Q condition/defect {wq:.3f} s (one LU and two Lanczos runs per layer), "
          f"other metrics {an['other_metrics_seconds']:.3f} s, "
          f"opening/reading/reshaping the checkpoint {an['reading_seconds']:.3f} s")
    ch = an["chance_seconds"]
    print(f"  chance levels (random layers of the same shapes, once per shape) {ch:.3f} s = "
          f"{ch / max(a - ch, 1e-9):.2f}x the weight analysis without them (target <= 1x: at most double)")
    print(f"  without the stacked-W_Q metrics: {a - wq:.3f} s = {(a - wq) / r:.1f}x read")
    print(f"  the bare float32 LU of each layer's stacked W_Q (the O(d_model^3) floor of any exact "
          f"wq_condition / wq_basis_orth_defect): {an['lu_only_seconds']:.3f} s = {an['lu_only_seconds'] / r:.1f}x read")
    if "naive" in res:
        n = res["naive"]["scaled_seconds"]
        print(f"naive (scaled) / analysis = {n / a:.0f}x   (naive {res['naive']['seconds']:.1f} s on "
              f"{args.naive_layers} layers -> {n:.0f} s for {N_LAYERS}; target >= 100x)")
    print("peak RSS MiB: " + ", ".join(f"{k} {v['peak_rss_mib']:.0f}" for k, v in res.items())
          + ("" if args.device != "cuda" else
             "; peak CUDA MiB: " + ", ".join(f"{k} {v['peak_cuda_mib']:.0f}" for k, v in res.items())))
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
