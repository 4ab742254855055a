"""Forward-pass speed of the checkpoints experiments.foreign runs: a llama2.c v0 export of
stories15M's geometry (dim 288, 6 layers, 6 heads, vocab 32,000, seq_len 256; random
weights, written in llama2.c's byte order) with a tokenizer.bin, and a nanoGPT with
RMSNorm and a SwiGLU MLP of the same width.

    .venv/bin/python bench/foreign_forward.py [--device cpu|cuda] [--tokens 4096] [--repeat 3] [--quick]

Prints, side by side, what ``bench/forward_speed.py`` measures (its ``measure_plain`` and
``measure_job``, the same code): seconds to open and build the model, the model's plain
forward over the activation job's own windows (tokens/s), the same forward as far as the job
runs it (to the last attention input, no ``add()``), the job's forward pass (the model to the
last attention input with its hooks and every layer's ``ActivationAccumulator.add``), and
``experiments.activation_runs.corpus_activations`` without its model load (tokenising the
bundled corpus, the forward pass, per-layer statistics, chance levels, bootstrap intervals).
Each figure is the median of ``--repeat`` (``REPEAT``, 3) alternating pairs after an untimed
warm-up of each (``forward_speed.warm_tokens``). Target (``bench/run_all.py``'s
``FORWARD_RATIO``): the job's forward pass >= 0.7x the plain forward's tokens/s; the whole
job is printed beside it with none (forward_speed.py says why). ``--quick``: a smoke run, both
models at ``QUICK`` (dim 64, 2 layers, 2 heads, vocab 512, seq_len 128), no warm-up.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import forward_speed as F  # noqa: E402  (bench/ is on sys.path: this script's folder)
from experiments import runnable  # noqa: E402
from loaders.checkpoints import open_checkpoint  # noqa: E402
from tests.loaders.llama2c_files import llama_state, toy_pieces, write_bin, write_tokenizer  # noqa: E402


#: Measurement pairs (plain forward, activation job) per model; the medians are printed.
REPEAT = 3
#: Both models' geometry: stories15M's, and ``--quick``'s.
FULL = {"dim": 288, "layers": 6, "heads": 6, "hidden": 768, "vocab": 32000, "seq": 256}
QUICK = {"dim": 64, "layers": 2, "heads": 2, "hidden": 128, "vocab": 512, "seq": 128}


def _nanogpt(path: Path, d=288, layers=6, heads=6, hidden=768, vocab=32000, seq=256) -> Path:
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g) * 0.02  # noqa: E731
    sd = {"transformer.wte.weight": r(vocab, d), "transformer.wpe.weight": r(seq, d),
          "transformer.ln_f.weight": torch.ones(d)}
    for i in range(layers):
        p = f"transformer.h.{i}."
        sd.update({p + "ln_1.weight": torch.ones(d), p + "ln_2.weight": torch.ones(d),
                   p + "attn.c_attn.weight": r(3 * d, d), p + "attn.c_proj.weight": r(d, d),
                   p + "mlp.w1.weight": r(hidden, d), p + "mlp.w3.weight": r(hidden, d),
                   p + "mlp.w2.weight": r(d, hidden)})
    torch.save({"model": sd, "model_args": {"n_layer": layers, "n_head": heads, "n_embd": d,
                                            "block_size": seq, "vocab_size": vocab}}, path)
    return path


def _time(label: str, path: Path, device: str, tokens: int, repeat: int, warm: bool = True) -> None:
    with open_checkpoint(path) as ckpt:
        how = getattr(runnable.load_runnable(ckpt)[1], "how", "bytes")
    if warm:
        F.measure_plain(path, device, F.warm_tokens(tokens))      # warm-up: the same code, one window
        F.measure_job(path, device, F.warm_tokens(tokens))
    # the median of `repeat` alternating pairs: a single pair swung 0.62-0.91x on an idle 2-core machine
    pairs = [(F.measure_plain(path, device, tokens), F.measure_job(path, device, tokens)) for _ in range(repeat)]
    job = pairs[0][1]                                             # its load time and token count
    fwd = statistics.median(F.rate(p["tokens"], p["seconds"]) for p, _ in pairs)
    stopped = statistics.median(F.rate(p["tokens"], p["stopped_s"]) for p, _ in pairs)
    hooked = statistics.median(F.rate(j["tokens"], j["forward_s"]) for _, j in pairs)
    t_job = statistics.median(j["seconds"] - j["load_s"] for _, j in pairs)
    print(f"{label:34s} {how:16s} load {job['load_s']:6.2f} s  forward {fwd:10,.0f} tok/s  "
          f"to the last attention input {stopped:10,.0f} tok/s  job's forward pass {hooked:10,.0f} tok/s  "
          f"activation job {job['tokens']:,} tokens in {t_job:6.2f} s ({F.rate(job['tokens'], t_job):8,.0f} tok/s)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=REPEAT, help=f"plain/job pairs per model (default {REPEAT})")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: both models at dim 64, 2 layers, 2 heads, vocab 512; no warm-up")
    args = ap.parse_args()
    print(f"device {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    g = QUICK if args.quick else FULL
    shape = "" if args.quick else " (stories15M shape)"
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        sd = llama_state(dim=g["dim"], hidden=g["hidden"], n_layers=g["layers"], n_heads=g["heads"], n_kv=g["heads"],
                         vocab=g["vocab"], seq_len=g["seq"])
        (d / "l2c").mkdir()
        write_bin(d / "l2c" / "model.bin", sd, version=0, n_heads=g["heads"], n_kv=g["heads"], seq_len=g["seq"])
        write_tokenizer(d / "l2c" / "tokenizer.bin", *toy_pieces(g["vocab"]))
        _time(f"llama2.c v0 .bin{shape}", d / "l2c" / "model.bin", args.device, args.tokens, args.repeat,
              not args.quick)
        (d / "nano").mkdir()
        nano = _nanogpt(d / "nano" / "ckpt.pt", g["dim"], g["layers"], g["heads"], g["hidden"], g["vocab"], g["seq"])
        _time("nanoGPT RMSNorm+SwiGLU ckpt.pt", nano, args.device, args.tokens, args.repeat, not args.quick)


if __name__ == "__main__":
    main()
