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

Vision runs (paper B's other half; ViTs on scikit-learn's 8x8 digits, the
closest bundled task to its MNIST column), named ``vit-...``:

* MHA: paper B's six variants (``qkv``, ``q_eq_k``, ``q_eq_k_plus``, ``k_eq_v``,
  ``q_eq_k_eq_v``, ``q_eq_k_eq_v_plus``) x weight decay {0.0, 0.03, 0.1}  (18 runs)
* ``k_eq_v`` with GQA-2 and MQA x the same weight decays  (6 runs)

each keeping its final checkpoint only (the demo stays small).
"""
from __future__ import annotations

import json
import os
import platform
from dataclasses import replace
from pathlib import Path

import torch

from experiments.model import GPTConfig
from experiments.sweep import RunSpec, grid, run_sweep, sharing_label
from experiments.train import TrainConfig, load_checkpoint
from experiments.vision import load_images, vision_config

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
#: Paper B's six variants, in its tables' order.
VISION_VARIANTS = ("qkv", "q_eq_k", "q_eq_k_plus", "k_eq_v", "q_eq_k_eq_v", "q_eq_k_eq_v_plus")
VISION_STEPS = 300
VISION_MODEL = dict(n_layer=2, n_head=4, d_model=64, norm="layernorm", mlp_ratio=4.0)
PARTS = ("all", "language", "vision")


def demo_training(steps: int = STEPS):
    return TrainConfig(steps=steps, batch_size=16, lr=2e-3, warmup_steps=100, eval_interval=250,
                       eval_batches=32, log_interval=20, seed=1337, corpus=None,
                       corpus_max_bytes=CORPUS_MAX_BYTES, threads=1)


def vision_training(steps: int = VISION_STEPS):
    return TrainConfig(steps=steps, batch_size=128, lr=3e-3, warmup_steps=20, eval_interval=25,
                       log_interval=10, seed=1337, dataset="digits", threads=1)


def vision_specs(steps: int = VISION_STEPS, model: dict | None = None) -> list[RunSpec]:
    """The demo's vision runs: the six variants at MHA, then K=V at GQA-2 and MQA."""
    mc = vision_config(load_images("digits"), **(model or VISION_MODEL))
    tc = vision_training(steps)
    return (grid(VISION_VARIANTS, WEIGHT_DECAYS, model=mc, training=tc)
            + grid(("k_eq_v",), WEIGHT_DECAYS, n_kv_heads=(mc.n_head // 2, 1), model=mc, training=tc))


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
    rows = []
    for cfg_path in sorted(Path(root).glob("*/config.json")):
        run = cfg_path.parent
        cfg = json.loads(cfg_path.read_text())
        vals = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
        vals = [r for r in vals if r.get("val_loss") is not None]
        accs = [r["val_accuracy"] for r in vals if r.get("val_accuracy") is not None]
        ckpts = sorted(p.name for p in (run / "checkpoints").glob("*.safetensors"))
        finals = [c for c in ckpts if c.startswith("final_")]
        row = {"name": run.name, "task": cfg.get("task", "language"), "variant": cfg["variant"],
               "n_head": cfg["n_head"], "seed": cfg["seed"],
               "n_kv_heads": cfg["n_kv_heads"], "weight_decay": cfg["weight_decay"],
               "steps": vals[-1]["step"] if vals else 0,
               "final_val_loss": vals[-1]["val_loss"] if vals else None,
               "best_val_loss": min(r["val_loss"] for r in vals) if vals else None,
               "final_val_accuracy": accs[-1] if accs else None,
               "best_val_accuracy": max(accs) if accs else None,
               "checkpoints": ckpts}
        if finals:
            m = load_checkpoint(run / "checkpoints" / finals[-1])
            row.update(params=m.n_params(), params_attention=m.n_attention_params(),
                       kv_bytes_per_token=m.cfg.kv_bytes_per_token(4))
        rows.append(row)
    order = {v: i for i, v in enumerate(VARIANT_ORDER + VISION_VARIANTS[2:3] + VISION_VARIANTS[5:])}
    rows.sort(key=lambda r: (r["task"] != "language", -r["n_kv_heads"], order.get(r["variant"], 99),
                             r["weight_decay"], r["name"]))
    return rows


def vision_readme_section(rows: list[dict], built: dict | None = None) -> str:
    """The README's vision part: how it was built, the table, the mean accuracy per variant,
    and the caveats."""
    vision = [r for r in rows if r["task"] == "image" and r["final_val_accuracy"] is not None]
    if not vision:
        return ""
    tc = vision_training()
    cfg = VISION_MODEL
    by_variant: dict[str, list[float]] = {}
    for r in vision:
        if r["n_kv_heads"] == r["n_head"]:
            by_variant.setdefault(r["variant"], []).append(r["final_val_accuracy"])
    means = "\n".join(f"| `{v}` | {sum(a) / len(a):.3f} | {min(a):.3f} to {max(a):.3f} | {len(a)} |"
                       for v, a in sorted(by_variant.items(), key=lambda kv: VISION_VARIANTS.index(kv[0])
                                          if kv[0] in VISION_VARIANTS else 99))
    how = (f"Built with `{built['command']}` in {built['wall_s'] / 60:.1f} min, {built['jobs']} runs at a "
           f"time, one torch thread each, on {built['machine']}.\n\n") if built else ""
    return f"""
## Vision runs (ViT on the 8x8 digits)

{how}* Data: scikit-learn's bundled digits (1,797 8x8 greyscale images, 10 classes), a fixed stratified
  80/20 split (1,438 / 359 images), standardised with the training split's statistics.
* Model: ViT encoder (no causal mask), patches of 2x2 pixels (16 patches + a class token),
  {cfg['n_layer']} layers, d_model {cfg['d_model']}, {cfg['n_head']} heads, MLP ratio {cfg['mlp_ratio']:g},
  pre-norm {cfg['norm']}, learned positions; the "+" variants add paper B's 2D positional score correction.
* Training: {tc.steps} steps x {tc.batch_size} images (with replacement), AdamW lr {tc.lr:g}, {tc.warmup_steps}
  warmup steps then cosine, seed {tc.seed}; validation (loss and top-1 accuracy on all 359 images) every
  {tc.eval_interval} steps.

{table_markdown(vision, VISION_COLUMNS)}

Mean final validation accuracy of the MHA runs over the three weight decays:

| variant | mean accuracy | range | runs |
|---|---|---|---|
{means}

With 359 validation images one image is 0.28 points of accuracy, and a 95% binomial interval
around 0.9 is about +-0.03: differences between variants below that are noise.
"""


#: The README tables' columns: (header, row field, format). ``code`` cells are
#: backquoted, ``heads`` is "n_head (n_kv_heads, MHA/GQA-g/MQA)"; counts absent from a
#: row (a run without a final checkpoint) are 0.
LANGUAGE_COLUMNS = (("run", "name", "code"), ("variant", "variant", "code"), ("heads (kv)", "heads", ""),
                    ("weight decay", "weight_decay", "g"), ("seed", "seed", ""),
                    ("final val loss", "final_val_loss", ".4f"), ("best val loss", "best_val_loss", ".4f"),
                    ("params", "params", ","), ("attention params", "params_attention", ","),
                    ("KV bytes/token (fp32)", "kv_bytes_per_token", ","))
VISION_COLUMNS = (LANGUAGE_COLUMNS[:4]
                  + (("final val accuracy", "final_val_accuracy", ".3f"),
                     ("best val accuracy", "best_val_accuracy", ".3f"), LANGUAGE_COLUMNS[5])
                  + LANGUAGE_COLUMNS[7:])
_COUNTS = ("params", "params_attention", "kv_bytes_per_token")


def _cell(row: dict, field: str, spec: str) -> str:
    if field == "heads":
        return f"{row['n_head']} ({row['n_kv_heads']}, {sharing_label(row['n_head'], row['n_kv_heads']).upper()})"
    value = row.get(field, 0) if field in _COUNTS else row[field]
    return f"`{value}`" if spec == "code" else format(value, spec)


def table_markdown(rows: list[dict], columns=LANGUAGE_COLUMNS) -> str:
    """A Markdown table of ``rows`` (``read_runs``), one line a run, in ``columns``."""
    lines = ["| " + " | ".join(head for head, _, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r, field, spec) for _, field, spec in columns) + " |" for r in rows]
    return "\n".join(lines)


def folder_bytes(root: str | Path) -> int:
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())


def _groups(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    out: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        out.setdefault((r["variant"], sharing_label(r["n_head"], r["n_kv_heads"]).upper()), []).append(r)
    return out


REBUILDS_FILE = "rebuilds.json"


def record_rebuild(root: Path, part: str, *, command: str, wall_s: float, jobs: int, machine: str) -> dict:
    """Update ``root/rebuilds.json`` (how each half was last built) and return it."""
    path = root / REBUILDS_FILE
    record = json.loads(path.read_text()) if path.exists() else {}
    entry = {"command": command, "wall_s": wall_s, "jobs": jobs, "machine": machine}
    for half in (("language", "vision") if part == "all" else (part,)):
        record[half] = entry
    path.write_text(json.dumps(record, indent=2) + "\n")
    return record


def write_readme(root: str | Path, *, command: str, wall_s: float, jobs: int, machine: str,
                 part: str = "all") -> Path:
    """Write ``root/README.md`` from the run folders found there; ``part`` names the half
    just rebuilt (its command, time and machine are kept in ``rebuilds.json``, so a
    rebuild of one half leaves the other's record as it was)."""
    root = Path(root)
    record = record_rebuild(root, part, command=command, wall_s=wall_s, jobs=jobs, machine=machine)
    lang = record.get("language", {"command": command, "wall_s": wall_s, "jobs": jobs, "machine": machine})
    command, wall_s, jobs, machine = lang["command"], lang["wall_s"], lang["jobs"], lang["machine"]
    rows = read_runs(root)
    tc = demo_training()
    vision_part = vision_readme_section(rows, record.get("vision"))
    rows = [r for r in rows if r["task"] == "language"]
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
{vision_part}"""
    path = root / "README.md"
    path.write_text(text)
    return path


def run_demo_sweep(specs: list[RunSpec], out: str | Path, *, jobs: int = 2) -> list[dict]:
    """Train the demo runs into ``out`` (resuming any that an interrupted rebuild left)."""
    return run_sweep(specs, out, jobs=jobs, resume=True)
