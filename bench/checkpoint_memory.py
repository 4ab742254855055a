"""Peak memory of reading a Llama-1B-shaped checkpoint, relative to its size.

Writes a Hugging Face folder (``config.json`` + ``model.safetensors``) shaped
like TinyLlama-1.1B: 22 layers, d_model 2048, 32 heads, 4 kv heads, d_head 64,
MLP 5632, vocab 32000, random bf16 weights (2.2 GB; ``--dtype float32`` doubles
it). The file is streamed tensor by tensor, so the writer stays small.

Then, each in a fresh subprocess, measures peak RSS (its ``VmHWM``, or that of a child it
started and waited for, whichever is larger: ``info`` reads the file in its reading child):

* ``baseline``: imports the modules the other runs import, nothing else; and the
  reading child of ``loaders.sandbox`` started and closed idle (its imports: the
  baseline of ``info``, which reads in that child);
* ``info``: ``python -m app info FOLDER --json`` (metadata + a NaN/Inf pass
  over every layer's attention, in the command's reading child);
* ``layers``: ``loaders.checkpoints.open_checkpoint(FOLDER).layers()``, every
  canonical tensor of every layer touched;
* ``source get(attn)``: ``loaders.sources.SafetensorsSource`` and ``get`` of
  each raw attention tensor, layer by layer, with each of its two readers:
  ``pread`` (the default: the tensor owns its memory) and ``mmap``
  (``safetensors.safe_open``: touched pages stay resident until close).

and prints ``(peak - baseline) / file size`` for each; the target is < 0.25. ``--one-process``
(a smoke run) measures every run in one process instead, its peak reset before each.

Run (about a minute and 2.2 GB of temporary disk):

    .venv/bin/python bench/checkpoint_memory.py
    .venv/bin/python bench/checkpoint_memory.py --layers 4     # quick, smaller file
    .venv/bin/python bench/checkpoint_memory.py --layers 1 --small --one-process   # a smoke run
    .venv/bin/python bench/checkpoint_memory.py --dir /big/disk --keep
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent

GEOMETRY = dict(n_layers=22, d_model=2048, n_heads=32, n_kv_heads=4, d_head=64, d_mlp=5632, vocab=32000)
#: ``--small``: a smoke run's geometry (a 2 MB file per layer, not 180 MB), every run the same.
SMALL = dict(GEOMETRY, d_model=256, n_heads=4, n_kv_heads=2, d_mlp=704, vocab=1000)
_ST_CODE = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16"}

IMPORTS = "import app.cli, loaders.checkpoints, loaders.sources, loaders.layouts, torch, safetensors"

LAYERS_PASS = """
import sys, torch
from loaders.checkpoints import open_checkpoint
total = 0
with open_checkpoint(sys.argv[1]) as ckpt, torch.inference_mode():
    for layer in ckpt.layers():
        for t in layer.tensors().values():
            total += t.numel()
            float(t.float().abs().sum())
print(total)
"""

SOURCE_PASS = """
import sys, torch
from loaders.sources import SafetensorsSource
total = 0
with SafetensorsSource(sys.argv[1], reader=sys.argv[2]) as src, torch.inference_mode():
    for key in src.keys():
        if ".self_attn." in key:
            t = src.get(key)
            total += t.numel()
            float(t.float().abs().sum())
print(total)
"""


def tensor_shapes(g: dict, n_layers: int) -> list[tuple[str, tuple[int, ...]]]:
    """HF Llama names and shapes (nn.Linear weights are [out, in])."""
    d, q, kv, m = g["d_model"], g["n_heads"] * g["d_head"], g["n_kv_heads"] * g["d_head"], g["d_mlp"]
    out = [("model.embed_tokens.weight", (g["vocab"], d))]
    for i in range(n_layers):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (d,)),
                (p + "self_attn.q_proj.weight", (q, d)),
                (p + "self_attn.k_proj.weight", (kv, d)),
                (p + "self_attn.v_proj.weight", (kv, d)),
                (p + "self_attn.o_proj.weight", (d, q)),
                (p + "post_attention_layernorm.weight", (d,)),
                (p + "mlp.gate_proj.weight", (m, d)),
                (p + "mlp.up_proj.weight", (m, d)),
                (p + "mlp.down_proj.weight", (d, m))]
    out += [("model.norm.weight", (d,)), ("lm_head.weight", (g["vocab"], d))]
    return out


def write_folder(folder: Path, g: dict, n_layers: int, dtype: torch.dtype) -> Path:
    """config.json + model.safetensors written header first, then tensor by
    tensor (safetensors layout: u64 header length, JSON header, data)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
              "hidden_size": g["d_model"], "num_attention_heads": g["n_heads"],
              "num_key_value_heads": g["n_kv_heads"], "head_dim": g["d_head"],
              "intermediate_size": g["d_mlp"], "num_hidden_layers": n_layers,
              "vocab_size": g["vocab"], "rms_norm_eps": 1e-5, "torch_dtype": str(dtype).split(".")[1]}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    itemsize = torch.empty((), dtype=dtype).element_size()
    shapes = tensor_shapes(g, n_layers)
    header, pos = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes:
        n = 1
        for s in shape:
            n *= s
        header[name] = {"dtype": _ST_CODE[dtype], "shape": list(shape), "data_offsets": [pos, pos + n * itemsize]}
        pos += n * itemsize
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)                       # align the data area to 8 bytes
    path = folder / "model.safetensors"
    gen = torch.Generator().manual_seed(0)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, shape in shapes:
            t = (torch.randn(shape, generator=gen) * 0.02).to(dtype)   # one tensor at a time
            f.write(t.view(torch.uint8).numpy().tobytes() if t.dim() else t.numpy().tobytes())
            del t
    return path


#: Prepended to every child: at exit, write this process's VmHWM (peak RSS,
#: reset by exec, so the benchmark parent's own memory does not leak in).
#: Registered first, so it runs last at exit: after ``loaders.sandbox``'s pool has closed
#: (and waited for) the reading child, whose peak ``RUSAGE_CHILDREN`` then holds. ``info``
#: reads the file in that child, so its row is the larger of the two peaks: this process's
#: alone measured only the command line's own imports.
HWM_PRELUDE = """
import atexit, os, resource
def _report_hwm():
    with open('/proc/self/status') as f:
        kib = next(int(l.split()[1]) for l in f if l.startswith('VmHWM:'))
    kib = max(kib, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    with open(os.environ['QKVSCOPE_BENCH_HWM'], 'w') as out:
        out.write(str(kib * 1024))
atexit.register(_report_hwm)
"""


def peak_rss(code: str, argv: list[str]) -> tuple[int, float]:
    """(peak RSS bytes, seconds) of ``python -c HWM_PRELUDE+code argv...`` in a fresh process."""
    with tempfile.TemporaryDirectory() as d:
        hwm = Path(d) / "hwm"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", HWM_PRELUDE + code, *argv], cwd=ROOT,
                              capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "QKVSCOPE_BENCH_HWM": str(hwm)})
        secs = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"child failed ({proc.returncode}): {code[:80]!r} {argv}\n{proc.stderr[-2000:]}")
        return int(hwm.read_text()), secs


#: ``--one-process``: the runs named in ``sys.argv[1]`` (JSON ``[[label, code, argv], ...]``) one after
#: the other in this one process, its peak RSS reset before each (writing 5 to ``/proc/self/clear_refs``
#: sets ``VmHWM`` to the RSS of the moment, Linux >= 4.0); one ``PEAK [label, bytes, seconds]`` line
#: each, its peak the larger of this process's and of its children's so far (``HWM_PRELUDE``), so the
#: runs that start a reading child come last. The last run may end the process (``app``'s ``main``
#: exits): its line is printed at exit, after the reading child's pool has closed (registered first).
ONE_PROCESS = """
import atexit, json, resource, sys, time
def _peak():
    with open('/proc/self/status') as f:
        kib = next(int(l.split()[1]) for l in f if l.startswith('VmHWM:'))
    return max(kib, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) * 1024
running = []
def _report():
    label, t0 = running.pop()
    print('PEAK ' + json.dumps([label, _peak(), time.perf_counter() - t0]), flush=True)
atexit.register(lambda: running and _report())
for label, code, argv in json.loads(sys.argv[1]):
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')
    sys.argv = ['-c', *argv]
    running.append((label, time.perf_counter()))
    exec(compile(code, label, 'exec'), {'__name__': '__main__'})
    _report()
"""


def peak_rss_one_process(runs: list[tuple[str, str, list[str]]]) -> dict[str, tuple[int, float]]:
    """``{label: (peak RSS bytes, seconds)}`` of ``runs`` (label, code, argv), in this order in one
    fresh process (``ONE_PROCESS``): the imports are paid once, each peak counts from the RSS its
    run started at."""
    proc = subprocess.run([sys.executable, "-c", ONE_PROCESS, json.dumps(runs)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    peaks = {label: (rss, secs) for label, rss, secs in
             (json.loads(line[5:]) for line in proc.stdout.splitlines() if line.startswith("PEAK "))}
    if proc.returncode != 0 or len(peaks) != len(runs):
        raise SystemExit(f"child failed ({proc.returncode}): {[r[0] for r in runs]}\n{proc.stderr[-2000:]}")
    return peaks


#: The reading child started by one request that reads nothing, then closed: its peak is its own imports, the
#: baseline of ``info``'s row.
CHILD_IDLE = """
import sys
from pathlib import Path

from loaders.sandbox import Sandbox as Reader
with Reader() as r:
    r.kind_of(Path(sys.executable).parent / "no-such-file")   # starts the child, classifies nothing
"""

#: ``python -m app info FOLDER --json``, run as the module so the prelude applies.
INFO = """
import runpy, sys
sys.argv = ["app", "info", sys.argv[1], "--json"]
runpy.run_module("app", run_name="__main__", alter_sys=True)
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=GEOMETRY["n_layers"], help="layers to write (default 22)")
    ap.add_argument("--dtype", choices=("bfloat16", "float32", "float16"), default="bfloat16")
    ap.add_argument("--dir", type=Path, default=None, help="where to write the temporary folder")
    ap.add_argument("--keep", action="store_true", help="keep the written folder")
    ap.add_argument("--small", action="store_true",
                    help="d_model 256, 4 heads, 2 kv heads, MLP 704, vocab 1000 (a smoke run; the ratios then "
                         "say little: the imports dwarf the file)")
    ap.add_argument("--one-process", action="store_true",
                    help="every run in one process, its peak RSS reset before each (a smoke run: one import "
                         "of torch instead of six; each peak then counts from the memory the runs before it "
                         "left, and info's includes the idle reading child's)")
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    tmp = Path(tempfile.mkdtemp(prefix="qkvscope-bench-", dir=args.dir))
    try:
        folder = tmp / "llama-1b-shaped"
        t0 = time.perf_counter()
        path = write_folder(folder, SMALL if args.small else GEOMETRY, args.layers, dtype)
        size = path.stat().st_size
        print(f"wrote {path} ({size / 1e9:.2f} GB, {args.layers} layers, {args.dtype}) "
              f"in {time.perf_counter() - t0:.0f} s")
        # (label, code, argv, the baseline it is measured above): info reads in its reading child,
        # whose own imports (the readers, duckdb) are its baseline
        base, idle = "baseline (imports only)", "baseline, reading child idle"
        runs = [
            (base, IMPORTS, [], None),
            (idle, IMPORTS + "\n" + CHILD_IDLE, [], None),
            ("python -m app info --json (its reading child)", IMPORTS + "\n" + INFO, [str(folder)], idle),
            ("open_checkpoint().layers()", IMPORTS + "\n" + LAYERS_PASS, [str(folder)], base),
            ("source get(attn), pread", IMPORTS + "\n" + SOURCE_PASS, [str(path), "pread"], base),
            ("source get(attn), mmap", IMPORTS + "\n" + SOURCE_PASS, [str(path), "mmap"], base),
        ]
        # --one-process: all in one process, those that start a reading child last (its peak is read
        # from RUSAGE_CHILDREN, which keeps the largest child's so far), info last of all (it exits)
        order = sorted(runs, key=lambda r: (idle in (r[0], r[3]), r[3] == idle))
        measured = peak_rss_one_process([(label, code, argv) for label, code, argv, _ in order]) \
            if args.one_process else {}
        peaks, ratios = {}, []
        print(f"\n{'run':<46} {'peak RSS MiB':>13} {'minus base MiB':>15} {'/ file size':>12} {'s':>6}")
        for label, code, argv, base_of in runs:
            rss, secs = measured[label] if label in measured else peak_rss(code, argv)
            peaks[label] = rss
            extra = rss - peaks[base_of] if base_of else 0
            if base_of:
                ratios.append(extra / size)
            ratio = f"{ratios[-1]:.3f}" if base_of else ""
            print(f"{label:<46} {rss / 2**20:>13.0f} {extra / 2**20:>15.0f} {ratio:>12} {secs:>6.1f}")
        worst = max(ratios)
        print(f"\nfile {size / 2**20:.0f} MiB; worst (peak - baseline) / file size = {worst:.3f} "
              f"(target < 0.25: {'met' if worst < 0.25 else 'NOT met'})")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
