"""The activation metrics of a checkpoint on a corpus sample (``corpus_activations``): what is fed
and how many tokens, per kind of model; the forward pass itself is ``experiments.runnable.feed``
and the statistics ``analysis.activations.ActivationAccumulator``.

Text models: the text (``SampleSpec.text``, else the bundled corpus ``data/corpus``) is tokenised
(the checkpoint's tokenizer or vocabulary, else UTF-8 bytes, else sampled ids: see
``experiments.runnable``) and cut into ``[B, T]`` windows of the model's context (at most
``MAX_WINDOW``) spread over it (``analysis.captures.sample_windows``), ``want`` tokens in total:
``SampleSpec.tokens``, else ``max(DEFAULT_TOKENS, TOKENS_PER_COLUMN * d_head)``.

Vision models: each image is one window, its tokens the patches (plus the class, distillation or
register tokens): this project's ViTs (``experiments.vision``) on validation images of
``SampleSpec.images``, else the dataset the run trained on, else ``digits``, at the model's own
size; Hugging Face ViT, DeiT, DINOv2 and CLIP / SigLIP vision models on ``SampleSpec.images``
(else scikit-learn's bundled ``digits``), standardised per channel and resized to the model's
``image_size`` and ``num_channels`` (``analysis.captures.fit_images``); a full ``CLIPModel`` /
``SiglipModel`` runs its vision tower on those images and its text tower on the text, each with
its own token count and notes prefixed by the tower. As many images as ``want`` tokens need.

Every row carries its chance level, ``n_tokens`` and a jackknife-t interval over windows; the
notes say what the inputs were. The keys are the un-rotated ones: for rotary or ALiBi positions
(and paper B's "+" variants) the logits are not the model's, so ``logit_symmetry`` is left out
with that reason.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd
import torch

from analysis.activations import ActivationAccumulator
from analysis.captures import MAX_WINDOW, fit_images, fits, sample_windows
from analysis.notes import add_activation_note
from analysis.registry import RESULT_COLUMNS
from analysis.variants import PLUS
from analysis.weights import default_device
from experiments.runnable import (NoForwardPass, attention_modules, feed, hf_towers, load_runnable, model_context,
                                  stack_modules, tower_layers)
from experiments.sample_text import SampleSpec
from experiments.vision import load_images
from loaders.canonical import Checkpoint
from loaders.errors import QkvscopeError
from loaders.vocab import CharVocabulary, SampledIds, Vocabulary

Progress = Callable[[int, int, str], None]  # (done, total, what is being done)

#: Tokens behind the activation metrics by default (at least TOKENS_PER_COLUMN * d_head).
DEFAULT_TOKENS = 4096
#: A fit or a rank of d_head columns needs this many samples per column to mean anything.
TOKENS_PER_COLUMN = 8


@dataclass
class ActivationRun:
    frame: pd.DataFrame                 # RESULT_COLUMNS
    notes: dict[str, str]
    sample: dict                        # the key plus what was fed: tokens, windows, context, tokenizer


def token_stream(text: str, tok, vocab: int, n: int | None = None) -> tuple[torch.Tensor, str]:
    """Token ids of ``text``; ``n``: how many a ``SampledIds`` stand-in draws."""
    if isinstance(tok, SampledIds):
        return torch.tensor(tok.sample(n if n is not None else len(text)), dtype=torch.long), tok.how
    if isinstance(tok, Vocabulary):
        return torch.tensor(tok.encode(text), dtype=torch.long), tok.how
    if tok is not None:
        ids = tok(text, add_special_tokens=False, verbose=False)["input_ids"]
        return torch.tensor(ids, dtype=torch.long), "tokenizer"
    if vocab < 256:
        raise NoForwardPass(f"no tokenizer and vocab_size {vocab} < 256: cannot feed UTF-8 bytes")
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long), "bytes"


def corpus_activations(ckpt: Checkpoint, *, sample: SampleSpec | None = None, device: str | None = None,
                       progress: Progress | None = None) -> ActivationRun:
    """Activation metrics of every layer on a corpus sample, with chance, n_tokens and intervals.

    The text (``sample.text``, else the bundled corpus) is tokenised (the checkpoint's tokenizer,
    else UTF-8 bytes) and cut into windows of the model's context (at most ``MAX_WINDOW``) spread
    over it, ``sample.tokens`` in total; the windows go through the model in batches of about
    ``BATCH_TOKENS`` tokens. A pre-hook on each attention module hands the layer input ``x``
    ``[B, T, d_model]`` to that layer's ``analysis.activations.ActivationAccumulator``, which keeps
    per-window statistics only. Vision models run on images instead, their patches as the tokens
    (this project's ViTs: ``image_activations``; Hugging Face ViT, DeiT, DINOv2 and the vision
    towers of CLIP and SigLIP: ``hf_tower_activations``, a full CLIP's text tower on the text).
    Raises ``NoForwardPass`` when the checkpoint cannot be run.
    """
    sample = sample or SampleSpec()
    meta = ckpt.meta
    dev = torch.device(device or default_device())
    model, tok, vocab = load_runnable(ckpt)
    towers = hf_towers(model)
    if towers is not None:
        return hf_tower_activations(ckpt, towers, tok, vocab, sample, dev, progress)
    want = wanted(sample, meta)
    mods = attention_modules(model)
    if len(mods) != meta.n_layers:
        raise NoForwardPass(f"{ckpt.path}: found {len(mods)} attention modules in the model, "
                            f"expected {meta.n_layers} (one per layer)")
    if getattr(getattr(model, "cfg", None), "task", "language") == "image":
        return image_activations(ckpt, model, mods, sample, want, dev, progress)
    return text_activations(ckpt, model, mods, list(ckpt.layers()), tok, vocab, sample, want, dev, progress)


def wanted(sample: SampleSpec, meta) -> int:
    """Tokens asked for: ``sample.tokens``, else ``max(DEFAULT_TOKENS, TOKENS_PER_COLUMN * d_head)``."""
    return sample.tokens if sample.tokens is not None else max(DEFAULT_TOKENS, TOKENS_PER_COLUMN * meta.d_head)


def text_activations(ckpt: Checkpoint, model, mods, layers, tok, vocab: int, sample: SampleSpec, want: int,
                     dev, progress: Progress | None) -> ActivationRun:
    """The activation metrics of ``layers`` (canonical, in the order of their attention modules
    ``mods``) on windows of the sample text fed to ``model``."""
    meta = ckpt.meta
    text = sample.read().text
    context = model_context(model)
    # tokenise only as much text as the sample needs (with margin), all of it if that falls short
    n_draw = want + min(context, MAX_WINDOW)                             # SampledIds only
    ids, how = token_stream(text[: want * 16], tok, vocab, n_draw)
    if ids.numel() < want and len(text) > want * 16:
        ids, how = token_stream(text, tok, vocab, n_draw)
    if ids.numel() < 2:
        raise NoForwardPass(f"the sample text gave {ids.numel()} tokens")
    windows = sample_windows(ids, context=context, n_tokens=want)        # [B, T]
    n_win, t = windows.shape
    rope = meta.positions not in ("learned", "none")
    reason = (f"positions are {meta.positions}: logits of the un-rotated q and k are not the "
              "model's logits") if rope else plus_reason(meta)
    accs = [ActivationAccumulator(layer, meta.layer_meta(layer.layer), logits=reason is None,
                                  logits_reason=reason, device=dev) for layer in layers]

    frame, notes = feed(model, mods, accs, windows, t, dev, progress, "windows")
    fed = n_win * t
    if fed < want:
        add_activation_note(notes, f"the sample text holds {ids.numel()} tokens: {fed} fed in {n_win} windows "
                                   f"of {t}, fewer than the {want} asked for")
    if isinstance(tok, CharVocabulary) and tok.dropped:
        add_activation_note(notes, f"{tok.dropped} characters of the text are not in the {tok.how} vocabulary "
                                   "and were left out")
    if isinstance(tok, SampledIds):
        add_activation_note(notes, f"inputs are token ids drawn uniformly from the vocabulary of {vocab}, "
                                   f"not the text: {tok.reason}")
    info = {**sample.key(), "n_tokens": fed, "windows": n_win, "window": t, "tokenizer": how}
    return ActivationRun(frame[RESULT_COLUMNS], notes, info)


def plus_reason(meta) -> str | None:
    """Why q k^T is not the model's logit for paper B's "+" variants (None for the others)."""
    if meta.variant in PLUS:
        return ("a '+' variant adds a 2D positional correction to q k^T (scores * sum(w) + P w + b): "
                "logits of q and k alone are not the model's logits")
    return None


def image_activations(ckpt: Checkpoint, model, mods, sample: SampleSpec, want: int, dev,
                      progress: Progress | None) -> ActivationRun:
    """The activation metrics of a vision model: validation images of ``sample.images`` (else
    the dataset the run trained on, else ``digits``) as windows, each image's patches plus its
    class token as the tokens (``block_size`` per image); as many images as ``want`` tokens need."""
    meta = ckpt.meta
    run = (meta.config or {}).get("run") or {}
    dataset = sample.images or run.get("dataset") or "digits"
    try:
        data = load_images(dataset)
    except QkvscopeError as exc:
        if sample.images:                       # the user's own --images: their error to see
            raise
        raise NoForwardPass(f"the images this run trained on cannot be read ({exc}); give --images") from None
    cfg = model.cfg
    if (data.image_size, data.channels) != (cfg.image_size, cfg.channels):
        raise NoForwardPass(f"{dataset}: images of {data.image_size}x{data.image_size}x{data.channels} do not fit "
                            f"this model ({cfg.image_size}x{cfg.image_size}x{cfg.channels})")
    t = int(cfg.block_size)
    n_img = min(len(data.val_y), -(-want // t))
    images = data.val_x[:n_img]                                          # [N, C, H, W]
    reason = plus_reason(meta)
    accs = [ActivationAccumulator(layer, meta, logits=reason is None, logits_reason=reason, device=dev)
            for layer in ckpt.layers()]

    frame, notes = feed(model, mods, accs, images, t, dev, progress, "images")
    said = f"inputs: {n_img} validation images of {dataset}, {t} tokens each (patches and the class token)"
    return _image_run(frame, notes, sample, dataset, said, n_img, t, want, len(data.val_y))


def _image_run(frame, notes, sample: SampleSpec, dataset: str, said: str, n_img: int, t: int, want: int,
               n_val: int) -> ActivationRun:
    """The run of ``n_img`` images of ``t`` tokens: ``said`` (what the inputs were, and whether they
    fall short of ``want`` tokens) noted on every activation metric, the sample's counts."""
    fed = n_img * t
    if fed < want:
        said += f", fewer than the {want} tokens asked for (the validation split holds {n_val} images)"
    add_activation_note(notes, said)
    info = {**sample.key(), "images": dataset, "n_tokens": fed, "windows": n_img, "window": t,
            "tokenizer": "image patches"}
    return ActivationRun(frame[RESULT_COLUMNS], notes, info)


def hf_tower_activations(ckpt: Checkpoint, towers, tok, vocab: int, sample: SampleSpec, dev,
                         progress: Progress | None) -> ActivationRun:
    """The activation metrics of a Hugging Face vision model, tower by tower
    (``experiments.runnable.hf_towers``): an image stack on images (``hf_image_activations``), a text tower on windows of the text
    (``text_activations``), each with its own token count (``wanted`` of its ``d_head``).
    Two towers: the rows joined, each note prefixed by its tower, ``sample["towers"]`` per tower."""
    meta = ckpt.meta
    runs = []
    for name, module, inputs in towers:
        layers = tower_layers(meta, name)
        mods = stack_modules(module)
        if len(mods) != len(layers):
            where = f"the {name} tower" if name else "the model"
            raise NoForwardPass(f"{ckpt.path}: found {len(mods)} attention modules in {where}, "
                                f"expected {len(layers)} (one per layer)")
        canon = [ckpt.layer(i) for i in layers]
        want = wanted(sample, meta.layer_meta(layers[0]))
        if inputs == "images":
            run = hf_image_activations(ckpt, module, mods, canon, sample, want, dev, progress)
        else:
            own = getattr(getattr(module, "config", None), "vocab_size", None)     # the text tower's own
            run = text_activations(ckpt, module, mods, canon, tok, int(own or vocab), sample, want, dev, progress)
        runs.append((name, run))
    if len(runs) == 1:
        return runs[0][1]
    frame = pd.concat([r.frame for _, r in runs], ignore_index=True)
    notes: dict[str, str] = {}
    for name, run in runs:
        for metric, text in run.notes.items():
            said = f"{name} tower: {text}"
            notes[metric] = f"{notes[metric]}; {said}" if metric in notes else said
    info = {**runs[0][1].sample, "towers": {name: run.sample for name, run in runs}}
    return ActivationRun(frame[RESULT_COLUMNS], notes, info)


class _Probed(Exception):
    """Raised by the probe's hook once it has seen the first layer's input."""


def tokens_per_image(model, first: torch.nn.Module, size: int, channels: int, dev, path: str) -> int:
    """Tokens one ``[1, channels, size, size]`` image becomes at the first attention module
    (patches plus the class, distillation or register tokens), from one probe forward that
    stops there."""
    seen: list[int] = []

    def hook(module, args, kwargs):
        x = args[0] if args else kwargs.get("hidden_states")
        seen.append(int(x.shape[1]))                                     # x: [1, T, d_model]
        raise _Probed

    handle = first.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.inference_mode():
            model.to(dev)(torch.zeros(1, channels, size, size, device=dev))
    except _Probed:
        pass
    except (RuntimeError, ValueError, TypeError) as exc:
        raise NoForwardPass(f"{path}: transformers cannot run this model on {size}x{size}x{channels} images "
                            f"({exc}); weight-level metrics only") from exc
    finally:
        handle.remove()
    if not seen:
        raise NoForwardPass(f"{path}: the model ran without reaching its first attention layer")
    return seen[0]


def hf_image_activations(ckpt: Checkpoint, model, mods, layers, sample: SampleSpec, want: int, dev,
                         progress: Progress | None) -> ActivationRun:
    """The activation metrics of a Hugging Face image stack (``experiments.runnable.hf_towers``):
    validation images of ``sample.images`` (else scikit-learn's ``digits``), standardised per
    channel (``experiments.vision.load_images``), resized to the model's ``image_size`` and
    ``num_channels`` (``analysis.captures.fit_images``), each image's tokens (patches and the
    class/register tokens, counted by ``tokens_per_image``) one window; as many images as
    ``want`` tokens need."""
    meta = ckpt.meta
    conf = getattr(model, "config", None)
    size = getattr(conf, "image_size", 224)
    size = int(size[0] if isinstance(size, (list, tuple)) else size)
    channels = int(getattr(conf, "num_channels", 3) or 3)
    dataset = sample.images or "digits"
    data = load_images(dataset)                    # the user's own --images: their error to see
    if not fits(data.channels, channels):
        raise NoForwardPass(f"{dataset}: images of {data.channels} channels do not fit this model "
                            f"({channels} channels)")
    t = tokens_per_image(model, mods[0], size, channels, dev, ckpt.path)
    n_img = min(len(data.val_y), -(-want // t))
    images = fit_images(data.val_x[:n_img], size, channels)             # [N, C, S, S]
    reason = plus_reason(meta)
    accs = [ActivationAccumulator(layer, meta.layer_meta(layer.layer), logits=reason is None,
                                  logits_reason=reason, device=dev) for layer in layers]

    frame, notes = feed(model, mods, accs, images, t, dev, progress, "images")
    side, c = data.image_size, data.channels
    patch = getattr(conf, "patch_size", None)
    patches = (size // int(patch[0] if isinstance(patch, (list, tuple)) else patch)) ** 2 if patch else None
    extra = t - patches if patches is not None else 0
    what = (f"{patches} patches" + (f" and {extra} class/distillation/register token{'s' * (extra > 1)}"
                                    if extra > 0 else "")
            if patches is not None and extra >= 0 else "patches")
    said = (f"inputs: {n_img} validation images of {dataset} ({side}x{side}x{c}, standardised per channel, "
            f"resized to {size}x{size}x{channels}), {t} tokens each ({what})")
    return _image_run(frame, notes, sample, dataset, said, n_img, t, want, len(data.val_y))
