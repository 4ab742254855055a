"""What would sharing cost this model? A trained checkpoint converted (``analysis.conversion``) and
its loss measured before and after, layer by layer, optionally healed by a little training.

Runs on every checkpoint ``experiments.runnable.load_runnable`` builds as this project's GPT: its
own variants, nanoGPT and its forks, llama2.c / Meta Llama and the papers' models
(``experiments.foreign``). Each converted layer becomes an ``experiments.model.Attention`` of the
target variant and head count (a K=V layer really caches one tensor, a GQA layer really has
fewer kv heads), so the converted model is the model that would be served.

The sample: the text (``SampleSpec``; the bundled corpus by default) cut into windows of the
model's context (at most ``MAX_WINDOW``), ``2 * tokens`` tokens (at least two windows) spread
over it; the windows alternate between the *evaluation* set (loss of every model, ``tokens``
tokens) and the *fit* set (the captured layer inputs the activation-aware methods fit on, and the
healing batches), so no conversion is scored on the tokens it was fitted to.

Images (``images``: this project's ViT, a Hugging Face ViT classifier; ``image_sample``): the
validation split is evaluated, the training split fitted on; loss is the classification
cross-entropy per image, ``ppl = exp(loss)``, intervals over images, and ``notes["accuracy"]``
the top-1 accuracy of every evaluated model with its t interval over images.

Loss: mean next-token cross-entropy (nats) over the evaluation windows; ``ppl = exp(loss)``;
``ci_low``/``ci_high``: the 95% interval of the perplexity: the t interval over windows
(``analysis.intervals.mean_interval`` on the per-window mean losses), then exp.
KV bytes per token: ``analysis.variants.kv_bytes_per_token`` per layer (its tie and kv heads:
the checkpoint's variant for an original layer, the tensors' ties for a converted one; a latent
layer caches ``rank`` numbers), at the checkpoint's dtype. Attention parameters: each layer's
projections and biases, a tied tensor once (a latent layer: its down- and up-projection in place
of W_K and W_V).

Hugging Face causal LMs (GPT-2, GPT-NeoX, Llama-style: Llama, Mistral, Qwen2, Gemma) and ViT image
classifiers (``--images``) are converted in place (``experiments.hf_surgery``):
the same function as the converted model, costed from the canonical layers; they are not healed
or saved.

``--layers greedy``: layers are converted one at a time; at each step every remaining layer is
tried and the one whose conversion gives the lowest loss on a proxy (the first
``PROXY_FRACTION`` of the evaluation windows, at least one) is kept; the curve is the full
evaluation after each step. Conversions are fitted on the original model's layer inputs.
"""
from __future__ import annotations

import copy
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from analysis import conversion as conv
from analysis.conversion_targets import DEFAULT_METHOD, METHODS, TARGETS
from analysis import head_grouping
from analysis.captures import MAX_WINDOW, sample_windows
from analysis.intervals import mean_interval
from analysis.variants import KV_TIED, PLUS, Q_DROPPED, Q_TIED, base, kv_bytes_per_token
from analysis.weights import default_device
from experiments.activation_runs import SampleSpec, token_stream, wanted
from experiments import hf_surgery
from experiments.model import GPT, MLP, Attention
from experiments.vision import ViT
from experiments.runnable import FOREIGN, NoForwardPass, hf_model, load_runnable, model_context
from loaders.canonical import AttentionWeights, Checkpoint, dtype_bytes
from loaders.errors import QkvscopeError

#: Share of the evaluation windows the greedy order is chosen on.
PROXY_FRACTION = 0.25
#: Healing: AdamW learning rate and windows per step.
HEAL_LR = 3e-4
HEAL_BATCH = 8
#: Seed of the healing batches' draw.
SEED = 0


class WhatIfError(QkvscopeError):
    """A conversion this checkpoint cannot take, or an option that does not parse (the CLI shows
    it as one line after the checkpoint's path)."""


# -- the project's Attention <-> canonical -----------------------------------------------
#: The ``Attention`` tensor that computes the key, per base variant (``experiments.config.PROJECTIONS``).
_KEY_TENSOR = {"qkv": "k", "wq_identity": "k", "q_eq_k": "qk", "k_eq_v": "kv", "q_eq_k_eq_v": "qkv"}


def _shallow(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module`` sharing its parameters but with its own table of children, so that
    replacing a child of the copy leaves the original as it was."""
    c = copy.copy(module)
    c._modules = dict(module._modules)
    return c


def layer_of(attn: Attention, i: int) -> AttentionWeights:
    """Canonical weights of one ``experiments.model.Attention`` (tied tensors repeated, W_Q None
    for ``wq_identity``): ``W_K[g] = k.weight.view(G, dh, d)[g].T``."""
    cfg = attn.cfg
    d, dh, H, G = cfg.d_model, cfg.d_head, cfg.n_head, cfg.n_kv_heads

    def heads(lin, n):
        w = lin.weight.detach().view(n, dh, d).transpose(1, 2)               # [n, d, dh]
        b = None if lin.bias is None else lin.bias.detach().view(n, dh)
        return w, b

    v = base(cfg.variant)
    wk, bk = heads(getattr(attn, _KEY_TENSOR[v]), G)
    wv, bv = (wk, bk) if v in KV_TIED else heads(attn.v, G)
    if v == "wq_identity":
        wq, bq = None, None
    elif v in Q_TIED:
        wq, bq = wk.repeat_interleave(H // G, 0), None if bk is None else bk.repeat_interleave(H // G, 0)
    else:
        wq, bq = heads(attn.q, H)
    wo = attn.o.weight.detach().T.reshape(H, dh, d)                           # [H, dh, d]
    bo = None if attn.o.bias is None else attn.o.bias.detach()
    return AttentionWeights(i, wq, wk, wv, wo, bq, bk, bv, bo)


def variant_of(layer: AttentionWeights, was: str) -> str:
    """The variant a converted layer's tensors hold (``was``: the source's, for its "+" correction)."""
    per = layer.W_O.shape[0] // layer.W_K.shape[0]
    kv = torch.equal(layer.W_K, layer.W_V)
    if layer.W_Q is None:
        if kv:
            raise conv.ConversionError("no variant has W_Q = I and K = V")
        return "wq_identity"
    q = torch.equal(layer.W_Q, layer.W_K.repeat_interleave(per, 0))
    name = {(True, True): "q_eq_k_eq_v", (True, False): "q_eq_k", (False, True): "k_eq_v",
            (False, False): "qkv"}[(q, kv)]
    if was in PLUS:
        plus = f"{name}_plus"
        if plus not in PLUS:
            raise conv.ConversionError(f"a {was} layer has no {name} variant with the 2D score correction")
        return plus
    return name


def attention_of(layer: AttentionWeights, old: Attention) -> Attention:
    """A new ``Attention`` holding ``layer`` (its variant from the tensors, its kv heads from W_K)."""
    cfg = copy.copy(old.cfg)
    cfg.variant = variant_of(layer, old.cfg.variant)
    cfg.n_kv_heads = int(layer.W_K.shape[0])
    H, G, dh, d = cfg.n_head, cfg.n_kv_heads, cfg.d_head, cfg.d_model
    new = Attention(cfg).to(device=old.o.weight.device, dtype=old.o.weight.dtype)

    def put(lin, w, b):
        lin.weight.copy_(w.transpose(1, 2).reshape(-1, d))
        if lin.bias is not None:
            lin.bias.copy_(torch.zeros(lin.bias.shape) if b is None else b.reshape(-1))

    with torch.no_grad():
        v = base(cfg.variant)
        if v not in Q_DROPPED:                       # a W_Q of its own
            put(new.q, layer.W_Q, layer.b_Q)
        put(getattr(new, _KEY_TENSOR[v]), layer.W_K, layer.b_K)
        if v not in KV_TIED:                         # a W_V of its own
            put(new.v, layer.W_V, layer.b_V)
        new.o.weight.copy_(layer.W_O.reshape(H * dh, d).T)
        if new.o.bias is not None and layer.b_O is not None:
            new.o.bias.copy_(layer.b_O)
        for name in ("pos_w", "pos_b"):
            if hasattr(old, name):
                getattr(new, name).copy_(getattr(old, name))
    return new


# -- W_Q = I: a change of basis of the whole model -----------------------------------------
#: The linear maps of an MLP that read the normalised stream and the one that writes it, by block type.
_MLP_MAPS = {"MLP": (("fc",), "proj"), "SwiGLU": (("gate", "up"), "down")}


@dataclass
class QueryFree:
    """``query_free``'s result: the model in the new residual basis (every layer its old function),
    each layer there (``exact``) and query-free (``free``), and what the conversion drops."""

    model: GPT
    exact: list[AttentionWeights]
    free: list[AttentionWeights]
    notes: dict


def query_free(model: GPT, *, rotary: bool) -> QueryFree:
    """``model`` moved to the residual basis of ``analysis.conversion.query_basis`` (module docstring
    of ``analysis.conversion``, ``wq_identity``). Norm gains are folded into the readers (the new
    norms have gain 1); with LayerNorm the writers are centred; the output head gets its own copy
    (no longer tied to the embedding, whose rows now live in the new basis); the final norm's bias
    ``b_f`` becomes ``b_f diag(1/g_f) M`` (a zero gain leaves that coordinate's bias out)."""
    cfg = model.cfg
    v = base(cfg.variant)
    if v == "wq_identity":
        raise WhatIfError("--to wq_identity: the checkpoint is query-free already")
    if v in KV_TIED or cfg.variant in PLUS:
        raise WhatIfError(f"--to wq_identity: no query-free variant keeps this {cfg.variant} layer's ties "
                          "(query-free layers have their own K and V and no 2D score correction)")
    kinds = {type(b.mlp).__name__ for b in model.blocks}
    if not kinds <= set(_MLP_MAPS):
        raise WhatIfError(f"--to wq_identity: unknown MLP block {sorted(kinds - set(_MLP_MAPS))[0]}")

    def norm_params(n):
        w = getattr(n, "weight", None)
        b = getattr(n, "bias", None)
        return (None if w is None else w.detach().double().cpu()), (None if b is None else b.detach().double().cpu())

    layers = [layer_of(b.attn, i) for i, b in enumerate(model.blocks)]
    layers = [AttentionWeights(l.layer, *(None if t is None else t.double().cpu() for t in (
        l.W_Q, l.W_K, l.W_V, l.W_O, l.b_Q, l.b_K, l.b_V, l.b_O))) for l in layers]
    gains = [norm_params(b.ln_1) for b in model.blocks]
    try:
        stacks = [torch.diag(g if g is not None else torch.ones(cfg.d_model, dtype=torch.float64))
                  @ conv.stacked_query(l) for l, (g, _) in zip(layers, gains)]
        m, minv = conv.query_basis(stacks, cfg.norm)
    except conv.ConversionError as exc:
        raise WhatIfError(str(exc)) from None
    d = cfg.d_model
    writer = m if cfg.norm != "layernorm" else (torch.eye(d, dtype=torch.float64) - 1.0 / d) @ m
    has_bias = cfg.norm == "layernorm" and getattr(model.blocks[0].ln_1, "bias", None) is not None
    folds = [conv.fold_query(l, minv, writer, g, b, norm_bias=has_bias, rotary=rotary)
             for l, (g, b) in zip(layers, gains)]

    new = copy.deepcopy(model).cpu()
    new.cfg = copy.copy(cfg)
    new.cfg.tie_embeddings = False
    dev_dtype = model.lm_head.weight.dtype

    def put(param, value):
        with torch.no_grad():
            param.copy_(value.to(param.dtype))

    def reset_norm(n, b=None):
        if getattr(n, "weight", None) is not None:
            put(n.weight, torch.ones(d))
        if getattr(n, "bias", None) is not None:
            put(n.bias, torch.zeros(d) if b is None else b)

    def reads(lin, g, b):                        # y = n(x) diag(g) W + b W + c  ->  z M^-1 diag(g) W ...
        w = lin.weight.detach().double().cpu().T                                   # [d, out]
        if lin.bias is not None and b is not None:
            put(lin.bias, lin.bias.detach().double().cpu() + b @ w)
        put(lin.weight, (minv @ torch.diag(g if g is not None else torch.ones(d, dtype=torch.float64)) @ w).T)

    def writes(lin):
        put(lin.weight, (lin.weight.detach().double().cpu().T @ writer).T)
        if lin.bias is not None:
            put(lin.bias, lin.bias.detach().double().cpu() @ writer)

    with torch.no_grad():
        new.wte.weight = torch.nn.Parameter((model.wte.weight.detach().double().cpu() @ writer).to(dev_dtype))
        if hasattr(new, "wpe"):
            put(new.wpe.weight, model.wpe.weight.detach().double().cpu() @ writer)
        for blk, fold in zip(new.blocks, folds):
            g2, b2 = norm_params(blk.ln_2)
            readers, out = _MLP_MAPS[type(blk.mlp).__name__]
            for name in readers:
                reads(getattr(blk.mlp, name), g2, b2)
            writes(getattr(blk.mlp, out))
            reset_norm(blk.ln_1, fold.norm_bias)
            reset_norm(blk.ln_2)
            blk.attn = attention_of(fold.exact, blk.attn)
        gf, bf = norm_params(model.ln_f)
        lm = model.lm_head.weight.detach().double().cpu().T                          # [d, vocab]
        gain_f = torch.diag(gf if gf is not None else torch.ones(d, dtype=torch.float64))
        new.lm_head.weight = torch.nn.Parameter((minv @ gain_f @ lm).T.to(dev_dtype).contiguous())
        fbias = None
        if bf is not None:
            inv = torch.where(gf != 0, 1.0 / gf.where(gf != 0, torch.ones_like(gf)), torch.zeros_like(gf))
            fbias = (bf * inv) @ m
        reset_norm(new.ln_f, fbias)
    new = new.to(model.lm_head.weight.device).eval()
    how = {"none": "M = mean of the layers' stacked W_Q (no norm: any invertible M passes)",
           "rmsnorm": "M = orthogonal polar factor of the layers' stacked W_Q (RMSNorm gains folded)",
           "layernorm": "M = orthogonal polar factor of the layers' stacked W_Q mapping 1 to +-1 "
                        "(LayerNorm gains folded, writers centred)"}[cfg.norm]
    notes = {"basis": how,
             "off_block": [round(f.off_block, 6) for f in folds],
             "remainder": [round(f.remainder, 6) for f in folds],
             "meaning": "per layer: off_block = ||R - blockdiag(B)||_F / ||R||_F of the query factor "
                        "R = M^-1 diag(g) A left after the basis change (0: exact); remainder = "
                        "||R/c - I||_F / sqrt(d), c = tr(R)/d (R's distance from a scaled identity)"}
    if any(f.dropped_bias > 0 for f in folds):
        notes["dropped_query_bias"] = [round(f.dropped_bias, 6) for f in folds]
    return QueryFree(new, [layer_of(b.attn, i) for i, b in enumerate(new.blocks)], [f.free for f in folds], notes)


# -- the sample ----------------------------------------------------------------------------
@dataclass
class Sample:
    eval: torch.Tensor            # [B, T] token ids (images: [B, C, H, W]): every loss
    fit: torch.Tensor             # [B', T] (images: [B', C, H, W]): the fitted methods' inputs, the healing batches
    info: dict = field(default_factory=dict)
    eval_y: torch.Tensor | None = None     # images: the class labels [B], [B']
    fit_y: torch.Tensor | None = None


def image_sample(model, dataset: str, want: int) -> Sample:
    """``dataset`` (``experiments.vision.load_images``: ``digits`` or a path) for an image model:
    evaluation = the validation split, fit = the training split, each at most ``want // tokens per
    image`` images (at least 16); images resized (bilinear) and their channels repeated to what the
    model reads."""
    from experiments.vision import load_images       # here: scikit-learn's digits load only for --images

    size, channels, classes, tokens = _image_geometry(model)
    data = load_images(dataset)
    if data.n_classes > classes:
        raise WhatIfError(f"--images {dataset}: {data.n_classes} classes, but the model tells {classes} apart")
    n = max(16, want // tokens)

    def fit_to_model(x):
        if x.shape[-1] != size or x.shape[-2] != size:
            x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
        if x.shape[1] != channels:
            if x.shape[1] != 1:
                raise WhatIfError(f"--images {dataset}: {x.shape[1]} channels, the model reads {channels}")
            x = x.repeat(1, channels, 1, 1)
        return x.contiguous()

    ev, fit = fit_to_model(data.val_x[:n]), fit_to_model(data.train_x[:n])
    info = {"images": dataset, "n_tokens": int(ev.shape[0] * tokens), "windows": int(ev.shape[0]),
            "window": int(tokens), "fit_tokens": int(fit.shape[0] * tokens), "n_images": int(ev.shape[0]),
            "fit_images": int(fit.shape[0]), "image_size": size, "channels": channels,
            "resized_from": None if data.image_size == size else data.image_size, "dataset": data.info}
    return Sample(ev, fit, info, data.val_y[:n], data.train_y[:n])


def _image_geometry(model) -> tuple[int, int, int, int]:
    """``(image side, channels, classes, tokens per image)`` of this project's ViT or a Hugging Face
    image classifier (ViT: ``(side / patch)^2 + 1`` tokens)."""
    c = model.cfg if isinstance(model, ViT) else model.config
    if isinstance(model, ViT):
        return c.image_size, c.channels, c.n_classes, c.block_size
    size = c.image_size if isinstance(c.image_size, int) else c.image_size[0]
    patch = c.patch_size if isinstance(c.patch_size, int) else c.patch_size[0]
    return int(size), int(c.num_channels), int(c.num_labels), (size // patch) ** 2 + 1


def text_sample(model, tok, vocab: int, sample: SampleSpec, want: int) -> Sample:
    """Windows of the sample text alternating between evaluation and fit (module docstring)."""
    text = sample.read().text
    context = min(model_context(model), MAX_WINDOW)
    ids, how = token_stream(text[: want * 32], tok, vocab, 2 * want + 2 * context)
    if ids.numel() < 2 * want and len(text) > want * 32:
        ids, how = token_stream(text, tok, vocab, 2 * want + 2 * context)
    if ids.numel() < 4:
        raise NoForwardPass(f"the sample text gave {ids.numel()} tokens")
    # one extra position per window: inputs [:-1], targets [1:]; at least one window to evaluate, one to fit
    windows = sample_windows(ids, context=context + 1, n_tokens=max(2 * want, 2 * (context + 1)))
    if windows.shape[0] < 2:
        raise NoForwardPass(f"the sample text gave {ids.numel()} tokens: fewer than two windows of {windows.shape[1]}")
    ev, fit = windows[0::2], windows[1::2]
    info = {**sample.key(), "n_tokens": int(ev.shape[0] * (ev.shape[1] - 1)), "windows": int(ev.shape[0]),
            "window": int(ev.shape[1] - 1), "fit_tokens": int(fit.shape[0] * (fit.shape[1] - 1)), "tokenizer": how}
    return Sample(ev, fit, info)


def _logits(out) -> torch.Tensor:
    """The logits of a forward's output: this project's GPT returns ``(logits, loss)``,
    a Hugging Face causal LM an output with ``.logits``."""
    return out[0] if isinstance(out, tuple) else out.logits


def window_losses(model, windows: torch.Tensor, dev) -> np.ndarray:
    """Mean next-token cross-entropy of each window ``[B, T+1]`` (nats), float64."""
    out = []
    per = max(1, 4096 // windows.shape[1])
    with torch.inference_mode():
        for lo in range(0, windows.shape[0], per):
            w = windows[lo:lo + per].to(dev)
            logits = _logits(model(w[:, :-1]))                               # [b, T, vocab]
            ce = F.cross_entropy(logits.transpose(1, 2).float(), w[:, 1:], reduction="none")  # [b, T]
            out.append(ce.mean(1).double().cpu())
    return torch.cat(out).numpy()


def image_losses(model, images: torch.Tensor, labels: torch.Tensor, dev) -> tuple[np.ndarray, np.ndarray]:
    """Each image's classification cross-entropy (nats) and whether its top class is right."""
    ce, right = [], []
    with torch.inference_mode():
        for lo in range(0, images.shape[0], 64):
            logits = _logits(model(images[lo:lo + 64].to(dev))).float()               # [b, classes]
            y = labels[lo:lo + 64].to(dev)
            ce.append(F.cross_entropy(logits, y, reduction="none").double().cpu())
            right.append((logits.argmax(-1) == y).double().cpu())
    return torch.cat(ce).numpy(), torch.cat(right).numpy()


def scored(losses: np.ndarray) -> dict:
    """``loss, ppl, ci_low, ci_high`` of per-window losses (module docstring)."""
    loss = float(losses.mean())
    lo, hi = mean_interval(losses)
    return {"loss": loss, "ppl": math.exp(loss), "ci_low": None if lo is None else math.exp(lo),
            "ci_high": None if hi is None else math.exp(hi)}


def captured_stats(model, mods, windows: torch.Tensor, dev, *, images: bool = False) -> list[conv.InputStats]:
    """Each layer's ``InputStats`` (the input of its attention module ``mods[i]``, after the norm)
    over ``windows`` (token windows, their last position only a target; ``images``: image batches)."""
    gram: dict[int, torch.Tensor] = {}
    total: dict[int, torch.Tensor] = {}
    n: dict[int, int] = {}

    def hook_for(i):
        def hook(module, args, kwargs):
            x = (args[0] if args else kwargs["hidden_states"]).detach()
            x = x.reshape(-1, x.shape[-1]).double().cpu()
            gram[i] = gram.get(i, 0) + x.T @ x
            total[i] = total.get(i, 0) + x.sum(0)
            n[i] = n.get(i, 0) + x.shape[0]
        return hook

    handles = [m.register_forward_pre_hook(hook_for(i), with_kwargs=True) for i, m in enumerate(mods)]
    try:
        with torch.inference_mode():
            for lo in range(0, windows.shape[0], 8):
                model((windows[lo:lo + 8] if images else windows[lo:lo + 8, :-1]).to(dev))
    finally:
        for h in handles:
            h.remove()
    return [conv.InputStats(gram[i] / n[i], total[i] / n[i], n[i]) for i in range(len(mods))]


# -- costs ---------------------------------------------------------------------------------
def layer_cost(layer: AttentionWeights, rank: int | None, per_elem: int,
               variant: str | None = None) -> tuple[float, int]:
    """``(KV bytes per token, attention parameters)`` of one canonical layer: the calculator's
    bytes for its tie and kv heads (``rank`` elements for a latent layer), and its projections
    and biases with a tied tensor once (a latent layer: down- and up-projection for W_K, W_V).
    The ties are ``variant``'s (an original layer: what the checkpoint stores and caches), else
    what the tensors show (a converted layer)."""
    g, d, dh = layer.W_K.shape
    per = layer.W_O.shape[0] // g
    if variant is not None:
        kv_tied, q_tied = variant in KV_TIED, variant in Q_TIED
    else:
        kv_tied = torch.equal(layer.W_K, layer.W_V)
        q_tied = layer.W_Q is not None and torch.equal(layer.W_Q, layer.W_K.repeat_interleave(per, 0))
    size = lambda t: 0 if t is None else t.numel()  # noqa: E731
    params = size(layer.W_O) + size(layer.b_O) + size(layer.W_K) + size(layer.b_K)
    params += 0 if kv_tied else size(layer.W_V) + size(layer.b_V)
    params += 0 if q_tied else size(layer.W_Q) + size(layer.b_Q)
    if rank is not None:
        params += d * rank + rank * 2 * g * dh - 2 * g * d * dh
        return float(rank * per_elem), params
    return kv_bytes_per_token("k_eq_v" if kv_tied else "qkv", 1, g, dh, per_elem), params


# -- the run -------------------------------------------------------------------------------
#: ``--grouping``: which kv heads ``gqa:G`` pools (``Target.grouping``).
GROUPINGS = ("contiguous", "best")


@dataclass
class Target:
    """``--to`` parsed: ``k_eq_v``, ``q_eq_k``, ``q_eq_k_eq_v``, ``wq_identity``, ``gqa:G``, ``mqa``,
    ``latent:R``."""

    name: str
    method: str
    groups: int | None = None
    rank: int | None = None
    #: ``gqa:G``'s kv heads pooled: ``contiguous`` runs (``analysis.conversion.gqa``'s default) or
    #: ``best``: per layer the free grouping of least mean-pool residual of W_K (``analysis.head_grouping``).
    grouping: str = "contiguous"

    @classmethod
    def parse(cls, text: str, method: str | None) -> "Target":
        name, _, arg = text.partition(":")
        if name not in TARGETS:
            raise WhatIfError(f"--to {text}: expected one of k_eq_v, q_eq_k, q_eq_k_eq_v, wq_identity, gqa:G, mqa, "
                              "latent:R")
        if name in ("gqa", "latent") and not arg.isdigit():
            raise WhatIfError(f"--to {text}: expected {name}:N with N a positive integer")
        if name not in ("gqa", "latent") and arg:
            raise WhatIfError(f"--to {text}: {name} takes no ':' argument")
        method = method or DEFAULT_METHOD[name]
        if method not in METHODS[name]:
            raise WhatIfError(f"--method {method}: {name} takes one of {', '.join(METHODS[name])}")
        return cls(name, method, int(arg) if name == "gqa" else None, int(arg) if name == "latent" else None)

    def __str__(self) -> str:
        return f"{self.name}:{self.groups or self.rank}" if (self.groups or self.rank) else self.name


class Surgery:
    """The original model and its converted layers; ``model(layers)`` is the model with exactly
    ``layers`` converted (the others original). This project's GPT gets new ``Attention`` modules
    (in a shallow copy); a Hugging Face model has its tensors rewritten in place
    (``experiments.hf_surgery``), so only one ``model(...)`` exists at a time."""

    def __init__(self, model, target: Target, stats: list[conv.InputStats], *, rotary: bool, variant: str):
        self.original = model
        self.variant = variant                           # the checkpoint's own (its original layers' ties)
        self.target = target
        self.hf = not isinstance(model, (GPT, ViT))
        if self.hf:
            self.mods = hf_surgery.modules(model)
            self.geom = hf_surgery.geometry(model)
            self.before = [hf_surgery.read(m, i, self.geom) for i, m in enumerate(self.mods)]
        else:
            self.mods = [b.attn for b in model.blocks]
            self.before = [layer_of(m, i) for i, m in enumerate(self.mods)]
        self.after: dict[int, AttentionWeights] = {}     # layer -> its converted canonical weights
        self.modules: dict[int, Attention] = {}          # layer -> its converted module (GPT)
        self.notes: dict = {}
        if target.name == "wq_identity":
            if not isinstance(model, GPT):
                raise WhatIfError("--to wq_identity converts this project's GPT language models (it moves the "
                                  "whole residual stream, embedding to output head), not a ViT or a Hugging Face model")
            qf = query_free(model, rotary=rotary)
            self.original, self.before, self.notes = qf.model, qf.exact, qf.notes
            self.mods = [b.attn for b in qf.model.blocks]
            for i, layer in enumerate(qf.free):
                self.after[i] = layer
                self.modules[i] = attention_of(layer, self.mods[i])
            return
        try:
            for i, layer in enumerate(self.before):
                self.after[i] = conv.convert(layer, target.name, target.method, stats[i], groups=target.groups,
                                             rank=target.rank, rotary=rotary, grouping=self._grouping(i, layer))
                if not self.hf:
                    self.modules[i] = attention_of(self.after[i], self.mods[i])
        except conv.ConversionError as exc:
            raise WhatIfError(str(exc)) from None

    def _grouping(self, i: int, layer: AttentionWeights):
        """``gqa:G``'s groups of kv heads for layer ``i`` where ``--grouping best`` (kept in
        ``notes["grouping"]``), else None (contiguous)."""
        if self.target.name != "gqa" or self.target.grouping != "best":
            return None
        n = layer.W_K.shape[0]
        if self.target.groups < 1 or n % self.target.groups:
            return None                                  # conv.gqa says why
        found = head_grouping.best_grouping(head_grouping.frobenius_gram(layer.W_K), self.target.groups)
        self.notes.setdefault("layers", {})[i] = {"grouping": [list(g) for g in found.groups],
                                                  "pool_residual_k": found.cost, "exact": found.exact}
        return found.groups

    def model(self, layers):
        if self.hf:
            for i, m in enumerate(self.mods):
                hf_surgery.write(m, self.after[i] if i in layers else self.before[i], self.geom)
            return self.original
        m = _shallow(self.original)
        m.blocks = torch.nn.ModuleList(_shallow(b) for b in self.original.blocks)
        for i in layers:
            m.blocks[i].attn = self.modules[i]
        return m

    def cost(self, layers, per_elem: int) -> tuple[float, int]:
        """KV bytes per token and attention parameters with ``layers`` converted."""
        kv, params = 0.0, 0
        for i, layer in enumerate(self.before):
            done = i in layers
            k, p = (layer_cost(self.after[i], self.target.rank, per_elem) if done
                    else layer_cost(layer, None, per_elem, self.variant))
            kv, params = kv + k, params + p
        return kv, params


def parse_layers(text: str, n_layers: int) -> list[int] | str:
    """``all`` -> every layer, ``greedy``, or ``L,L,...`` (each in 0..n_layers-1, no repeats)."""
    if text in ("all", "greedy"):
        return list(range(n_layers)) if text == "all" else "greedy"
    try:
        got = [int(s) for s in text.split(",")]
    except ValueError:
        got = None
    if not got or any(not 0 <= i < n_layers for i in got) or len(set(got)) != len(got):
        raise WhatIfError(f"--layers {text}: expected all, greedy or distinct layer numbers 0..{n_layers - 1} "
                          f"separated by commas (the model has {n_layers} layers)")
    return got


def heal(model, teacher, fit: torch.Tensor, steps: int, how: str, dev, fit_y: torch.Tensor | None = None) -> GPT:
    """``model`` fine-tuned ``steps`` AdamW steps on batches of the fit windows: ``lm`` (next-token
    cross-entropy; images: the class cross-entropy on ``fit_y``) or ``distill`` (KL(teacher || model)
    of the output distributions, Hinton et al. 2015 at temperature 1). Tied tensors stay tied: a
    tied variant owns one parameter."""
    model = copy.deepcopy(model).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=HEAL_LR, weight_decay=0.0)
    gen = torch.Generator().manual_seed(SEED)
    for _ in range(steps):
        idx = torch.randint(0, fit.shape[0], (min(HEAL_BATCH, fit.shape[0]),), generator=gen)
        w = fit[idx].to(dev)
        x, y = (w, fit_y[idx].to(dev)) if fit_y is not None else (w[:, :-1], w[:, 1:])
        logits = _logits(model(x))
        if how == "lm":
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        else:
            with torch.no_grad():
                t_logits = _logits(teacher(x))
            loss = F.kl_div(F.log_softmax(logits, -1).reshape(-1, logits.shape[-1]),
                            F.log_softmax(t_logits, -1).reshape(-1, logits.shape[-1]),
                            log_target=True, reduction="batchmean")
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def _runnable(ckpt: Checkpoint, images: bool = False):
    """``(model, tokenizer, vocab_size)``: a Hugging Face folder as its causal LM (``images``: its
    image classifier) with the output head, anything else through ``load_runnable``; a model that is
    none of this project's GPT, a Hugging Face causal LM (``images``: this project's ViT, a Hugging
    Face ViT classifier) raises ``NoForwardPass``."""
    path = Path(ckpt.path)
    if path.is_dir() and (path / "config.json").is_file() and ckpt.meta.architecture not in FOREIGN:
        model, tok, vocab = hf_model(path, causal_lm=not images, image_classifier=images)
    else:
        model, tok, vocab = load_runnable(ckpt)
    if images:
        hf_vit = type(model).__name__.endswith("ForImageClassification") and hasattr(model.config, "patch_size")
        if isinstance(model, ViT) or (not isinstance(model, GPT) and hf_vit):
            return model, tok, vocab
        raise NoForwardPass(f"{ckpt.path}: --images converts image classifiers: this project's ViT and Hugging "
                            "Face ViT-style classifiers (config with image_size and patch_size)")
    if isinstance(model, GPT) and getattr(model.cfg, "task", "language") == "language":
        return model, tok, vocab
    if not isinstance(model, GPT) and hasattr(model, "get_output_embeddings") and model.get_output_embeddings() is not None:
        return model, tok, vocab
    raise NoForwardPass(f"{ckpt.path}: whatif converts language models: this project's GPT (its own variants, "
                        "nanoGPT, llama2.c, the papers' models) and Hugging Face causal LMs; "
                        "image classifiers with --images")


def whatif(ckpt: Checkpoint, *, to: str, method: str | None = None, layers: str = "all",
           sample: SampleSpec | None = None, heal_steps: int = 0, heal_how: str = "distill",
           out: str | None = None, device: str | None = None, images: str | None = None,
           grouping: str = "contiguous") -> dict:
    """The JSON of ``python -m app whatif`` (``app.commands.whatif``) for an opened checkpoint;
    ``images``: an image set (``digits`` or a path) for a vision model, whose ``loss`` is the mean
    classification cross-entropy per image, ``ppl = exp(loss)`` and the intervals over images, with
    the accuracy in ``notes["accuracy"]``. ``grouping``: ``gqa:G``'s kv heads pooled in contiguous
    runs (default) or ``best`` (``Target.grouping``; the groups and their mean-pool residual per
    layer in ``notes["grouping"]``)."""
    sample = sample or SampleSpec()
    target = Target.parse(to, method)
    if grouping not in GROUPINGS:
        raise WhatIfError(f"--grouping {grouping}: expected one of {', '.join(GROUPINGS)}")
    if grouping != "contiguous":
        if target.name != "gqa":
            raise WhatIfError(f"--grouping {grouping}: chooses which kv heads gqa:G pools, not {to}")
        target = Target(target.name, target.method, target.groups, target.rank, grouping)
    dev = torch.device(device or default_device())
    model, tok, vocab = _runnable(ckpt, images is not None)
    hf = not isinstance(model, (GPT, ViT))
    if isinstance(model, ViT) and out is not None:
        raise WhatIfError("--out writes this project's GPT language models; a ViT is converted and measured only")
    if hf and (heal_steps > 0 or out is not None):
        raise WhatIfError("--heal-steps and --out need a model built as this project's GPT (a Hugging Face "
                          "model is converted in place, its ties held in copies)")
    model = model.to(dev).eval()
    try:
        mods = hf_surgery.modules(model) if hf else [b.attn for b in model.blocks]
    except hf_surgery.Unsupported as exc:
        raise NoForwardPass(f"{ckpt.path}: {exc}") from None
    n = len(mods)
    chosen = parse_layers(layers, n)
    vision = images is not None
    smp = (image_sample(model, images, wanted(sample, ckpt.meta)) if vision
           else text_sample(model, tok, vocab, sample, wanted(sample, ckpt.meta)))
    per_elem = dtype_bytes(ckpt.meta.dtype)
    stats = captured_stats(model, mods, smp.fit, dev, images=vision)
    surgery = Surgery(model, target, stats, rotary=ckpt.meta.positions == "rotary", variant=base(ckpt.meta.variant))
    accuracy: dict = {}

    def losses(m, n_items: int | None = None, key: str | None = None) -> np.ndarray:
        """Per-item losses of ``m`` on the first ``n_items`` evaluation items; ``key``: keep the
        accuracy under that name (images)."""
        if not vision:
            return window_losses(m, smp.eval[:n_items], dev)
        ce, right = image_losses(m, smp.eval[:n_items], smp.eval_y[:n_items], dev)
        if key is not None:
            lo, hi = mean_interval(right)
            accuracy[key] = {"accuracy": float(right.mean()), "ci_low": lo, "ci_high": hi}
        return ce

    baseline = scored(losses(model, key="baseline"))
    kv0, p0 = surgery.cost([], per_elem)
    baseline.update(kv_bytes_per_token=kv0, attention_params=p0)

    def step(done: list[int]) -> dict:
        s = scored(losses(surgery.model(done), key=",".join(map(str, done))))
        kv, p = surgery.cost(done, per_elem)
        return {"layers": list(done), "loss": s["loss"], "ppl": s["ppl"],
                "delta_ppl_pct": 100.0 * (s["ppl"] / baseline["ppl"] - 1.0), "ci_low": s["ci_low"],
                "ci_high": s["ci_high"], "kv_bytes_per_token": kv, "attention_params": p}

    steps = []
    if chosen == "greedy":
        proxy = max(1, int(len(smp.eval) * PROXY_FRACTION))
        done: list[int] = []
        while len(done) < n:
            left = [i for i in range(n) if i not in done]
            best = min(left, key=lambda i: float(losses(surgery.model(done + [i]), proxy).mean()))
            done.append(best)
            steps.append(step(done))
    else:
        steps.append(step(chosen))
    final = surgery.model(steps[-1]["layers"])

    healed = None
    if heal_steps > 0:
        final = heal(final, model, smp.fit, heal_steps, heal_how, dev, smp.fit_y)
        s = scored(losses(final, key="healed"))
        healed = {"steps": heal_steps, "loss": s["loss"], "ppl": s["ppl"],
                  "delta_ppl_pct": 100.0 * (s["ppl"] / baseline["ppl"] - 1.0)}
    notes = {
        "variant_before": ckpt.meta.variant, "n_kv_heads_before": ckpt.meta.n_kv_heads,
        "fit": "conversions fitted on the fit windows' layer inputs (alternate windows, not scored)",
        "interval": "ci_low/ci_high: exp of the 95% t interval (n - 1 df) of the mean loss over evaluation windows",
        "positions": ckpt.meta.positions,
    }
    if vision:
        notes["fit"] = "conversions fitted on training-split images' layer inputs (not scored)"
        notes["interval"] = "ci_low/ci_high: exp of the 95% t interval (n - 1 df) of the mean loss over evaluation images"
        notes["vision"] = ("loss: mean classification cross-entropy (nats) per validation image, ppl = exp(loss); "
                           "accuracy: share of images whose top class is the label, with its 95% t "
                           "interval over images; KV bytes per token: per patch token")
        notes["accuracy"] = accuracy
    if chosen == "greedy":
        notes["greedy"] = (f"order: lowest loss on the first {PROXY_FRACTION:.0%} of the evaluation windows, "
                           "one layer added per step")
    if ckpt.meta.positions == "rotary":
        notes["rotary"] = ROTARY_NOTES.get(target.name, "")
    if healed is not None:
        notes["heal"] = f"{heal_how}, AdamW lr {HEAL_LR}, {HEAL_BATCH} fit windows per step, ties kept"
    if target.grouping != "contiguous":
        notes["grouping"] = {"how": ("per layer, the free grouping of the kv heads into G equal groups of least "
                                     "mean ||W_K[h] - mean_group||_F / ||W_K[h]||_F (analysis.head_grouping; exact: "
                                     "searched exhaustively); query heads follow their kv head"),
                             **surgery.notes}
    if target.name == "wq_identity":
        rebased = scored(losses(surgery.model([])))
        notes["wq_identity"] = {**surgery.notes, "basis_only_loss_change": rebased["loss"] - baseline["loss"]}
    if out is not None:
        notes["out"] = save(final, out, ckpt.path, steps[-1]["layers"], target)
    return {"checkpoint": ckpt.path, "target": str(target), "method": target.method, "sample": smp.info,
            "baseline": baseline, "steps": steps, "healed": healed, "notes": notes}


ROTARY_NOTES = {
    "k_eq_v": "one tensor cached per layer, un-rotated; keys are rotated on read, values are not",
    "q_eq_k_eq_v": "one tensor cached per layer, un-rotated; keys are rotated on read, values are not",
    "q_eq_k": "q and k share W_K and are rotated as before; the psd fit ignores the rotation",
    "gqa": "aligned: keys are not rotated before pooling (an orthogonal map does not commute with RoPE); values are",
    "mqa": "aligned: keys are not rotated before pooling (an orthogonal map does not commute with RoPE); values are",
    "latent": "the latent is cached un-rotated; keys are up-projected and rotated on read",
    "wq_identity": ("the basis change acts before RoPE; of each head's query block only its scaled rotation per "
                    "frequency pair (what commutes with RoPE) moves into the key"),
}


def save(model, out: str, path: str, layers: list[int], target: Target) -> str:
    """Write the converted model as ``OUT/model.safetensors`` (this project's checkpoint format,
    config in the metadata) and ``OUT/config.json``; what was written."""
    from safetensors.torch import save_file          # here: only --out writes a checkpoint

    from experiments.train import CONFIG_KEY, RUN_KEY

    n = len(model.blocks)
    cfgs = {(b.attn.cfg.variant, b.attn.cfg.n_kv_heads) for b in model.blocks}
    if target.rank is not None:
        raise WhatIfError(f"--out: a latent conversion has no variant of this project's model to save as")
    if sorted(layers) != list(range(n)) or len(cfgs) != 1:
        raise WhatIfError(f"--out needs every layer converted (converted: {sorted(layers)} of {n})")
    if type(model) is not GPT or not all(type(b.mlp) is MLP for b in model.blocks):
        raise WhatIfError(f"--out writes this project's GPT; this model has other blocks (SwiGLU)")
    variant, nkv = cfgs.pop()
    cfg = copy.copy(model.cfg)
    cfg.variant, cfg.n_kv_heads = variant, nkv
    clean = GPT.from_state_dict(cfg, {k: v.detach().cpu() for k, v in model.state_dict().items()
                                      if not (cfg.tie_embeddings and k == "lm_head.weight")})
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    target_file = folder / "model.safetensors"
    tmp = target_file.with_suffix(".tmp")
    meta = {"format": "pt", CONFIG_KEY: json.dumps(cfg.to_dict()),
            RUN_KEY: json.dumps({"step": 0, "tokens": 0, "final": True, "converted_from": str(path),
                                 "conversion": f"{target} {target.method}"})}
    save_file({k: v.contiguous() for k, v in clean.export_state_dict().items()}, str(tmp), metadata=meta)
    os.replace(tmp, target_file)
    (folder / "config.json").write_text(json.dumps({"format": "qkvscope-run", "format_version": 1,
                                                    **cfg.to_dict()}, indent=2) + "\n")
    return str(target_file)
