"""Train one variant model into a run folder.

  python -m app train --variant k_eq_v --n-kv-heads 1 --weight-decay 0.03 \\
      --out runs/kv-mqa-wd0.03 [--corpus PATH] [--device cuda] [--steps N]

The run folder holds config.json, metrics.jsonl, TensorBoard events and
checkpoints/*.safetensors (--save-steps plus the final one). --resume
continues an interrupted run from its last saved state. The default corpus is
the Python standard library's own source (byte-level, offline).

Vision (paper B's other half): a ViT of any variant x MHA/GQA/MQA on images,

  python -m app train --task image --dataset digits --variant k_eq_v --n-kv-heads 1 \
      --steps 200 --out runs/x

--dataset is `digits` (scikit-learn's bundled 8x8 digits, no download), an .npz
with x (N, H, W[, C]) and y, or a folder of class subfolders of images; the
image and patch size come from the data (--patch-size overrides); the run logs
train/loss, val/loss and val/accuracy.

Data-parallel on N processes (DistributedDataParallel; backend nccl with
--device cuda, each process on cuda:LOCAL_RANK, else gloo on the CPU):

  torchrun --nproc_per_node=N -m app train ... --out runs/x [--device cuda]

--batch-size is the GLOBAL batch: it must be divisible by N and each process
trains on its B/N rows of the same batch, so the loss curve is the one a
single process logs. Only rank 0 writes the run folder and prints progress.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from app.commands._common import print_json
from experiments.config import NORMS, POSITIONS, TASKS, VARIANTS, GPTConfig, TrainConfig

NAME = "train"
HELP = "train one variant model (variant, head sharing, weight decay) into a run folder"


#: Defaults that differ by task (a flag left out takes its task's value): the image
#: defaults train a small ViT on the digits to > 0.8 validation accuracy in 200 steps
#: on two CPU cores (docs/guide/training.md, "Vision runs").
TASK_DEFAULTS = {
    "language": {"n_layer": 4, "d_model": 128, "batch_size": 16, "lr": 1e-3, "warmup_steps": 50,
                 "eval_interval": 100},
    "image": {"n_layer": 2, "d_model": 64, "batch_size": 128, "lr": 3e-3, "warmup_steps": 20,
              "eval_interval": 50},
}


def _task_value(args: argparse.Namespace, name: str):
    value = getattr(args, name)
    return TASK_DEFAULTS[getattr(args, "task", "language")][name] if value is None else value


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def _scale(text: str) -> float | str:
    """A number, ``default`` (1/sqrt(d_head)) or ``half`` (1/(2 sqrt(d_head)), query-free paper)."""
    if text in ("default", "half"):
        return text
    return float(text)


def add_model_train_arguments(p: argparse.ArgumentParser, *, single: bool = True) -> None:
    """Model and training options shared by ``train`` and ``sweep``."""
    m, t = GPTConfig(), TrainConfig()
    g = p.add_argument_group("task")
    g.add_argument("--task", choices=TASKS, default="language",
                   help="language (byte-level GPT on a corpus, default) or image (ViT on --dataset)")
    g.add_argument("--dataset", default="digits",
                   help="image task: 'digits' (default; sklearn's 8x8 digits), an .npz with x and y, "
                        "or a folder of class subfolders of images")
    g.add_argument("--patch-size", type=int, default=None,
                   help="image task: patch side in pixels (default: a 4x4 grid for images <= 32 px, else 16)")
    g = p.add_argument_group("model")
    if single:
        g.add_argument("--variant", choices=VARIANTS, default="qkv", help="attention variant (default qkv)")
        g.add_argument("--n-kv-heads", type=int, default=None,
                       help="kv heads: n-head (MHA, default), a divisor (GQA) or 1 (MQA)")
    lang, img = TASK_DEFAULTS["language"], TASK_DEFAULTS["image"]

    def by_task(name: str) -> str:
        return f"default {lang[name]:g}; image task {img[name]:g}"

    g.add_argument("--n-layer", type=int, default=None, help=f"layers ({by_task('n_layer')})")
    g.add_argument("--d-model", type=int, default=None, help=f"width ({by_task('d_model')})")
    g.add_argument("--n-head", type=int, default=m.n_head, help=f"query heads (default {m.n_head})")
    g.add_argument("--d-head", type=int, default=None, help="head size (default d-model / n-head)")
    g.add_argument("--block-size", type=int, default=m.block_size, help=f"context in bytes (default {m.block_size})")
    g.add_argument("--norm", choices=NORMS, default=m.norm, help=f"default {m.norm}")
    g.add_argument("--positions", choices=POSITIONS, default=m.positions, help=f"default {m.positions}")
    g.add_argument("--mlp-ratio", type=float, default=m.mlp_ratio,
                   help="MLP width / d_model (default 4; query-free paper: 4.5 vs 3.5)")
    g.add_argument("--attn-scale", type=_scale, default="default",
                   help="'default' 1/sqrt(d_head), 'half' 1/(2 sqrt(d_head)), or a number")
    g.add_argument("--bias", action="store_true", help="biases in linear layers and LayerNorm")
    g = p.add_argument_group("training")
    if single:
        g.add_argument("--weight-decay", type=float, default=t.weight_decay, help=f"default {t.weight_decay}")
    g.add_argument("--steps", type=int, default=t.steps, help=f"optimizer steps (default {t.steps})")
    batch_help = "sequences per step; under torchrun the global batch, split over the processes" \
        if single else "sequences per step"
    g.add_argument("--batch-size", type=int, default=None, help=f"{batch_help} ({by_task('batch_size')})")
    g.add_argument("--lr", type=float, default=None, help=f"peak learning rate ({by_task('lr')})")
    g.add_argument("--warmup-steps", type=int, default=None, help=by_task("warmup_steps"))
    g.add_argument("--grad-clip", type=float, default=t.grad_clip, help=f"default {t.grad_clip}")
    g.add_argument("--eval-interval", type=int, default=None, help=by_task("eval_interval"))
    g.add_argument("--eval-batches", type=int, default=t.eval_batches, help=f"default {t.eval_batches}")
    g.add_argument("--log-interval", type=int, default=t.log_interval, help=f"default {t.log_interval}")
    g.add_argument("--save-steps", type=_ints, default=[], help="comma-separated steps to checkpoint, e.g. 250,500")
    g.add_argument("--seed", type=int, default=t.seed, help=f"default {t.seed}")
    g.add_argument("--corpus", default=None,
                   help="text file or folder (default: the Python standard library's source)")
    g.add_argument("--corpus-max-bytes", type=int, default=None, help="read at most this many bytes")
    g.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, ...")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    g.add_argument("--resume", action="store_true", help="continue an unfinished run in --out")


def configs_from_args(args: argparse.Namespace, *, variant: str = "qkv", n_kv_heads: int | None = None,
                      weight_decay: float = 0.1):
    """(GPTConfig, TrainConfig) from parsed arguments; ValueError on an invalid model."""
    variant = getattr(args, "variant", variant)
    n_kv_heads = getattr(args, "n_kv_heads", n_kv_heads)
    d_model, n_layer = _task_value(args, "d_model"), _task_value(args, "n_layer")
    d_head = args.d_head or d_model // args.n_head
    scale = {"default": None, "half": 1.0 / (2 * math.sqrt(d_head))}.get(args.attn_scale, args.attn_scale) \
        if isinstance(args.attn_scale, str) else args.attn_scale
    model = dict(n_layer=n_layer, n_head=args.n_head, n_kv_heads=n_kv_heads, d_model=d_model,
                 d_head=args.d_head, variant=variant, norm=args.norm, positions=args.positions,
                 mlp_ratio=args.mlp_ratio, attn_scale=scale, bias=args.bias)
    task = getattr(args, "task", "language")
    if task == "image":
        from experiments.vision import load_images, vision_config  # torch: only when a run starts

        mc = vision_config(load_images(args.dataset), patch_size=args.patch_size, **model)
    else:
        mc = GPTConfig(block_size=args.block_size, **model)
    tc = TrainConfig(steps=args.steps, batch_size=_task_value(args, "batch_size"), lr=_task_value(args, "lr"),
                     warmup_steps=_task_value(args, "warmup_steps"),
                     weight_decay=getattr(args, "weight_decay", weight_decay),
                     grad_clip=args.grad_clip, eval_interval=_task_value(args, "eval_interval"),
                     eval_batches=args.eval_batches, log_interval=args.log_interval,
                     seed=args.seed, save_steps=list(args.save_steps), corpus=args.corpus,
                     corpus_max_bytes=args.corpus_max_bytes, device=args.device, threads=args.threads,
                     dataset=args.dataset if task == "image" else None)
    return mc, tc


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="run folder to create (or resume)")
    add_model_train_arguments(p, single=True)
    p.add_argument("--json", action="store_true", help="print the run summary as JSON")


def run(args: argparse.Namespace) -> int:
    # torch is imported when a run starts, not when the CLI builds its parsers (app/commands/__init__)
    from experiments.distributed import check_global_batch, process_group, torchrun_env
    from experiments.train import train

    try:
        mc, tc = configs_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    env = torchrun_env()
    if env is not None:
        # every rank has the same arguments: a global batch the processes cannot share is refused
        # by each before it joins the group (no rendezvous to wait for, nothing written)
        check_global_batch(tc.batch_size, env.world_size)
    # under torchrun: join the process group; left on return and on any error
    with process_group(tc.device) as dist:
        summary = train(mc, tc, args.out, resume=args.resume, dist=dist)
    if dist is not None and not dist.is_main:
        return 0
    if args.json:
        print_json(summary)
    else:
        acc = summary.get("final_val_accuracy")
        print(f"{args.out}: final val loss {summary['final_val_loss']:.4f}"
              + (f", val accuracy {acc:.3f}" if acc is not None else "")
              + f" after {summary['steps']} steps; {summary['params']:,} params; checkpoint {summary['checkpoint']}")
    return 0
