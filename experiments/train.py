"""The small trainer behind ``python -m app train`` and the bundled demo.

AdamW with nanoGPT's decay rule (weight decay on parameters with >= 2
dimensions: matrices and embeddings; none on gains and biases), linear warmup
then cosine decay to ``min_lr_ratio * lr``, gradient clipping by global norm,
periodic validation on fixed held-out batches. Deterministic for a seed on
one device (init from ``seed``, training batches from a generator seeded
``seed + 1``). Validation batches come from ``val_seed``, independent of
``seed``, so runs that differ only in seed are scored on the same text.

Under ``torchrun`` (``train(..., dist=...)``, see :mod:`experiments.distributed`)
the model is wrapped in DistributedDataParallel; ``batch_size`` stays the
global batch, each rank trains on its slice of the same global batch, logged
losses are averaged over ranks, and only rank 0 writes the run folder, so N
processes log the curve one process logs (up to float summation order).

Two tasks (``GPTConfig.task``): ``language`` trains the byte-level GPT of
:mod:`experiments.model` on a text corpus (next-token loss); ``image`` trains
the ViT of :mod:`experiments.vision` on an image dataset (cross-entropy of
the class; validation also scores top-1 accuracy over the whole validation
split). Training batches are drawn with replacement from the training split
(images) or as random windows of the text (language), from the batch
generator.

A run folder holds::

    config.json            every hyperparameter (model + training + corpus or dataset, task)
    metrics.jsonl          {"step", "train_loss" | "val_loss" [, "val_accuracy"], "lr", "tokens", "wall_time"}
    events.out.tfevents.*  TensorBoard: train/loss, val/loss [, val/accuracy], lr
    checkpoints/step_000500.safetensors ... final_step_002000.safetensors
    resume.state           only while a run is unfinished: safetensors of weights, AdamW
                           moments and batch generator state (no pickle); its suffix keeps
                           checkpoint scans from taking it for a checkpoint

Checkpoints are safetensors of the model's real parameter set
(:meth:`experiments.model.GPT.export_state_dict`) with header metadata
``qkvscope_config`` (the model config as JSON) and ``qkvscope_run`` (step,
tokens, final flag and training hyperparameters as JSON).
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from experiments.corpus import Corpus, get_batch, load_corpus
from experiments.distributed import Dist, check_global_batch
from experiments.config import GPTConfig, TrainConfig  # noqa: F401  (TrainConfig: callers import it from here)
from experiments.model import GPT
from experiments.vision import ViT
from loaders.errors import FileError

if TYPE_CHECKING:
    from experiments.vision import ImageData

CONFIG_KEY = "qkvscope_config"
RUN_KEY = "qkvscope_run"
RESUME_FILE = "resume.state"  # safetensors inside; a suffix folder scans do not take for a checkpoint


class RunFolderError(FileError):
    """A run folder that cannot be started or resumed as asked."""


def lr_at(step: int, tc: TrainConfig) -> float:
    """Warmup lr*(step+1)/warmup, then cosine from lr to min_lr_ratio*lr at the last step."""
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    span = max(1, tc.steps - 1 - tc.warmup_steps)
    frac = min(1.0, (step - tc.warmup_steps) / span)
    min_lr = tc.lr * tc.min_lr_ratio
    return min_lr + 0.5 * (tc.lr - min_lr) * (1 + math.cos(math.pi * frac))


def make_optimizer(model: GPT, tc: TrainConfig) -> torch.optim.AdamW:
    """AdamW; decay on >= 2-D parameters only (nanoGPT's rule)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": tc.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2), foreach=False)


def run_config(mc: GPTConfig, tc: TrainConfig, data_info: dict) -> dict:
    """The flat ``config.json`` of a run (``corpus`` or, for images, ``dataset`` info)."""
    out = {"format": "qkvscope-run", "format_version": 1}
    out.update(mc.to_dict())
    out.update({k: v for k, v in asdict(tc).items() if k not in ("corpus", "dataset")})
    out["dataset" if mc.task == "image" else "corpus"] = data_info
    out["tokens_per_step"] = tc.batch_size * mc.block_size
    return out


class LanguageTask:
    """Next-byte prediction on a corpus (random windows of ``block_size``)."""

    def __init__(self, corpus: Corpus, mc: GPTConfig):
        self.corpus, self.mc, self.info = corpus, mc, corpus.info

    def build(self) -> GPT:
        return GPT(self.mc)

    def tokens_per_step(self, batch_size: int) -> int:
        return batch_size * self.mc.block_size

    def batch(self, batch_size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return get_batch(self.corpus.train, batch_size, self.mc.block_size, gen)  # (B, T) each

    @torch.inference_mode()
    def evaluate(self, model, tc: TrainConfig, dist: Dist | None = None) -> dict:
        return {"val_loss": evaluate(model, self.corpus.val, tc, self.mc.block_size, dist)}


class ImageTask:
    """Image classification: batches drawn with replacement from the training split;
    validation scores the whole validation split (loss and top-1 accuracy)."""

    def __init__(self, data: "ImageData", mc: GPTConfig):
        self.data, self.mc, self.info = data, mc, data.info

    def build(self):
        return ViT(self.mc)

    def tokens_per_step(self, batch_size: int) -> int:
        return batch_size * self.mc.block_size        # patches + cls token per image

    def batch(self, batch_size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(0, len(self.data.train_y), (batch_size,), generator=gen)
        return self.data.train_x[idx], self.data.train_y[idx]   # (B, C, H, W), (B,)

    @torch.inference_mode()
    def evaluate(self, model, tc: TrainConfig, dist: Dist | None = None) -> dict:
        """Every validation image on every rank (the same numbers as one process)."""
        model.eval()
        total, correct, n = 0.0, 0, len(self.data.val_y)
        for i in range(0, n, 512):
            x, y = self.data.val_x[i:i + 512].to(tc.device), self.data.val_y[i:i + 512].to(tc.device)
            logits, _ = model(x)
            total += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(-1) == y).sum())
        model.train()
        return {"val_loss": total / n, "val_accuracy": correct / n}


def make_task(mc: GPTConfig, tc: TrainConfig, corpus: Corpus | None = None):
    """The task of ``mc.task``: its data read (corpus or image dataset) and its model builder."""
    if mc.task == "image":
        from experiments.vision import load_images

        return ImageTask(load_images(tc.dataset or "digits"), mc)
    return LanguageTask(corpus if corpus is not None else
                        load_corpus(tc.corpus, max_bytes=tc.corpus_max_bytes), mc)




def checkpoint_name(step: int, final: bool) -> str:
    return f"{'final_step' if final else 'step'}_{step:06d}.safetensors"


def save_checkpoint(model, path: Path, *, step: int, tokens: int, final: bool,
                    tc: TrainConfig) -> None:
    meta = {
        "format": "pt",
        CONFIG_KEY: json.dumps(model.cfg.to_dict()),
        RUN_KEY: json.dumps({"step": step, "tokens": tokens, "final": final,
                             "weight_decay": tc.weight_decay, "lr": tc.lr, "seed": tc.seed,
                             **({"dataset": tc.dataset} if tc.dataset else {})}),
    }
    sd = {k: v.cpu() for k, v in model.export_state_dict().items()}
    tmp = path.with_suffix(".tmp")
    save_file(sd, str(tmp), metadata=meta)
    os.replace(tmp, path)


def load_checkpoint(path: str | Path, device: str = "cpu") -> GPT:
    """Rebuild the model from one of this trainer's safetensors checkpoints."""
    path = Path(path)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if CONFIG_KEY not in meta:
        raise RunFolderError(path, f"expected safetensors metadata key {CONFIG_KEY!r} "
                                   f"(a qkvscope checkpoint), found keys {sorted(meta)}")
    cfg = GPTConfig.from_dict(json.loads(meta[CONFIG_KEY]))
    return _model_class(cfg).from_state_dict(cfg, load_file(str(path), device=device))


def _model_class(cfg: GPTConfig):
    """GPT, or ViT for ``task='image'`` (imported only then: the language path stays as it was)."""
    if cfg.task == "image":
        from experiments.vision import ViT

        return ViT
    return GPT


def _save_resume(model: GPT, opt: torch.optim.AdamW, gen: torch.Generator, path: Path,
                 step: int, elapsed: float) -> None:
    names = {id(p): n for n, p in model.named_parameters()}
    tensors = {f"model.{k}": v.cpu() for k, v in model.export_state_dict().items()}
    adam_step = 0
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p)
            if st:
                tensors[f"opt.{names[id(p)]}.exp_avg"] = st["exp_avg"].detach().cpu().contiguous()
                tensors[f"opt.{names[id(p)]}.exp_avg_sq"] = st["exp_avg_sq"].detach().cpu().contiguous()
                adam_step = int(st["step"])
    tensors["rng.batch"] = gen.get_state().clone()
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={"step": str(step), "adam_step": str(adam_step),
                                           "elapsed": repr(elapsed)})
    os.replace(tmp, path)


def _load_resume(model: GPT, opt: torch.optim.AdamW, gen: torch.Generator,
                 path: Path) -> tuple[int, float]:
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        t = {k: f.get_tensor(k) for k in f.keys()}
    own = {k[len("model."):]: v for k, v in t.items() if k.startswith("model.")}
    device = next(model.parameters()).device
    with torch.no_grad():
        for k, p in model.state_dict().items():
            if k in own:
                p.copy_(own[k])
    adam_step = int(meta["adam_step"])
    for n, p in model.named_parameters():
        if f"opt.{n}.exp_avg" in t:
            opt.state[p] = {"step": torch.tensor(float(adam_step)),
                            "exp_avg": t[f"opt.{n}.exp_avg"].to(device),
                            "exp_avg_sq": t[f"opt.{n}.exp_avg_sq"].to(device)}
    gen.set_state(t["rng.batch"])
    return int(meta["step"]), float(meta["elapsed"])


@torch.inference_mode()
def evaluate(model: GPT, data: torch.Tensor, tc: TrainConfig, block_size: int,
             dist: Dist | None = None) -> float:
    """Mean loss over ``eval_batches`` fixed batches (generator seeded ``val_seed``).

    With ``dist`` every rank scores its rows of each batch and the means are
    averaged over ranks: equal slices, so the same number as one process.
    ``model`` is the bare model, never the DDP wrapper (whose forward joins
    collectives).
    """
    model.eval()
    gen = torch.Generator().manual_seed(tc.val_seed)
    losses = []
    for _ in range(tc.eval_batches):
        x, y = get_batch(data, tc.batch_size, block_size, gen)  # (B, T) each
        if dist is not None:
            x, y = dist.shard(x), dist.shard(y)  # (B/N, T)
        _, loss = model(x.to(tc.device), y.to(tc.device))
        losses.append(loss.item())
    model.train()
    mean = sum(losses) / len(losses)
    return dist.all_mean([mean])[0] if dist is not None else mean


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def train(mc: GPTConfig, tc: TrainConfig, out: str | Path, *, resume: bool = False,
          corpus: Corpus | None = None, progress: Callable[[str], None] = _stderr,
          dist: Dist | None = None) -> dict:
    """Train one run into the folder ``out``; returns a summary dict
    (``final_val_loss``, ``final_val_accuracy`` (image task, else None), ``steps``,
    ``params``, ``params_attention``, ``kv_bytes_per_token``, ``checkpoint``,
    ``wall_s``, ``world_size``). ``mc.task`` picks the task (``make_task``).

    ``resume=True`` continues an unfinished run from ``resume.state``
    (the hyperparameters must match ``config.json``); a finished run is left
    as it is. Without ``resume`` the folder must not already hold a run.

    ``dist`` (from :func:`experiments.distributed.process_group`) trains
    data-parallel: ``tc.batch_size`` is the global batch and must be divisible
    by ``dist.world_size``; the model runs on ``dist.device`` (``tc.device`` is
    ignored); only rank 0 writes files and calls ``progress``; every rank
    returns the summary (non-zero ranks compute it without reading the folder).
    """
    from torch.utils.tensorboard import SummaryWriter  # here: TensorBoard loads only when a run writes events

    out = Path(out)
    main = dist is None or dist.is_main
    if dist is not None:
        tc = replace(tc, device=dist.device)  # the caller's config is left as it is
        if not main:
            progress = _silent
    if tc.threads:
        torch.set_num_threads(tc.threads)
    cfg_path, metrics_path, ckpt_dir = out / "config.json", out / "metrics.jsonl", out / "checkpoints"
    resume_path = out / RESUME_FILE
    final_path = ckpt_dir / checkpoint_name(tc.steps, True)

    # every check reads only; under torchrun all ranks agree on it before rank 0 writes anything
    error: BaseException | None = None
    finished = False
    try:
        if dist is not None:
            check_global_batch(tc.batch_size, dist.world_size)
        task = make_task(mc, tc, corpus)
        config = run_config(mc, tc, task.info)
        finished = _check_run_folder(out, config, resume, final_path, resume_path)
    except Exception as exc:
        if dist is None:
            raise
        error = exc
    if dist is not None:
        dist.agree(error)
    if finished:
        progress(f"{out}: already finished ({final_path.name}); nothing to do")
        return _summary(load_checkpoint(final_path), metrics_path, final_path, 0.0, dist)
    if main:
        out.mkdir(parents=True, exist_ok=True)
        ckpt_dir.mkdir(exist_ok=True)
        cfg_path.write_text(json.dumps(config, indent=2) + "\n")

    torch.manual_seed(tc.seed)
    model = task.build().to(tc.device)
    model.train()
    opt = make_optimizer(model, tc)
    gen = torch.Generator().manual_seed(tc.seed + 1)
    start, elapsed0 = 0, 0.0
    if resume and resume_path.exists():
        start, elapsed0 = _load_resume(model, opt, gen, resume_path)  # every rank reads it
        progress(f"{out}: resuming at step {start}")
    # DDP averages gradients over ranks in backward; ``model`` stays the bare
    # GPT for evaluation, checkpoints and the optimizer (same parameter objects)
    net = model
    if dist is not None:
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(
            model, device_ids=[torch.device(tc.device).index] if dist.backend == "nccl" else None)
        progress(f"{out.name}: DistributedDataParallel on {dist.world_size} processes ({dist.backend}), "
                 f"global batch {tc.batch_size} = {dist.world_size} x {tc.batch_size // dist.world_size}")
    writer = None
    if main:
        # keep the metrics written up to the resumed step, drop anything after it
        kept = []
        if start and metrics_path.exists():
            kept = [ln for ln in metrics_path.read_text().splitlines()
                    if ln.strip() and json.loads(ln)["step"] <= start]
        metrics_path.write_text("".join(ln + "\n" for ln in kept))
        writer = SummaryWriter(log_dir=str(out), purge_step=start if start else None)
    tps = task.tokens_per_step(tc.batch_size)
    t0 = time.time()
    last_val: tuple[int, float, float | None] | None = None  # (step, val_loss, val_accuracy), latest

    def log(record: dict) -> None:
        nonlocal last_val
        if "val_loss" in record:
            last_val = (record["step"], record["val_loss"], record.get("val_accuracy"))
        if not main:
            return
        with metrics_path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        for key, tag in (("train_loss", "train/loss"), ("val_loss", "val/loss"),
                         ("val_accuracy", "val/accuracy"), ("lr", "lr")):
            if key in record and record[key] is not None:
                writer.add_scalar(tag, record[key], record["step"], walltime=record["wall_time"])

    if start == 0:
        log({"step": 0, **task.evaluate(model, tc, dist), "lr": lr_at(0, tc), "tokens": 0,
             "wall_time": time.time()})
    window: list[float] = []
    t_last, step_last = time.time(), start
    diverged = False
    step = start
    try:
        for step in range(start, tc.steps):
            lr = lr_at(step, tc)
            for g in opt.param_groups:
                g["lr"] = lr
            x, y = task.batch(tc.batch_size, gen)  # the global batch: (B, T) tokens or (B, C, H, W) images
            if dist is not None:
                x, y = dist.shard(x), dist.shard(y)  # (B/N, T): this rank's rows
            _, loss = net(x.to(tc.device), y.to(tc.device))
            opt.zero_grad(set_to_none=True)
            loss.backward()  # under DDP: gradients all-reduced (averaged) here
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            opt.step()
            done = step + 1
            # the global batch's loss; every rank sees the same value, so all stop together
            value = dist.all_mean([loss.item()])[0] if dist is not None else loss.item()
            window.append(value)
            diverged = not math.isfinite(value)
            if done % tc.log_interval == 0 or done == tc.steps or diverged:
                mean = sum(window) / len(window)
                log({"step": done, "train_loss": mean if math.isfinite(mean) else None, "lr": lr,
                     "tokens": done * tps, "wall_time": time.time()})
                now = time.time()
                rate = (done - step_last) * tps / max(now - t_last, 1e-9)
                progress(f"{out.name} step {done}/{tc.steps} loss {mean:.4f} lr {lr:.2e} "
                         f"{rate:,.0f} tok/s")
                window, t_last, step_last = [], now, done
            if diverged:
                progress(f"{out.name}: loss is not finite at step {done}; stopping")
                break
            if done % tc.eval_interval == 0 and done != tc.steps:
                scores = task.evaluate(model, tc, dist)
                log({"step": done, **scores, "lr": lr, "tokens": done * tps, "wall_time": time.time()})
                progress(f"{out.name} step {done} {_scores_text(scores)}")
                if main:
                    _save_resume(model, opt, gen, resume_path, done, elapsed0 + time.time() - t0)
            if done in tc.save_steps and done != tc.steps and main:
                save_checkpoint(model, ckpt_dir / checkpoint_name(done, False), step=done,
                                tokens=done * tps, final=False, tc=tc)
                _save_resume(model, opt, gen, resume_path, done, elapsed0 + time.time() - t0)
    except KeyboardInterrupt:
        if writer is not None:
            writer.close()
        raise
    done = step + 1 if tc.steps > start else start
    if not diverged:
        scores = task.evaluate(model, tc, dist)
        log({"step": done, **scores, "lr": lr_at(max(done - 1, 0), tc),
             "tokens": done * tps, "wall_time": time.time()})
        progress(f"{out.name} step {done} {_scores_text(scores)}")
    final_path = ckpt_dir / checkpoint_name(done, True)
    wall_s = elapsed0 + time.time() - t0
    if not main:
        dist.barrier()  # returns once rank 0 has written the final checkpoint
        val_step, val_loss, val_acc = last_val if last_val is not None else (0, None, None)
        return _result(model, val_loss, val_step, final_path, wall_s, dist, val_acc)
    save_checkpoint(model, final_path, step=done, tokens=done * tps, final=True, tc=tc)
    writer.close()
    if resume_path.exists():
        resume_path.unlink()
    if dist is not None:
        dist.barrier()
    return _summary(model, metrics_path, final_path, wall_s, dist)


def _scores_text(scores: dict) -> str:
    return " ".join(f"{k} {v:.4f}" for k, v in scores.items())


def _silent(line: str) -> None:
    """Progress sink of the ranks other than 0."""


def _check_run_folder(out: Path, config: dict, resume: bool, final_path: Path,
                      resume_path: Path) -> bool:
    """Whether ``out`` holds this run already finished; RunFolderError when it
    holds a run that may not be (re)started as asked. Reads only."""
    cfg_path = out / "config.json"
    if not cfg_path.exists():
        return False
    if not resume:
        raise RunFolderError(out, "expected an empty or new run folder, found a run "
                                  "(config.json); pass --resume to continue it or choose another --out")
    old = json.loads(cfg_path.read_text())
    diff = sorted(k for k in set(old) | set(config) if k not in TrainConfig.RUNTIME
                  and old.get(k) != config.get(k))
    if diff:
        raise RunFolderError(out, "expected the same hyperparameters to resume, found different "
                                  f"values for {', '.join(diff)}")
    return final_path.exists() and not resume_path.exists()


def _summary(model, metrics_path: Path, checkpoint: Path, wall_s: float,
             dist: Dist | None = None) -> dict:
    vals = [json.loads(ln) for ln in metrics_path.read_text().splitlines() if ln.strip()]
    vals = [r for r in vals if "val_loss" in r]
    return _result(model, vals[-1]["val_loss"] if vals else None, vals[-1]["step"] if vals else 0,
                   checkpoint, wall_s, dist, vals[-1].get("val_accuracy") if vals else None)


def _result(model, final_val: float | None, steps: int, checkpoint: Path, wall_s: float,
            dist: Dist | None, final_accuracy: float | None = None) -> dict:
    return {
        "final_val_loss": final_val,
        "final_val_accuracy": final_accuracy,
        "steps": steps,
        "params": model.n_params(),
        "params_attention": model.n_attention_params(),
        "kv_bytes_per_token": model.cfg.kv_bytes_per_token(4),
        "checkpoint": str(checkpoint),
        "wall_s": wall_s,
        "world_size": dist.world_size if dist is not None else 1,
    }

