"""What would sharing cost this model? A trained checkpoint converted (``analysis.conversion``) and
its loss measured before and after, layer by layer, optionally healed by a little training.

Runs on every checkpoint ``experiments.runnable.load_runnable`` builds as this project's GPT: its
own variants, nanoGPT and its forks, llama2.c / Meta Llama and the papers' models
(``experiments.foreign``). Each converted layer becomes an ``experiments.model.Attention`` of the
target variant and head count (a K=V layer really caches one tensor, a GQA layer really has
fewer kv heads), so the converted model is the model that would be served.

The sample: the text (``SampleSpec``; the bundled corpus by default) cut into windows of the
model's context (at most ``MAX_WINDOW``), ``2 * tokens`` tokens spread over it; the windows
alternate between the *evaluation* set (loss of every model, ``tokens`` tokens) and the *fit*
set (the captured layer inputs the activation-aware methods fit on, and the healing batches), so
no conversion is scored on the tokens it was fitted to.

Loss: mean next-token cross-entropy (nats) over the evaluation windows; ``ppl = exp(loss)``;
``ci_low``/``ci_high``: the 95% interval of the perplexity: the t interval over windows
(``analysis.intervals.mean_interval`` on the per-window mean losses), then exp.
KV bytes per token: ``analysis.variants.kv_bytes_per_token`` per layer (its tie and kv heads:
the checkpoint's variant for an original layer, the tensors' ties for a converted one; a latent
layer caches ``rank`` numbers), at the checkpoint's dtype. Attention parameters: each layer's
projections and biases, a tied tensor once (a latent layer: its down- and up-projection in place
of W_K and W_V).

Hugging Face causal LMs (GPT-2, Llama-style) are converted in place (``experiments.hf_surgery``):
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
from analysis.captures import MAX_WINDOW, sample_windows
from analysis.intervals import mean_interval
from analysis.variants import KV_TIED, PLUS, Q_DROPPED, Q_TIED, base, kv_bytes_per_token
from analysis.weights import default_device
from experiments.activation_runs import SampleSpec, token_stream, wanted
from experiments import hf_surgery
from experiments.model import GPT, MLP, Attention
from experiments.runnable import FOREIGN, NoForwardPass, hf_model, load_runnable, model_context
from loaders.canonical import AttentionWeights, Checkpoint, dtype_bytes
from loaders.errors import QkvscopeError

#: Share of the evaluation windows the greedy order is chosen on.
PROXY_FRACTION = 0.25
#: Healing: AdamW learning rate and windows per step.
HEAL_LR = 3e-4
HEAL_BATCH = 8
#: Seed of the bootstrap (the same windows resampled alike for every model).
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
    new = Attention(cfg).to(old.o.weight.device)

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


# -- the sample ----------------------------------------------------------------------------
@dataclass
class Sample:
    eval: torch.Tensor            # [B, T] token ids: every loss
    fit: torch.Tensor             # [B', T]: the fitted methods' captured inputs, the healing batches
    info: dict = field(default_factory=dict)


def text_sample(model, tok, vocab: int, sample: SampleSpec, want: int) -> Sample:
    """Windows of the sample text alternating between evaluation and fit (module docstring)."""
    text = sample.read().text
    context = min(model_context(model), MAX_WINDOW)
    ids, how = token_stream(text[: want * 32], tok, vocab, 2 * want + 2 * context)
    if ids.numel() < 2 * want and len(text) > want * 32:
        ids, how = token_stream(text, tok, vocab, 2 * want + 2 * context)
    if ids.numel() < 4:
        raise NoForwardPass(f"the sample text gave {ids.numel()} tokens")
    # one extra position per window: inputs [:-1], targets [1:]
    windows = sample_windows(ids, context=context + 1, n_tokens=2 * want)
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


def scored(losses: np.ndarray) -> dict:
    """``loss, ppl, ci_low, ci_high`` of per-window losses (module docstring)."""
    loss = float(losses.mean())
    lo, hi = mean_interval(losses)
    return {"loss": loss, "ppl": math.exp(loss), "ci_low": None if lo is None else math.exp(lo),
            "ci_high": None if hi is None else math.exp(hi)}


def captured_stats(model, mods, windows: torch.Tensor, dev) -> list[conv.InputStats]:
    """Each layer's ``InputStats`` (the input of its attention module ``mods[i]``, after the norm)
    over ``windows``."""
    gram: dict[int, torch.Tensor] = {}
    total: dict[int, torch.Tensor] = {}
    n = [0]

    def hook_for(i):
        def hook(module, args, kwargs):
            x = (args[0] if args else kwargs["hidden_states"]).detach()
            x = x.reshape(-1, x.shape[-1]).double().cpu()
            gram[i] = gram.get(i, 0) + x.T @ x
            total[i] = total.get(i, 0) + x.sum(0)
        return hook

    handles = [m.register_forward_pre_hook(hook_for(i), with_kwargs=True) for i, m in enumerate(mods)]
    try:
        with torch.inference_mode():
            for lo in range(0, windows.shape[0], 8):
                w = windows[lo:lo + 8, :-1]
                n[0] += w.numel()
                model(w.to(dev))
    finally:
        for h in handles:
            h.remove()
    return [conv.InputStats(gram[i] / n[0], total[i] / n[0], n[0]) for i in range(len(mods))]


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
@dataclass
class Target:
    """``--to`` parsed: ``k_eq_v``, ``q_eq_k``, ``q_eq_k_eq_v``, ``gqa:G``, ``mqa``, ``latent:R``."""

    name: str
    method: str
    groups: int | None = None
    rank: int | None = None

    @classmethod
    def parse(cls, text: str, method: str | None) -> "Target":
        name, _, arg = text.partition(":")
        if name not in conv.TARGETS:
            raise WhatIfError(f"--to {text}: expected one of k_eq_v, q_eq_k, q_eq_k_eq_v, gqa:G, mqa, latent:R")
        if name in ("gqa", "latent") and not arg.isdigit():
            raise WhatIfError(f"--to {text}: expected {name}:N with N a positive integer")
        if name not in ("gqa", "latent") and arg:
            raise WhatIfError(f"--to {text}: {name} takes no ':' argument")
        method = method or conv.DEFAULT_METHOD[name]
        if method not in conv.METHODS[name]:
            raise WhatIfError(f"--method {method}: {name} takes one of {', '.join(conv.METHODS[name])}")
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
        self.hf = not isinstance(model, GPT)
        if self.hf:
            self.mods = hf_surgery.modules(model)
            self.geom = hf_surgery.geometry(model)
            self.before = [hf_surgery.read(m, i, self.geom) for i, m in enumerate(self.mods)]
        else:
            self.mods = [b.attn for b in model.blocks]
            self.before = [layer_of(m, i) for i, m in enumerate(self.mods)]
        self.after: dict[int, AttentionWeights] = {}     # layer -> its converted canonical weights
        self.modules: dict[int, Attention] = {}          # layer -> its converted module (GPT)
        try:
            for i, layer in enumerate(self.before):
                self.after[i] = conv.convert(layer, target.name, target.method, stats[i], groups=target.groups,
                                             rank=target.rank, rotary=rotary)
                if not self.hf:
                    self.modules[i] = attention_of(self.after[i], self.mods[i])
        except conv.ConversionError as exc:
            raise WhatIfError(str(exc)) from None

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


def heal(model, teacher, fit: torch.Tensor, steps: int, how: str, dev) -> GPT:
    """``model`` fine-tuned ``steps`` AdamW steps on batches of the fit windows: ``lm`` (next-token
    cross-entropy) or ``distill`` (KL(teacher || model) of the next-token distributions, Hinton
    et al. 2015 at temperature 1). Tied tensors stay tied: a tied variant owns one parameter."""
    model = copy.deepcopy(model).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=HEAL_LR, weight_decay=0.0)
    gen = torch.Generator().manual_seed(SEED)
    for _ in range(steps):
        idx = torch.randint(0, fit.shape[0], (min(HEAL_BATCH, fit.shape[0]),), generator=gen)
        w = fit[idx].to(dev)
        logits = _logits(model(w[:, :-1]))
        if how == "lm":
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
        else:
            with torch.no_grad():
                t_logits = _logits(teacher(w[:, :-1]))
            loss = F.kl_div(F.log_softmax(logits, -1).reshape(-1, logits.shape[-1]),
                            F.log_softmax(t_logits, -1).reshape(-1, logits.shape[-1]),
                            log_target=True, reduction="batchmean")
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def _runnable(ckpt: Checkpoint):
    """``(model, tokenizer, vocab_size)``: a Hugging Face folder as its causal LM (with the output
    head), anything else through ``load_runnable``; a model that is neither this project's GPT nor a
    Hugging Face causal LM, or reads images, raises ``NoForwardPass``."""
    path = Path(ckpt.path)
    if path.is_dir() and (path / "config.json").is_file() and ckpt.meta.architecture not in FOREIGN:
        model, tok, vocab = hf_model(path, causal_lm=True)
    else:
        model, tok, vocab = load_runnable(ckpt)
    if isinstance(model, GPT) and getattr(model.cfg, "task", "language") == "language":
        return model, tok, vocab
    if not isinstance(model, GPT) and hasattr(model, "get_output_embeddings") and model.get_output_embeddings() is not None:
        return model, tok, vocab
    raise NoForwardPass(f"{ckpt.path}: whatif converts language models: this project's GPT (its own variants, "
                        "nanoGPT, llama2.c, the papers' models) and Hugging Face causal LMs")


def whatif(ckpt: Checkpoint, *, to: str, method: str | None = None, layers: str = "all",
           sample: SampleSpec | None = None, heal_steps: int = 0, heal_how: str = "distill",
           out: str | None = None, device: str | None = None) -> dict:
    """The JSON of ``python -m app whatif`` (``app.commands.whatif``) for an opened checkpoint."""
    sample = sample or SampleSpec()
    target = Target.parse(to, method)
    dev = torch.device(device or default_device())
    model, tok, vocab = _runnable(ckpt)
    hf = not isinstance(model, GPT)
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
    smp = text_sample(model, tok, vocab, sample, wanted(sample, ckpt.meta))
    per_elem = dtype_bytes(ckpt.meta.dtype)
    stats = captured_stats(model, mods, smp.fit, dev)
    surgery = Surgery(model, target, stats, rotary=ckpt.meta.positions == "rotary", variant=base(ckpt.meta.variant))

    base_losses = window_losses(model, smp.eval, dev)
    baseline = scored(base_losses)
    kv0, p0 = surgery.cost([], per_elem)
    baseline.update(kv_bytes_per_token=kv0, attention_params=p0)

    def step(done: list[int]) -> dict:
        s = scored(window_losses(surgery.model(done), smp.eval, dev))
        kv, p = surgery.cost(done, per_elem)
        return {"layers": list(done), "loss": s["loss"], "ppl": s["ppl"],
                "delta_ppl_pct": 100.0 * (s["ppl"] / baseline["ppl"] - 1.0), "ci_low": s["ci_low"],
                "ci_high": s["ci_high"], "kv_bytes_per_token": kv, "attention_params": p}

    steps = []
    if chosen == "greedy":
        proxy = smp.eval[: max(1, int(len(smp.eval) * PROXY_FRACTION))]
        done: list[int] = []
        while len(done) < n:
            left = [i for i in range(n) if i not in done]
            best = min(left, key=lambda i: float(window_losses(surgery.model(done + [i]), proxy, dev).mean()))
            done.append(best)
            steps.append(step(done))
    else:
        steps.append(step(chosen))
    final = surgery.model(steps[-1]["layers"])

    healed = None
    if heal_steps > 0:
        final = heal(final, model, smp.fit, heal_steps, heal_how, dev)
        s = scored(window_losses(final, smp.eval, dev))
        healed = {"steps": heal_steps, "loss": s["loss"], "ppl": s["ppl"],
                  "delta_ppl_pct": 100.0 * (s["ppl"] / baseline["ppl"] - 1.0)}
    notes = {
        "variant_before": ckpt.meta.variant, "n_kv_heads_before": ckpt.meta.n_kv_heads,
        "fit": "conversions fitted on the fit windows' layer inputs (alternate windows, not scored)",
        "interval": "ci_low/ci_high: 95% percentile bootstrap of the perplexity over evaluation windows",
        "positions": ckpt.meta.positions,
    }
    if chosen == "greedy":
        notes["greedy"] = (f"order: lowest loss on the first {PROXY_FRACTION:.0%} of the evaluation windows, "
                           "one layer added per step")
    if ckpt.meta.positions == "rotary":
        notes["rotary"] = ROTARY_NOTES.get(target.name, "")
    if healed is not None:
        notes["heal"] = f"{heal_how}, AdamW lr {HEAL_LR}, {HEAL_BATCH} fit windows per step, ties kept"
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
