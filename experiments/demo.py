"""The bundled demo (``data/demo/``): what it trains and how its README is written.

Runs (one model size, byte-level Python-stdlib corpus):

* MHA: the five variants x weight decay {0.0, 0.03, 0.1}  (15 runs)
* weight decay 0.1: ``qkv`` with GQA-2 and MQA; ``k_eq_v`` with GQA-2 and MQA
  (the projection-sharing paper's Q-GQA / Q-MQA: one cached tensor of
  n_kv_heads * d_head per layer); ``wq_identity`` with GQA-2 and MQA
  (query-free attention combined with head sharing)  (6 runs)
* ``qkv-mha-wd0.1`` again with seeds 1 and 2 (the seed-to-seed spread)  (2 runs)

Checkpoints at several steps are kept for ``qkv-mha-wd0.1`` and
``k_eq_v-mha-wd0.1``; every run keeps its final checkpoint.
"""
from __future__ import annotations

import json
import platform
from dataclasses import replace
from pathlib import Path

import torch

from experiments.model import GPTConfig
from experiments.sweep import RunSpec, grid, sharing_label

VARIANT_ORDER = ("qkv", "wq_identity", "q_eq_k", "k_eq_v", "q_eq_k_eq_v")
WEIGHT_DECAYS = (0.0, 0.03, 0.1)
SHARING_WD = 0.1
DEMO_MODEL = GPTConfig(vocab_size=256, block_size=128, n_layer=4, n_head=4, d_model=64,
                       norm="layernorm", positions="learned", mlp_ratio=4.0)
CORPUS_MAX_BYTES = 12_000_000
STEPS = 4000
SAVE_STEPS = [500, 1000, 2000, 3000]
#: extra seeds of one configuration, to measure the seed-to-seed spread
SEED_REPLICATES = ("qkv-mha-wd0.1", (1, 2))
MULTI_CHECKPOINT_RUNS = ("qkv-mha-wd0.1", "k_eq_v-mha-wd0.1")


def demo_training(steps: int = STEPS):
    from experiments.train import TrainConfig
    return TrainConfig(steps=steps, batch_size=16, lr=2e-3, warmup_steps=100, eval_interval=250,
                       eval_batches=32, log_interval=20, seed=1337, corpus=None,
                       corpus_max_bytes=CORPUS_MAX_BYTES, threads=1)


def demo_specs(steps: int = STEPS, model: GPTConfig = DEMO_MODEL) -> list[RunSpec]:
    """The demo's runs, MHA grid first, then the head-sharing runs."""
    tc = demo_training(steps)
    specs = grid(VARIANT_ORDER, WEIGHT_DECAYS, model=model, training=tc)
    specs += grid(("qkv", "k_eq_v", "wq_identity"), (SHARING_WD,), n_kv_heads=(2, 1),
                  model=model, training=tc)
    name, seeds = SEED_REPLICATES
    base = next(s for s in specs if s.name == name)
    specs += [RunSpec(f"{name}-seed{seed}", base.model, replace(base.train, seed=seed)) for seed in seeds]
    save = [s for s in SAVE_STEPS if s < steps]
    return [replace(s, train=replace(s.train, save_steps=save)) if s.name in MULTI_CHECKPOINT_RUNS
            else s for s in specs]


def machine_description() -> str:
    import os
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, torch {torch.__version__}")


def read_runs(root: str | Path) -> list[dict]:
    """One row per run folder under ``root``: config, final val loss, best val loss,
    checkpoints, params and KV bytes per token (float32)."""
    from experiments.train import load_checkpoint
    rows = []
    for cfg_path in sorted(Path(root).glob("*/config.json")):
        run = cfg_path.parent
        cfg = json.loads(cfg_path.read_text())
        vals = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
        vals = [r for r in vals if r.get("val_loss") is not None]
        ckpts = sorted(p.name for p in (run / "checkpoints").glob("*.safetensors"))
        finals = [c for c in ckpts if c.startswith("final_")]
        row = {"name": run.name, "variant": cfg["variant"], "n_head": cfg["n_head"], "seed": cfg["seed"],
               "n_kv_heads": cfg["n_kv_heads"], "weight_decay": cfg["weight_decay"],
               "steps": vals[-1]["step"] if vals else 0,
               "final_val_loss": vals[-1]["val_loss"] if vals else None,
               "best_val_loss": min(r["val_loss"] for r in vals) if vals else None,
               "checkpoints": ckpts}
        if finals:
            m = load_checkpoint(run / "checkpoints" / finals[-1])
            row.update(params=m.n_params(), params_attention=m.n_attention_params(),
                       kv_bytes_per_token=m.cfg.kv_bytes_per_token(4))
        rows.append(row)
    order = {v: i for i, v in enumerate(VARIANT_ORDER)}
    rows.sort(key=lambda r: (-r["n_kv_heads"], order.get(r["variant"], 99), r["weight_decay"], r["name"]))
    return rows


def table_markdown(rows: list[dict]) -> str:
    lines = ["| run | variant | heads (kv) | weight decay | seed | final val loss | best val loss "
             "| params | attention params | KV bytes/token (fp32) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| `{r['name']}` | `{r['variant']}` | {r['n_head']} ({r['n_kv_heads']}, "
            f"{sharing_label(r['n_head'], r['n_kv_heads']).upper()}) | {r['weight_decay']:g} | {r['seed']} | "
            f"{r['final_val_loss']:.4f} | {r['best_val_loss']:.4f} | {r.get('params', 0):,} | "
            f"{r.get('params_attention', 0):,} | {r.get('kv_bytes_per_token', 0):,} |")
    return "\n".join(lines)


def folder_bytes(root: str | Path) -> int:
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())


def _groups(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    out: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        out.setdefault((r["variant"], sharing_label(r["n_head"], r["n_kv_heads"]).upper()), []).append(r)
    return out


def write_readme(root: str | Path, *, command: str, wall_s: float, jobs: int, machine: str) -> Path:
    """Write ``root/README.md`` from the run folders found there."""
    root = Path(root)
    rows = read_runs(root)
    tc = demo_training()
    main = [r for r in rows if r["seed"] == tc.seed]
    replicates = [r for r in rows if r["name"].startswith(SEED_REPLICATES[0])]
    mha = [r for r in main if r["n_kv_heads"] == r["n_head"]]
    best = {}
    for r in mha:
        if r["variant"] not in best or r["final_val_loss"] < best[r["variant"]]["final_val_loss"]:
            best[r["variant"]] = r
    ranking = sorted(best.values(), key=lambda r: r["final_val_loss"])
    mc = DEMO_MODEL
    tc = replace(tc, steps=max((r["steps"] for r in rows), default=tc.steps))
    text = f"""# Bundled demo experiments

Produced by qkvscope's own trainer (`experiments/`) with one command:

```
{command}
```

* Machine: {machine}
* Wall time: {wall_s / 60:.1f} min for {len(rows)} runs, {jobs} at a time, one torch thread each
  (the machine was shared with other work while this ran, so times are indicative).
* Model: GPT, pre-norm {mc.norm}, {mc.positions} positions, {mc.n_layer} layers, d_model {mc.d_model},
  {mc.n_head} heads of d_head {mc.d_head}, MLP ratio {mc.mlp_ratio:g}, context {mc.block_size} bytes,
  vocabulary 256 (bytes), tied embeddings, no biases, attention scale 1/sqrt(d_head).
* Training: {tc.steps} steps x {tc.batch_size} x {mc.block_size} = {tc.steps * tc.batch_size * mc.block_size:,}
  tokens, AdamW (betas {tc.beta1}, {tc.beta2}; decay on matrices and embeddings only), lr {tc.lr:g}
  with {tc.warmup_steps} warmup steps and cosine decay to {tc.lr * tc.min_lr_ratio:g}, gradient clip
  {tc.grad_clip:g}, seed {tc.seed}; validation every {tc.eval_interval} steps on
  {tc.eval_batches} fixed held-out batches.
* Corpus: the Python standard library's own `.py` sources of the interpreter that trained it
  (first {CORPUS_MAX_BYTES:,} bytes in sorted file order; every 10th file held out for validation;
  size and sha256 in each run's `config.json`).
* Size on disk: {folder_bytes(root) / 1e6:.1f} MB (float32 safetensors).

Each folder is one run: `config.json`, `metrics.jsonl`, TensorBoard events and
`checkpoints/` (the final checkpoint; `{MULTI_CHECKPOINT_RUNS[0]}` and `{MULTI_CHECKPOINT_RUNS[1]}` also keep
steps {', '.join(str(s) for s in SAVE_STEPS)}).

## Final validation losses (nats per byte)

{table_markdown(rows)}

KV bytes per token = n_layers x n_cached x n_kv_heads x d_head x 4 bytes (n_cached 1 for K=V variants).

## What the numbers say

Best MHA run per variant, lowest final validation loss first:
{chr(10).join(f"{i + 1}. `{r['variant']}` (weight decay {r['weight_decay']:g}): {r['final_val_loss']:.4f}" for i, r in enumerate(ranking))}

Weight decay, lowest final validation loss per variant and head sharing:
{chr(10).join(f"* `{v}` ({s}): wd {min(g, key=lambda r: r['final_val_loss'])['weight_decay']:g}, "
              f"spread over wd {max(r['final_val_loss'] for r in g) - min(r['final_val_loss'] for r in g):.4f}"
              for (v, s), g in _groups(main).items() if len(g) > 1) or "(no variant was trained at more than one weight decay)"}

Seed-to-seed spread: `{SEED_REPLICATES[0]}` trained with seeds
{', '.join(str(r['seed']) for r in replicates)} (same validation batches) ends at
{', '.join(f"{r['final_val_loss']:.4f}" for r in replicates)}: a spread of
{(max(r['final_val_loss'] for r in replicates) - min(r['final_val_loss'] for r in replicates)) if replicates else float('nan'):.4f}.
Differences between variants smaller than that are within seed noise.

These are runs of a tiny model trained for {tc.steps} steps
({tc.steps * tc.batch_size * mc.block_size / 1e6:.2f}M tokens). They show the pipeline end to end
(trainer, loaders, analysis); they do not replicate either paper, whose models are orders of
magnitude larger and longer trained.
"""
    path = root / "README.md"
    path.write_text(text)
    return path


def run_demo_sweep(specs: list[RunSpec], out: str | Path, *, jobs: int = 2) -> list[dict]:
    """Train the demo runs into ``out`` (resuming any that an interrupted rebuild left)."""
    from experiments.sweep import run_sweep
    return run_sweep(specs, out, jobs=jobs, resume=True)
