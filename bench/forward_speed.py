"""Benchmark: the activation job's tokens/s against the same model's plain forward, side by side.

Two sets of models, each measured in this one run:

* the bundled demo's language checkpoints (``data/demo``, ``app.paths.DEMO_DIR``: each
  run's final checkpoint, 23 GPTs of d_model 64, 4 layers, context 128, bytes; the ViT
  runs are left out), all in one child process after one untimed warm-up: per checkpoint
  the activation job, then the plain forward; the medians over checkpoints;
* a Hugging Face ``LlamaForCausalLM`` of about 100M parameters (hidden 768, 12 layers,
  12 heads, intermediate 2048, vocab 32,000; random weights, seed 0; the count is printed)
  saved with ``save_pretrained(safe_serialization=True)`` into a temporary folder and opened
  as qkvscope opens any Hugging Face folder (``loaders.checkpoints.open_checkpoint``, then
  ``experiments.runnable.load_runnable``: ``AutoModel``, so no LM head, eager attention,
  float32, never ``trust_remote_code``); each measurement in a fresh process after an
  untimed one-window warm-up of the same code, ``--repeat`` job/plain pairs alternating,
  with its peak RSS above the imports (``VmHWM`` against ``/proc/self/statm`` after
  the imports).

What is timed, on the model ``load_runnable`` gives and the same ``[B, T]`` windows:

* the plain forward: ``model(input_ids)`` under ``torch.inference_mode()``, no hooks,
  over the windows the job builds (``job_windows``: the job's tokeniser, context,
  ``analysis.captures.sample_windows`` and budget), in the job's batches of
  ``experiments.runnable.BATCH_TOKENS`` tokens; and the same windows as far as the job
  runs the model (``feed`` with accumulators that keep nothing: each batch stops at the
  last attention module's input, so the last layer's attention and MLP, the final norm
  and the output head are not run);
* the activation job, ``experiments.activation_runs.corpus_activations`` (what
  ``analyze --activations`` calls) over the default token budget (``wanted``:
  ``max(DEFAULT_TOKENS = 4096, 8 x d_head)``; ``--tokens`` overrides it), three figures:
  its forward pass (``feed``'s batches: the model to the last attention input with the
  pre-hooks and every layer's ``ActivationAccumulator.add``, i.e. the input's float64
  Gram and, for windows shorter than d_model, the projections and their float64
  statistics; from the first batch to the first ``result()``); the job without its model load (tokenising, the forward pass,
  ``result()``: for windows at least d_model long the statistics from the windows' Grams,
  then metrics, chance levels, bootstrap intervals, layer by layer); and end to end, the load
  included. The load, ``add`` and ``result()`` seconds are timed inside (the functions wrapped in
  this process).

Target ("the forward pass over the default token budget ... target >= 0.7 of it:
the hooks and captures must cost little"): tokens/s >= ``FORWARD_RATIO`` (0.7,
``bench/run_all.py``) of the plain forward's, for the job's forward pass. Beside it, with no
target, the job's forward pass against the forward it stops (to the last attention input, no
``add()``): what the statistics cost, without the saving of the skipped end. The job without its
load and the job end to end are printed beside it with no target: their ``result()`` is the
statistics of the issue "Numbers a researcher can trust" (chance draws, a 200-resample
bootstrap with its eigen-solves), not hooks or captures. Each figure is printed as a
``BENCH_ROW {json}`` line that ``bench/run_all.py`` collects. On a machine other processes
keep busy, run with ``--threads 1`` (OpenMP's spin-waiting makes the job's many small
operations erratic; see bench/analysis_speed.py).

    .venv/bin/python bench/forward_speed.py [--quick] [--device cpu|cuda] [--threads N] [--tokens N]
                                            [--limit N] [--repeat 2] [--demo DIR] [--skip-demo] [--skip-llama]
                                            [--no-warm-up] [--one-process]
                                            [--hidden 768 --layers 12 --heads 12 --intermediate 2048 --vocab 32000]

``--quick``: 3 demo checkpoints, 1,024 tokens, a Llama of hidden 256, 4 layers, 4 heads,
intermediate 688 (19.5M parameters), one pair, no warm-up, every measurement in this process
(``--no-warm-up``, ``--one-process``; a smoke run). ``--one-process``: no child process per
measurement (each costs 2-4 CPU seconds of imports); the job and the plain forward then run one
after the other, and a peak RSS is this process's so far.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import _child  # noqa: E402  (bench/ is on sys.path: this script's folder)
from run_all import FORWARD_RATIO  # noqa: E402

BENCH = "forward_speed"
#: The ~100M-parameter Llama, and the small one of ``--quick``.
LLAMA_FULL = {"hidden": 768, "layers": 12, "heads": 12, "intermediate": 2048, "vocab": 32000}
LLAMA_QUICK = {"hidden": 256, "layers": 4, "heads": 4, "intermediate": 688, "vocab": 32000}
QUICK_DEMO, QUICK_TOKENS = 3, 1024
#: Tokens of the untimed warm-up run before each measurement (one window of ``MAX_WINDOW``), never
#: more than the measurement's own ``--tokens`` (``warm_tokens``).
WARM_TOKENS = 512


# -- pure helpers ------------------------------------------------------------------------

def llama_parameters(hidden: int, layers: int, intermediate: int, vocab: int, *, tied: bool = False) -> int:
    """Parameters of a Llama with MHA and no biases: embeddings ``vocab * hidden``, per layer
    ``4 hidden^2`` (q, k, v, o) ``+ 3 hidden * intermediate`` (gate, up, down) ``+ 2 hidden``
    (two RMSNorms), the final norm ``hidden``, the LM head ``vocab * hidden`` unless tied."""
    per_layer = 4 * hidden * hidden + 3 * hidden * intermediate + 2 * hidden
    return vocab * hidden * (1 if tied else 2) + layers * per_layer + hidden


def warm_tokens(tokens: int | None) -> int:
    """The warm-up's tokens before a measurement of ``tokens`` (None: the job's default budget)."""
    return WARM_TOKENS if tokens is None else min(WARM_TOKENS, tokens)


def rate(tokens: int, seconds: float) -> float:
    """Tokens per second (NaN for no time)."""
    return tokens / seconds if seconds > 0 else float("nan")


def spread(items: list, n: int | None) -> list:
    """``n`` of ``items`` spread evenly (first and last included); all without ``n`` or when fewer."""
    if n is None or n >= len(items):
        return list(items)
    if n <= 1:
        return list(items[:1])
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)]


def demo_checkpoints(demo: Path) -> list[Path]:
    """Each language run's final checkpoint under ``demo`` (``RUN/checkpoints/final_*.safetensors``;
    runs named ``vit-*`` are vision models), sorted by run."""
    found = []
    for run in sorted(p for p in demo.iterdir() if p.is_dir() and not p.name.startswith("vit-")):
        final = sorted((run / "checkpoints").glob("final_*.safetensors"))
        if final:
            found.append(final[-1])
    return found


def job_rate(m: dict) -> float:
    """The activation job's tokens/s without its model load (module docstring)."""
    return rate(m["tokens"], m["seconds"] - m["load_s"])


#: The activation job's figures, each against the plain forward: (key, what it times, target or not).
FIGURES = [("forward", "the activation job's forward pass (hooks and every layer's add())", True),
           ("job", "the activation job without its model load (add(), result(), tokenising)", False),
           ("with_load", "the activation job end to end (its model load included)", False)]


def summarise(pairs: list[tuple[dict, dict]]) -> dict:
    """Medians over (job, plain) measurement pairs: the plain forward's tokens/s, and for each of
    ``FIGURES`` the job's tokens/s and its per-pair ratio to the plain forward's; the job's split."""
    plains = [rate(p["tokens"], p["seconds"]) for _, p in pairs]
    stopped = [rate(p["tokens"], p["stopped_s"]) for _, p in pairs]
    rates = {"forward": [rate(j["tokens"], j["forward_s"]) for j, _ in pairs],
             "job": [job_rate(j) for j, _ in pairs],
             "with_load": [rate(j["tokens"], j["seconds"]) for j, _ in pairs]}
    return {"n": len(pairs), "plain": statistics.median(plains), "stopped": statistics.median(stopped),
            **{k: statistics.median(v) for k, v in rates.items()},
            "ratio": {k: statistics.median(r / p for r, p in zip(v, plains)) for k, v in rates.items()},
            "capture": statistics.median(r / p for r, p in zip(rates["forward"], stopped)),
            "split": {k: statistics.median(j[k] for j, _ in pairs)
                      for k in ("seconds", "load_s", "forward_s", "add_s", "result_s")}}


def bench_row(measured: str, figure: str, against: str, target: str, ok: bool | None) -> dict:
    """One row of the bench table, printed as ``BENCH_ROW {json}`` for ``bench/run_all.py``."""
    row = {"bench": BENCH, "measured": measured, "figure": figure, "against": against,
           "target": target, "result": "-" if ok is None else ("pass" if ok else "FAIL")}
    print("BENCH_ROW " + json.dumps(row), flush=True)
    return row


def floor2(x: float) -> float:
    """``x`` rounded down to two decimals: a ratio printed beside its pass/FAIL never reads as
    the target when it falls short of it (0.695 prints 0.69, not 0.70)."""
    # x * 100 is rounded to 9 places first: 0.29 * 100 is 28.999999999999996 in binary floating point
    return math.floor(round(x * 100, 9)) / 100 if math.isfinite(x) else x


def ratio_rows(what: str, s: dict) -> list[dict]:
    """The rows of a summary: each of ``FIGURES``' tokens/s over the plain forward's; then the
    job's forward pass over the plain forward as far as the job runs it (what ``add()`` costs,
    the skipped end of the forward aside; no target)."""
    rows = [bench_row(f"tokens/s of {label}, {what}", f"{floor2(s['ratio'][k]):.2f}x ({s[k]:,.0f} tok/s)",
                      f"the same model's plain forward, same windows ({s['plain']:,.0f} tok/s)",
                      f">= {FORWARD_RATIO:g}x" if target else "-",
                      s["ratio"][k] >= FORWARD_RATIO if target else None)
            for k, label, target in FIGURES]
    rows.append(bench_row(f"tokens/s of {FIGURES[0][1]} against the forward it stops, {what}",
                          f"{floor2(s['capture']):.2f}x ({s['forward']:,.0f} tok/s)",
                          f"the same model's forward to its last attention input, no add() ({s['stopped']:,.0f} tok/s)",
                          "-", None))
    return rows


# -- measurements (in a child process) -----------------------------------------------------

def rss_mib() -> float:
    """Resident memory now (MiB), from /proc/self/statm."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def peak_rss_mib() -> float:
    """Peak resident memory of this process image so far (MiB): ``VmHWM`` of /proc/self/status
    (``ru_maxrss`` survives ``execve``: a fresh process would report its parent's peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _sync(device: str) -> None:
    import torch
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def job_windows(ckpt, model, tok, vocab: int, tokens: int | None):
    """The ``[B, T]`` windows ``corpus_activations`` feeds ``model`` (the steps of
    ``experiments.activation_runs.text_activations``: its tokeniser, context and budget)."""
    from analysis.captures import MAX_WINDOW, sample_windows
    from experiments.activation_runs import SampleSpec, token_stream, wanted
    from experiments.runnable import model_context

    sample = SampleSpec(tokens=tokens)
    want = wanted(sample, ckpt.meta)
    text = sample.read().text
    context = model_context(model)
    n_draw = want + min(context, MAX_WINDOW)
    ids, _ = token_stream(text[: want * 16], tok, vocab, n_draw)
    if ids.numel() < want and len(text) > want * 16:
        ids, _ = token_stream(text, tok, vocab, n_draw)
    return sample_windows(ids, context=context, n_tokens=want)          # [B, T]


class NoStatistics:
    """An accumulator that keeps nothing: ``feed`` with one per layer is the model's forward as
    far as the activation job runs it (its pre-hooks, each batch stopped at the last attention
    module's input), without ``add()``'s work."""

    def add(self, x) -> None:
        pass

    def result(self):
        import pandas as pd

        from analysis.registry import RESULT_COLUMNS
        return pd.DataFrame(columns=RESULT_COLUMNS), {}


def measure_plain(path: Path, device: str, tokens: int | None) -> dict:
    """The plain forward of ``path``'s model over the job's windows: seconds, tokens, load seconds;
    and ``stopped_s``, the same windows through ``experiments.runnable.feed`` with accumulators
    that keep nothing (``NoStatistics``): the forward as far as the job runs it."""
    import torch

    from experiments.runnable import BATCH_TOKENS, attention_modules, feed, load_runnable
    from loaders.checkpoints import open_checkpoint

    with open_checkpoint(path) as ckpt:
        t0 = time.perf_counter()
        model, tok, vocab = load_runnable(ckpt)
        model = model.to(device)
        load = time.perf_counter() - t0
        windows = job_windows(ckpt, model, tok, vocab, tokens)          # [B, T]
    per = max(1, BATCH_TOKENS // windows.shape[1])
    with torch.inference_mode():
        _sync(device)
        t0 = time.perf_counter()
        for lo in range(0, windows.shape[0], per):
            model(windows[lo:lo + per].to(device))
        _sync(device)
        secs = time.perf_counter() - t0
    mods = attention_modules(model)
    _sync(device)
    t0 = time.perf_counter()
    feed(model, mods, [NoStatistics() for _ in mods], windows, int(windows.shape[1]), device, None, "windows")
    _sync(device)
    stopped = time.perf_counter() - t0
    return {"phase": "plain", "seconds": secs, "stopped_s": stopped, "tokens": int(windows.numel()),
            "load_s": load, "windows": list(windows.shape)}


def measure_job(path: Path, device: str, tokens: int | None) -> dict:
    """``corpus_activations`` of ``path``: seconds, tokens fed, and inside it the seconds of
    ``load_runnable``, of every ``ActivationAccumulator.add``, of the layers' ``result()`` calls
    (one after another in ``experiments.runnable.feed``), and of its forward
    pass (``forward_s``: from ``feed``'s first batch, its first ``progress`` call, to the
    results: the model's forward with the hooks and every layer's ``add``)."""
    from analysis.activations import ActivationAccumulator
    from experiments import activation_runs
    from loaders.checkpoints import open_checkpoint

    spent = {"load_s": 0.0, "add_s": 0.0, "result_s": 0.0}
    marks: dict[str, float] = {}

    def timed(key, fn):
        def wrapper(*args, **kw):
            if key == "result_s" and "forward_end" not in marks:
                _sync(device)                                  # the queued add() work belongs to the forward
                marks["forward_end"] = time.perf_counter()
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                spent[key] += time.perf_counter() - t          # on CUDA add() is the time to queue it
        return wrapper

    def progress(done, total, what):
        marks.setdefault("forward_start", time.perf_counter())

    saved = activation_runs.load_runnable, ActivationAccumulator.add, ActivationAccumulator.result
    activation_runs.load_runnable = timed("load_s", saved[0])
    ActivationAccumulator.add = timed("add_s", saved[1])
    ActivationAccumulator.result = timed("result_s", saved[2])
    try:
        with open_checkpoint(path) as ckpt:
            _sync(device)
            t0 = time.perf_counter()
            run = activation_runs.corpus_activations(
                ckpt, device=device, sample=activation_runs.SampleSpec(tokens=tokens), progress=progress)
            _sync(device)
            secs = time.perf_counter() - t0
    finally:
        activation_runs.load_runnable, ActivationAccumulator.add, ActivationAccumulator.result = saved
    return {"phase": "job", "seconds": secs, "tokens": int(run.sample["n_tokens"]), **spent,
            "forward_s": marks["forward_end"] - marks["forward_start"],
            "windows": [run.sample["windows"], run.sample["window"]], "rows": len(run.frame)}


def measure(args, phase: str, paths: list[Path], emit=lambda line: None) -> tuple[list[dict], dict]:
    """One measurement process's work (``phase``: pairs, job or plain) on ``paths``: its
    measurements (each also handed to ``emit`` as it is made), and its memory line."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    import experiments.activation_runs  # noqa: F401  (the imports, before the baseline)
    import loaders.checkpoints  # noqa: F401
    if any(Path(p).is_dir() for p in paths):                         # a Hugging Face folder
        import transformers  # noqa: F401
    base = rss_mib()
    paths = [Path(p) for p in paths]
    lines = []
    if phase == "pairs":
        if not args.no_warm_up:
            measure_job(paths[0], args.device, warm_tokens(args.tokens))   # warm-up: one of each, untimed
            measure_plain(paths[0], args.device, warm_tokens(args.tokens))
        for p in paths:
            lines.append({"path": str(p), "job": measure_job(p, args.device, args.tokens),
                          "plain": measure_plain(p, args.device, args.tokens)})
            emit(lines[-1])
    else:
        fn = measure_job if phase == "job" else measure_plain
        if not args.no_warm_up:
            fn(paths[0], args.device, warm_tokens(args.tokens))       # warm-up: the same code, one window
        gc.collect()
        lines.append(fn(paths[0], args.device, args.tokens))
        emit(lines[-1])
    mem = {"base_rss_mib": base, "peak_rss_mib": peak_rss_mib(), "threads": torch.get_num_threads()}
    if str(args.device).startswith("cuda"):
        mem["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2 ** 20
    return lines, mem


def child(args) -> None:
    """One measurement process: prints one JSON line per measurement, then its peak RSS."""
    _, mem = measure(args, args.child, args.paths, emit=lambda line: print(json.dumps(line), flush=True))
    print(json.dumps(mem), flush=True)


def run_child(args, phase: str, paths: list[Path]) -> tuple[list[dict], dict]:
    """Run ``--child phase`` on ``paths`` in a fresh process: its measurements and its memory line
    (``--one-process``: in this process, its imports shared, its peak RSS this process's so far)."""
    if args.one_process:
        return measure(args, phase, paths)
    cmd = [sys.executable, __file__, "--child", phase, "--device", args.device, "--threads", str(args.threads),
           *(["--tokens", str(args.tokens)] if args.tokens is not None else []),
           *(["--no-warm-up"] if args.no_warm_up else []), *map(str, paths)]
    lines = [json.loads(x) for x in _child.run(cmd, cwd=ROOT).strip().splitlines()]
    return lines[:-1], lines[-1]


# -- the two benchmarks ----------------------------------------------------------------------

def split_text(s: dict) -> str:
    """The job's median split into its parts (seconds)."""
    sp = s["split"]
    rest = sp["seconds"] - sp["load_s"] - sp["forward_s"] - sp["result_s"]
    return (f"job {sp['seconds']:.3f} s = load {sp['load_s']:.3f} + forward pass {sp['forward_s']:.3f} "
            f"(of which add() {sp['add_s']:.3f}) + result() {sp['result_s']:.3f} + tokenising, rest {rest:.3f}")


def ratios_text(s: dict) -> str:
    r = s["ratio"]
    return (f"plain {s['plain']:,.0f} tok/s (to the last attention input {s['stopped']:,.0f} tok/s); "
            f"job forward pass {s['forward']:,.0f} tok/s = {r['forward']:.2f}x ({s['capture']:.2f}x of the stopped one), "
            f"job without the load {s['job']:,.0f} tok/s = {r['job']:.2f}x, with it {s['with_load']:,.0f} tok/s "
            f"= {r['with_load']:.2f}x")


def bench_demo(args) -> None:
    paths = spread(demo_checkpoints(args.demo), args.limit)
    if not paths:
        raise SystemExit(f"error: {args.demo}: no language checkpoints (RUN/checkpoints/final_*.safetensors)")
    lines, mem = run_child(args, "pairs", paths)
    pairs = [(x["job"], x["plain"]) for x in lines]
    for x in lines:
        j, p = x["job"], x["plain"]
        plain = rate(p["tokens"], p["seconds"])
        print(f"  {Path(x['path']).parent.parent.name:24s} {j['tokens']:,} tokens ({j['windows'][0]} x "
              f"{j['windows'][1]}): plain {plain:9,.0f} tok/s; job forward pass {rate(j['tokens'], j['forward_s']):9,.0f}"
              f" tok/s ({rate(j['tokens'], j['forward_s']) / plain:.2f}x), without the load {job_rate(j):9,.0f} "
              f"tok/s ({job_rate(j) / plain:.2f}x); add() {j['add_s']:.3f} s, result() {j['result_s']:.3f} s")
    s = summarise(pairs)
    above = mem["peak_rss_mib"] - mem["base_rss_mib"]
    n_tok = pairs[0][0]["tokens"]
    print(f"demo: {s['n']} checkpoints, medians: {ratios_text(s)}; {split_text(s)}; peak RSS "
          f"{mem['peak_rss_mib']:.0f} MiB, {above:.0f} MiB above the imports' {mem['base_rss_mib']:.0f} MiB "
          f"({mem['threads']} threads)")
    ratio_rows(f"median of {s['n']} demo checkpoints, {n_tok:,} tokens each", s)
    bench_row(f"peak RSS above the imports, activation job and plain forward of {s['n']} demo checkpoints "
              "(one process)", f"{above:.0f} MiB", f"the imports ({mem['base_rss_mib']:.0f} MiB)", "-", None)


def build_llama(folder: Path, hidden: int, layers: int, heads: int, intermediate: int, vocab: int) -> int:
    """A random ``LlamaForCausalLM`` (seed 0) saved as safetensors into ``folder``; its parameter count."""
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()             # no "Writing model shards" bar
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                      num_key_value_heads=heads, intermediate_size=intermediate,
                                      vocab_size=vocab, max_position_embeddings=2048, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(str(folder), safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def bench_llama(args) -> None:
    shape = {k: getattr(args, k) for k in LLAMA_FULL}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "llama"
        n = build_llama(folder, **shape)
        expect = llama_parameters(shape["hidden"], shape["layers"], shape["intermediate"], shape["vocab"])
        body = n - 2 * shape["vocab"] * shape["hidden"]
        mib = sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 2 ** 20
        label = (f"LlamaForCausalLM {n / 1e6:.1f}M parameters (hidden {shape['hidden']}, {shape['layers']} layers, "
                 f"{shape['heads']} heads, intermediate {shape['intermediate']}, vocab {shape['vocab']:,})")
        print(f"{label}: {n:,} parameters (formula {expect:,}; {body:,} outside the embeddings and LM head); "
              f"{mib:.0f} MiB of safetensors; AutoModel runs it without the LM head")
        pairs, mems = [], {"job": [], "plain": []}
        for _ in range(args.repeat):
            if args.one_process:                                           # the job, then the plain forward
                [x], m = run_child(args, "pairs", [folder])
                j, p, mj, mp = x["job"], x["plain"], m, m
            else:                                                          # alternating, fresh processes
                (j,), mj = run_child(args, "job", [folder])
                (p,), mp = run_child(args, "plain", [folder])
            pairs.append((j, p))
            mems["job"].append(mj)
            mems["plain"].append(mp)
    s = summarise(pairs)
    above = {k: max(m["peak_rss_mib"] - m["base_rss_mib"] for m in v) for k, v in mems.items()}
    base = mems["job"][0]["base_rss_mib"]
    tok = pairs[0][0]["tokens"]
    print(f"llama: {tok:,} tokens ({pairs[0][0]['windows'][0]} x {pairs[0][0]['windows'][1]}), medians of "
          f"{s['n']}: {ratios_text(s)}; {split_text(s)}; plain forward "
          f"{statistics.median(p['seconds'] for _, p in pairs):.3f} s (load {statistics.median(p['load_s'] for _, p in pairs):.3f} s); "
          f"peak RSS above the imports' {base:.0f} MiB: job {above['job']:.0f} MiB, plain {above['plain']:.0f} MiB "
          f"({mems['job'][0]['threads']} threads)")
    what = f"{label}, {tok:,} tokens"
    ratio_rows(what, s)
    bench_row(f"peak RSS above the imports, activation job, {what}",
              f"{above['job']:.0f} MiB ({above['job'] / mib:.2f} of the file)",
              f"plain forward, {'same' if args.one_process else 'fresh'} process "
              f"({above['plain']:.0f} MiB)", "-", None)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    from app.paths import DEMO_DIR

    ap.add_argument("--quick", action="store_true",
                    help=f"small sizes: {QUICK_DEMO} demo checkpoints, {QUICK_TOKENS} tokens, a ~19M Llama, one pair")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own)")
    ap.add_argument("--tokens", type=int, default=None,
                    help="tokens per model (default: the activation job's own budget, 4,096 here)")
    ap.add_argument("--limit", type=int, default=None, help="demo checkpoints, spread over the demo (default all)")
    ap.add_argument("--repeat", type=int, default=2, help="job/plain pairs of the Llama (default 2)")
    ap.add_argument("--demo", type=Path, default=DEMO_DIR, help=f"the demo folder (default {DEMO_DIR})")
    ap.add_argument("--skip-demo", action="store_true")
    ap.add_argument("--skip-llama", action="store_true")
    for k, v in LLAMA_FULL.items():
        ap.add_argument(f"--{k}", type=int, default=None, help=f"Llama {k} (default {v}; --quick {LLAMA_QUICK[k]})")
    ap.add_argument("--no-warm-up", action="store_true",
                    help="measure without the untimed warm-up before each measurement (--quick: a smoke run)")
    ap.add_argument("--one-process", action="store_true",
                    help="every measurement in this process, no child process; the Llama's job, then its plain "
                         "forward (--quick; a smoke run: the imports are shared, the peak RSS is this process's "
                         "so far, the Llama's build included)")
    ap.add_argument("--child", choices=["pairs", "job", "plain"], help=argparse.SUPPRESS)
    ap.add_argument("paths", nargs="*", help=argparse.SUPPRESS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    args = ap.parse_args(argv)
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.child:
        child(args)
        return 0
    _child.outlive_abort()
    if args.quick:
        args.limit = QUICK_DEMO if args.limit is None else args.limit
        args.tokens = QUICK_TOKENS if args.tokens is None else args.tokens
        args.repeat = 1
        args.no_warm_up = args.one_process = True
    for k in LLAMA_FULL:
        if getattr(args, k) is None:
            setattr(args, k, (LLAMA_QUICK if args.quick else LLAMA_FULL)[k])
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, device {args.device}, "
          f"load average {os.getloadavg()[0]:.2f}, tokens {args.tokens or 'the job default'}", flush=True)
    if not args.skip_demo:
        bench_demo(args)
    if not args.skip_llama:
        bench_llama(args)
    print(f"load average after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
