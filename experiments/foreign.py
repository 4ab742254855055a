"""Other people's checkpoints as runnable :class:`experiments.model.GPT` models.

The activation metrics need a forward pass; this module turns the state dicts
of the two papers' code (and plain nanoGPT) into the project's one model, so
``app.jobs`` can run them. Nothing here reads files: callers pass the state
dict (names to tensors) and the checkpoint's own config dict.

* :func:`runnable` — dispatch on the weight converter's architecture name
  (``nanogpt``, ``query_free``, ``projection_sharing``) and check that the
  model built here reads the attention the way the converter did.
* :func:`from_projection_sharing` — Brainchip-Inc/Do-Transformers-Need-3-Projections
  language models (arXiv 2606.04032).
* nanoGPT and the query-free paper's fork (MarkoKarbevski/Wqkv_necessity) go
  through :meth:`experiments.model.GPT.from_nanogpt`.

What their language models are, as their repository shows it (their model
files ``transformer_*_300_M.py`` are not in it; ``gao_keyless_repro.py`` builds
a model of "the same structure as transformer_KQV_300_M.GPT" and
``distillation_llm.py``, ``transformer_KQV_300M_fineweb.py``,
``kv_similarity_llm.py``, ``run_eval.py`` use theirs):

* GPT-2 style, pre-norm: ``x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))``,
  ``nn.LayerNorm(n_embd, eps=layer_norm_epsilon)`` (with bias) for ``ln_1``,
  ``ln_2``, ``ln_f``; token ``wte`` plus learned position ``wpe``
  (``n_positions`` rows) embeddings at the top level (no ``transformer.``),
  blocks in ``h``; logits ``ln_f(x) @ wte.weight.T`` when
  ``tie_word_embeddings`` (then there is no ``lm_head.weight`` key), else an
  ``lm_head`` Linear without bias.
* Causal attention, ``head_dim = n_embd // n_head``, scale ``1/sqrt(head_dim)``
  (``scaled_dot_product_attention``'s default; the manual path computes the
  same). Every projection is an ``nn.Linear`` with ``bias=use_bias``
  (``True`` in their configs); ``c_proj`` ``[n_embd, n_embd]``. Each attention
  registers a causal-mask buffer ``h.{i}.attn.bias`` ``[1, 1, P, P]``.
* QKV baseline ``GPT``: ``c_attn`` ``[3*n_embd, n_embd]``, rows ``[q; k; v]``
  (``split(n_embd)``). Q-K=V ``GPT_QKV_KEqualsV``: ``c_q`` and ``c_k``, and
  ``v = k = c_k(x)`` (no ``c_v``).
* ``model_config`` (their ``ModelConfig``): ``vocab_size``, ``n_positions``,
  ``n_layer``, ``n_embd``, ``n_head``, ``n_kv_groups``, ``n_inner``,
  ``*_pdrop``, ``layer_norm_epsilon`` (1e-5), ``initializer_range``,
  ``use_bias``, ``tie_word_embeddings``, ``use_flash_attention``.

Not in their repository, so read from the tensors or assumed (and said so):
the MLP is ``mlp.c_fc`` ``[n_inner, n_embd]`` -> GELU -> ``mlp.c_proj`` (their
profiler counts ``c_fc`` and ``c_proj`` outside ``attn`` as MLP and lists GELU;
the exact GELU, not the tanh approximation, is assumed); the other variants'
module names (Q=K-V ``c_k``+``c_v``, Q=K=V ``c_k``, GQA/MQA ``c_q``+``c_k``+``c_v``
or ``c_attn`` of ``(n_head + 2*kv)*head_dim`` rows, Q-GQA/Q-MQA ``c_q``+``c_kv``)
follow ``loaders/layouts/projection_sharing.py``; grouped query head h reads kv
head ``h // (n_head // kv)``. A layer with any other attention tensor (for
example the 2D positional correction of their ``(Q=K)+`` variants) is refused,
as are their synthetic-task encoders (``blocks.N``; one-hot inputs, no causal
mask): this GPT cannot run them.

Llama-style models (:func:`from_llama_meta`): llama2.c's ``model.py`` and
Meta's original layout (``tok_embeddings``, ``layers.N.attention.wq/wk/wv/wo``,
``layers.N.feed_forward.w1/w2/w3``, ``attention_norm``, ``ffn_norm``, ``norm``,
``output``), from a ``ckpt.pt`` or a llama2.c ``.bin`` export
(``loaders/llama2c.py`` names its tensors the same way). The GPT runs them
with ``norm="rmsnorm"`` (``x * rsqrt(mean(x^2) + eps) * w``, eps ``norm_eps``,
1e-5 by default), rotary positions on interleaved pairs with base
``rope_theta`` (10000 by default; llama2.c's ``precompute_freqs_cis`` and
``apply_rotary_emb``, the pairs ``x[2i], x[2i+1]``), grouped kv heads
(query head h reads kv head ``h // (n_heads / n_kv_heads)``, llama2.c's
``repeat_kv``), and each block's MLP replaced by :class:`SwiGLU`
``w2(silu(w1 x) * w3 x)``. A v0 export's rotary tables (``freqs_cos``,
``freqs_sin``) are checked against the ones this GPT computes.

nanoGPT variants (:func:`from_nanogpt_variant`): nanoGPT's names with RMSNorm
instead of LayerNorm and/or a SwiGLU MLP under ``mlp.`` named
``w1``/``w3``/``w2`` (gate/up/down, llama2.c's names), ``gate_proj``/``up_proj``/
``down_proj`` (Hugging Face's) or ``w_gate``/``w_up``/``w_down``. A fused
``c_fc`` of twice the hidden width is refused: which half gates is not
recorded in the weights.

Every model built here carries ``context_limit``: the positions it was
trained on (``max_seq_len``/``block_size``), the longest window to feed it.
"""
from __future__ import annotations

import re
from typing import Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from experiments.model import GPT, GPTConfig
from loaders.sources import strip_key_prefixes

__all__ = ["ForeignCheckpointError", "runnable", "from_projection_sharing", "from_llama_meta",
           "from_nanogpt_variant", "SwiGLU", "swiglu_names"]

_PROJ = ("c_attn", "c_q", "c_k", "c_v", "c_kv", "c_qk", "c_qkv")
_KV_NAMES = ("n_kv_groups", "n_kv_heads", "n_kv_head", "num_kv_heads")
_LISTED = 8


class ForeignCheckpointError(ValueError):
    """This checkpoint cannot be run as a GPT; ``str()`` says why."""


def _listed(keys) -> str:
    keys = sorted(keys)
    more = f" and {len(keys) - _LISTED} more" if len(keys) > _LISTED else ""
    return ", ".join(keys[:_LISTED]) + more


def _conf(config: Mapping, *names, default=None):
    for n in names:
        if config.get(n) is not None:
            return config[n]
    return default


# ---- the projection-sharing paper ---------------------------------------------------

def _attention_plan(mods: set[str], rows: dict[str, int], n: int, dh: int, d: int,
                    n_kv: int | None, config: Mapping) -> tuple[str, int, dict[str, list[tuple[str, int]]]]:
    """(variant, kv heads, plan): plan maps each of their modules to the GPT
    modules its rows fill, in row order, as (name, rows)."""
    def heads(m: str, per: int = 1) -> int:
        r = rows[m]
        if r % (per * dh):
            raise ForeignCheckpointError(f"attn.{m}.weight has {r} rows, not a multiple of "
                                         f"{per} x head_dim {dh}")
        return r // (per * dh)

    if mods == {"c_attn"}:
        # rows [q (n*dh); k (kv*dh); v (kv*dh)]
        kv = n_kv if n_kv is not None else (heads("c_attn") - n) // 2
        variant, plan = "qkv", {"c_attn": [("q", n * dh), ("k", kv * dh), ("v", kv * dh)]}
    elif mods == {"c_q", "c_k", "c_v"}:
        kv, variant = heads("c_k"), "qkv"
        plan = {"c_q": [("q", n * dh)], "c_k": [("k", kv * dh)], "c_v": [("v", kv * dh)]}
    elif mods == {"c_q", "c_kv"}:
        r = rows["c_kv"]
        if n_kv is None:
            n_kv = _conf(config, *_KV_NAMES)
        packed = r == 2 * int(n_kv) * dh if n_kv is not None else r > d
        kv = heads("c_kv", 2 if packed else 1)
        if packed:     # rows [k; v]
            variant, plan = "qkv", {"c_q": [("q", n * dh)], "c_kv": [("k", kv * dh), ("v", kv * dh)]}
        else:          # one tensor used as K and V
            variant, plan = "k_eq_v", {"c_q": [("q", n * dh)], "c_kv": [("kv", kv * dh)]}
    elif mods == {"c_q", "c_k"}:       # GPT_QKV_KEqualsV: v = k = c_k(x)
        kv, variant = heads("c_k"), "k_eq_v"
        plan = {"c_q": [("q", n * dh)], "c_k": [("kv", kv * dh)]}
    elif mods in ({"c_k", "c_v"}, {"c_qk", "c_v"}):
        kk = "c_k" if "c_k" in mods else "c_qk"
        kv, variant = heads(kk), "q_eq_k"
        plan = {kk: [("qk", kv * dh)], "c_v": [("v", kv * dh)]}
    elif mods in ({"c_k"}, {"c_kv"}, {"c_qkv"}):
        (only,) = mods
        kv, variant = heads(only), "q_eq_k_eq_v"
        plan = {only: [("qkv", kv * dh)]}
    else:
        found = ", ".join(sorted(mods)) or "none"
        raise ForeignCheckpointError(
            f"attention modules at h.0.attn ({found}) match no projection-sharing variant; expected "
            "c_attn, c_q+c_k+c_v, c_q+c_kv, c_q+c_k, c_k+c_v, c_qk+c_v, c_k, c_kv or c_qkv")
    if n_kv is not None and int(n_kv) != kv:
        raise ForeignCheckpointError(f"the attention shapes give {kv} kv heads, expected {n_kv}")
    for m, parts in plan.items():
        if sum(r for _, r in parts) != rows[m]:
            raise ForeignCheckpointError(
                f"attn.{m}.weight has {rows[m]} rows; expected {sum(r for _, r in parts)} for "
                f"{n} heads and {kv} kv heads of head_dim {dh}")
    return variant, kv, plan


def from_projection_sharing(sd: Mapping[str, torch.Tensor], config: Mapping, *,
                            n_kv_heads: int | None = None) -> GPT:
    """A GPT computing what their language model computes (module docstring).

    ``sd``: their ``model_state_dict`` (``module.``/``_orig_mod.`` prefixes
    allowed); ``config``: their ``model_config`` (``n_head`` required).
    ``n_kv_heads`` decides a ``c_kv`` beside ``c_q`` (shared K=V or packed
    ``[k; v]``) when given; otherwise ``model_config``'s kv count does, else
    more than ``n_embd`` rows means packed. The input tensors are not modified.
    """
    sd = {strip_key_prefixes(k): v for k, v in sd.items()}
    if "wte.weight" not in sd or not any(k.startswith("h.") for k in sd):
        if any(k.startswith("blocks.") for k in sd):
            raise ForeignCheckpointError(
                "a synthetic-task encoder (blocks.N: one-hot inputs, no causal mask) is not a "
                "causal language model")
        raise ForeignCheckpointError(f"expected wte.weight and blocks h.N.*; found {_listed(sd)}")
    wte = sd["wte.weight"]                                               # (vocab, d)
    vocab, d = wte.shape
    n_layer = 1 + max(int(k.split(".")[1]) for k in sd if re.match(r"h\.\d+\.", k))
    n = _conf(config, "n_head", "n_heads")
    if n is None:
        raise ForeignCheckpointError("model_config gives no n_head")
    n = int(n)
    if n <= 0 or d % n:
        raise ForeignCheckpointError(f"n_embd {d} is not divisible by n_head {n}")
    dh = d // n
    mods = {k.split(".")[3] for k in sd if re.fullmatch(r"h\.0\.attn\.(c_\w+)\.weight", k)} & set(_PROJ)
    rows = {m: sd[f"h.0.attn.{m}.weight"].shape[0] for m in mods}
    variant, kv, plan = _attention_plan(mods, rows, n, dh, d, n_kv_heads, config)

    own: dict[str, torch.Tensor] = {}
    unknown = []
    block = re.compile(r"h\.(\d+)\.(.+)")
    renames = {"ln_1": "ln_1", "ln_2": "ln_2", "mlp.c_fc": "mlp.fc", "mlp.c_proj": "mlp.proj",
               "attn.c_proj": "attn.o"}
    for k, v in sd.items():
        if k in ("wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias", "lm_head.weight"):
            own[k] = v
            continue
        m = block.fullmatch(k)
        if m is None:
            unknown.append(k)
            continue
        i, rest = m.group(1), m.group(2)
        mod, _, p = rest.rpartition(".")
        if rest == "attn.bias" and v.dim() == 4:
            continue                                  # the causal-mask buffer, not a parameter
        if mod in renames and p in ("weight", "bias"):
            own[f"blocks.{i}.{renames[mod]}.{p}"] = v
        elif mod.startswith("attn.") and mod[5:] in plan and p in ("weight", "bias"):
            at = 0
            for name, r in plan[mod[5:]]:             # fused rows -> the GPT's modules, in order
                own[f"blocks.{i}.attn.{name}.{p}"] = v[at:at + r]
                at += r
        else:
            unknown.append(k)
    if unknown:
        raise ForeignCheckpointError(
            f"tensors this GPT has no place for: {_listed(unknown)} (a {variant} layer runs "
            f"{', '.join(sorted(plan))} and c_proj; the MLP is mlp.c_fc and mlp.c_proj)")
    if "blocks.0.mlp.fc.weight" not in own:
        raise ForeignCheckpointError("expected the MLP as h.N.mlp.c_fc and h.N.mlp.c_proj; "
                                     "found no h.0.mlp.c_fc.weight")
    if "wpe.weight" not in own:
        raise ForeignCheckpointError("expected learned positions wpe.weight; found none")

    tied = "lm_head.weight" not in own or torch.equal(own["lm_head.weight"], wte)
    if tied:
        own.pop("lm_head.weight", None)
    # their use_bias switches the Linear biases; LayerNorm keeps its own. A bias
    # the checkpoint does not have is zero, so one GPT flag covers both.
    norm_bias = "blocks.0.ln_1.bias" in own
    linear_bias = "blocks.0.attn.o.bias" in own
    cfg = GPTConfig(vocab_size=vocab, block_size=own["wpe.weight"].shape[0], n_layer=n_layer,
                    n_head=n, n_kv_heads=kv, d_model=d, variant=variant,
                    mlp_ratio=own["blocks.0.mlp.fc.weight"].shape[0] / d, bias=norm_bias or linear_bias,
                    tie_embeddings=tied,
                    norm_eps=float(_conf(config, "layer_norm_epsilon", "layer_norm_eps", default=1e-5)))
    if norm_bias != linear_bias:
        for k, w in list(own.items()):
            if not k.endswith(".weight") or k in ("wte.weight", "wpe.weight", "lm_head.weight"):
                continue
            is_norm = ".ln_" in k or k.startswith("ln_f.")
            if not (norm_bias if is_norm else linear_bias):
                own[k[:-len("weight")] + "bias"] = torch.zeros(w.shape[0], dtype=w.dtype)
    try:
        return GPT.from_state_dict(cfg, own)
    except (KeyError, ValueError) as exc:
        raise ForeignCheckpointError(exc.args[0]) from None


# ---- SwiGLU models: llama2.c / Meta Llama, nanoGPT variants ---------------------------

class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` (Shazeer 2020, arXiv 2002.05202); in llama2.c
    ``w2(F.silu(w1(x)) * w3(x))``."""

    def __init__(self, d_model: int, hidden: int, bias: bool = False):
        super().__init__()
        self.gate = nn.Linear(d_model, hidden, bias=bias)
        self.up = nn.Linear(d_model, hidden, bias=bias)
        self.down = nn.Linear(hidden, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


#: (gate, up, down) module names of SwiGLU MLPs, as the code that trained them names them.
SWIGLU_NAMES = (("w1", "w3", "w2"), ("gate_proj", "up_proj", "down_proj"), ("w_gate", "w_up", "w_down"))


def swiglu_names(keys, stem: str) -> tuple[str, str, str] | None:
    """The (gate, up, down) names under ``stem`` (e.g. ``transformer.h.0.mlp.``) whose
    ``.weight`` keys are all in ``keys``, else None."""
    have = set(keys)
    for names in SWIGLU_NAMES:
        if all(f"{stem}{n}.weight" in have for n in names):
            return names
    return None


#: Above this many parameters a GPT is built on the meta device before its weights are assigned.
_META_PARAMS = 100_000_000


def _assemble(cfg: GPTConfig, own: dict[str, torch.Tensor], *, swiglu_hidden: int | None,
              context: int) -> GPT:
    """A GPT of ``cfg`` holding exactly the tensors ``own`` (in the GPT's names; SwiGLU
    blocks as ``blocks.N.mlp.gate/up/down``), filled by assignment (float32 copies where
    the dtype differs; the caller's tensors are not modified). Missing or unexpected
    names are listed, sorted. A model of more than ``_META_PARAMS`` parameters is built
    on the meta device (no second copy of its weights); a smaller one on the CPU,
    where GPT's random init is faster than under the meta device mode (0.8 s against
    3.8 s for stories15M's shape, measured on this project's 2-core machine)."""
    from contextlib import nullcontext

    big = sum(v.numel() for v in own.values()) > _META_PARAMS
    with torch.device("meta") if big else nullcontext():
        model = GPT(cfg)
        if swiglu_hidden is not None:
            for block in model.blocks:
                block.mlp = SwiGLU(cfg.d_model, swiglu_hidden, bias=cfg.bias)
    want = dict(model.state_dict())
    if cfg.tie_embeddings:
        own = {**own, "lm_head.weight": own.get("wte.weight")}
    missing, unexpected = sorted(set(want) - set(own)), sorted(set(own) - set(want))
    if missing or unexpected:
        raise ForeignCheckpointError(f"the GPT has no place for {_listed(unexpected) or 'nothing'} and "
                                     f"lacks {_listed(missing) or 'nothing'}")
    for k, t in want.items():
        if tuple(own[k].shape) != tuple(t.shape):
            raise ForeignCheckpointError(f"{k}: expected shape {tuple(t.shape)}, found {tuple(own[k].shape)}")
    model.load_state_dict({k: v.detach().float() for k, v in own.items()}, strict=True, assign=True)
    if cfg.tie_embeddings:
        model.lm_head.weight = model.wte.weight
    model.context_limit = int(context)
    return model


_LLAMA_BUFFERS = ("freqs_cos", "freqs_sin", "rope.freqs")


def _check_rotary_tables(sd: Mapping[str, torch.Tensor], d_head: int, base: float) -> None:
    """A llama2.c v0 export's ``freqs_cos``/``freqs_sin`` [seq_len, d_head/2] must be
    cos/sin(pos * base^(-2i/d_head)): the rotation the GPT applies."""
    if "freqs_cos" not in sd or "freqs_sin" not in sd:
        return
    cos, sin = sd["freqs_cos"].double(), sd["freqs_sin"].double()
    inv = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)       # [d_head/2]
    ang = torch.outer(torch.arange(cos.shape[0], dtype=torch.float64), inv)         # [seq_len, d_head/2]
    if cos.shape != ang.shape or not (torch.allclose(cos, ang.cos(), atol=1e-4)
                                      and torch.allclose(sin, ang.sin(), atol=1e-4)):
        raise ForeignCheckpointError(
            f"the rotary tables freqs_cos/freqs_sin {tuple(cos.shape)} are not those of base {base:g} "
            f"and head size {d_head}, which this GPT applies")


def from_llama_meta(sd: Mapping[str, torch.Tensor], config: Mapping) -> GPT:
    """A GPT computing llama2.c's / Meta's Llama (module docstring). ``config``: llama2.c
    ``model_args`` or the ``.bin`` header (``n_heads`` required; ``n_kv_heads``,
    ``norm_eps``, ``rope_theta``, ``max_seq_len`` optional)."""
    sd = {strip_key_prefixes(k): v for k, v in sd.items()}
    if "tok_embeddings.weight" not in sd:
        raise ForeignCheckpointError(f"expected tok_embeddings.weight; found {_listed(sd)}")
    vocab, d = sd["tok_embeddings.weight"].shape
    layers = sorted({int(m.group(1)) for k in sd if (m := re.match(r"layers\.(\d+)\.", k))})
    n = _conf(config, "n_heads", "n_head")
    if n is None:
        raise ForeignCheckpointError("the model config gives no n_heads")
    n = int(n)
    if n <= 0 or d % n:
        raise ForeignCheckpointError(f"dim {d} is not divisible by n_heads {n}")
    dh = d // n
    kv = int(_conf(config, "n_kv_heads", default=n))
    base = float(_conf(config, "rope_theta", default=10000.0))
    _check_rotary_tables(sd, dh, base)
    if "layers.0.feed_forward.w1.weight" not in sd:
        raise ForeignCheckpointError("expected the MLP as layers.N.feed_forward.w1/w2/w3; found no "
                                     "layers.0.feed_forward.w1.weight")
    hidden = sd["layers.0.feed_forward.w1.weight"].shape[0]
    out = sd.get("output.weight")
    tied = out is None or torch.equal(out, sd["tok_embeddings.weight"])
    names = {"attention_norm": "ln_1", "ffn_norm": "ln_2", "attention.wq": "attn.q",
             "attention.wk": "attn.k", "attention.wv": "attn.v", "attention.wo": "attn.o",
             "feed_forward.w1": "mlp.gate", "feed_forward.w3": "mlp.up", "feed_forward.w2": "mlp.down"}
    own: dict[str, torch.Tensor] = {"wte.weight": sd["tok_embeddings.weight"]}
    unknown = []
    for k, v in sd.items():
        if k in ("tok_embeddings.weight",) + _LLAMA_BUFFERS:
            continue
        if k == "norm.weight":
            own["ln_f.weight"] = v
        elif k == "output.weight":
            if not tied:
                own["lm_head.weight"] = v
        elif (m := re.fullmatch(r"layers\.(\d+)\.(.+)\.weight", k)) and m.group(2) in names:
            own[f"blocks.{m.group(1)}.{names[m.group(2)]}.weight"] = v
        else:
            unknown.append(k)
    if unknown:
        raise ForeignCheckpointError(f"tensors this Llama has no place for: {_listed(unknown)}")
    context = int(_conf(config, "max_seq_len", "seq_len", default=2048))
    try:
        cfg = GPTConfig(vocab_size=vocab, block_size=context, n_layer=len(layers), n_head=n, n_kv_heads=kv,
                        d_model=d, norm="rmsnorm", positions="rotary", mlp_ratio=hidden / d, bias=False,
                        tie_embeddings=tied, rope_base=base,
                        norm_eps=float(_conf(config, "norm_eps", "rms_norm_eps", default=1e-5)))
    except ValueError as exc:
        raise ForeignCheckpointError(str(exc)) from None
    return _assemble(cfg, own, swiglu_hidden=hidden, context=context)


def from_nanogpt_variant(sd: Mapping[str, torch.Tensor], config: Mapping, *, n_head: int,
                         norm: str) -> GPT:
    """A nanoGPT with ``norm`` (``layernorm`` or ``rmsnorm``) and a GELU (``c_fc``,
    ``c_proj``) or SwiGLU MLP (``SWIGLU_NAMES``), learned positions; names as nanoGPT's
    (``transformer.h.N.ln_1``, ``attn.c_attn`` rows ``[q; k; v]``, ``attn.c_proj``,
    ``transformer.ln_f``, ``lm_head``; LayerNorm ``gamma``/``beta`` accepted)."""
    alias = {"gamma": "weight", "beta": "bias"}
    sd = {strip_key_prefixes(k): v for k, v in sd.items()}
    sd = {(k.rsplit(".", 1)[0] + "." + alias[k.rsplit(".", 1)[1]]
           if k.rsplit(".", 1)[-1] in alias else k): v for k, v in sd.items()}
    for need in ("transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.attn.c_attn.weight"):
        if need not in sd:
            raise ForeignCheckpointError(f"expected {need} (learned positions, fused c_attn); found "
                                         f"{_listed(sd)}")
    wte = sd["transformer.wte.weight"]
    vocab, d = wte.shape
    n_layer = 1 + max(int(k.split(".")[2]) for k in sd if k.startswith("transformer.h."))
    mlp = swiglu_names(sd, "transformer.h.0.mlp.")
    if mlp is None and "transformer.h.0.mlp.c_fc.weight" not in sd:
        found = sorted({k.split(".")[4] for k in sd if k.startswith("transformer.h.0.mlp.")})
        raise ForeignCheckpointError(f"the MLP ({', '.join(found) or 'none'}) is neither c_fc/c_proj (GELU) "
                                     f"nor a named SwiGLU ({'; '.join('/'.join(n) for n in SWIGLU_NAMES)})")
    if mlp is None:
        hidden = sd["transformer.h.0.mlp.c_fc.weight"].shape[0]
        if sd["transformer.h.0.mlp.c_proj.weight"].shape[1] * 2 == hidden:
            raise ForeignCheckpointError(
                f"mlp.c_fc has {hidden} rows, twice mlp.c_proj's {hidden // 2} columns: a fused SwiGLU "
                f"whose gate half is not recorded in the weights")
        mlp_names = {"mlp.c_fc": "mlp.fc", "mlp.c_proj": "mlp.proj"}
    else:
        hidden = sd[f"transformer.h.0.mlp.{mlp[0]}.weight"].shape[0]
        mlp_names = {f"mlp.{mlp[0]}": "mlp.gate", f"mlp.{mlp[1]}": "mlp.up", f"mlp.{mlp[2]}": "mlp.down"}
    names = {"ln_1": "ln_1", "ln_2": "ln_2", "attn.c_proj": "attn.o", **mlp_names}
    own: dict[str, torch.Tensor] = {"wte.weight": wte, "wpe.weight": sd["transformer.wpe.weight"]}
    out = sd.get("lm_head.weight")
    tied = out is None or torch.equal(out, wte)
    if not tied:
        own["lm_head.weight"] = out
    unknown = []
    for k, v in sd.items():
        if k in ("transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight"):
            continue
        if k.startswith("transformer.ln_f."):
            own["ln_f." + k.rsplit(".", 1)[1]] = v
            continue
        m = re.fullmatch(r"transformer\.h\.(\d+)\.(.+)\.(weight|bias)", k)
        if m is None:
            unknown.append(k)
            continue
        i, mod, p = m.groups()
        if mod == "attn" and p == "bias" and v.dim() == 4:
            continue                                  # the causal-mask buffer
        if mod == "attn.c_attn":
            for name, t in zip(("q", "k", "v"), v.split(d, dim=0)):     # rows [q; k; v]
                own[f"blocks.{i}.attn.{name}.{p}"] = t
        elif mod in names:
            own[f"blocks.{i}.{names[mod]}.{p}"] = v
        else:
            unknown.append(k)
    if unknown:
        raise ForeignCheckpointError(f"tensors this GPT has no place for: {_listed(unknown)}")
    if sd["transformer.h.0.attn.c_attn.weight"].shape[0] != 3 * d:
        raise ForeignCheckpointError(f"attn.c_attn.weight has {sd['transformer.h.0.attn.c_attn.weight'].shape[0]} "
                                     f"rows; expected {3 * d} ([q; k; v])")
    bias = any(k.endswith(".bias") and not k.startswith("ln_f") and ".ln_" not in k for k in own)
    norm_bias = "blocks.0.ln_1.bias" in own
    if norm == "rmsnorm" and norm_bias:
        raise ForeignCheckpointError("the norms have biases, which RMSNorm does not")
    if norm == "layernorm" and norm_bias != bias:
        raise ForeignCheckpointError("the LayerNorms and the Linears disagree on biases; this GPT has one flag")
    context = sd["transformer.wpe.weight"].shape[0]
    try:
        cfg = GPTConfig(vocab_size=vocab, block_size=context, n_layer=n_layer, n_head=n_head, d_model=d,
                        norm=norm, positions="learned", mlp_ratio=hidden / d, bias=bias, tie_embeddings=tied,
                        norm_eps=float(_conf(config, "norm_eps", "rms_norm_eps", "layer_norm_epsilon",
                                             "eps", default=1e-5)))
    except ValueError as exc:
        raise ForeignCheckpointError(str(exc)) from None
    return _assemble(cfg, own, swiglu_hidden=hidden if mlp is not None else None, context=context)


# ---- dispatch ------------------------------------------------------------------------

_QUERY_FREE_MODES = {"identity": "identity", "original": "standard", "residual": "residual"}


def _query_mode(config: Mapping, variant: str) -> str:
    """The query-free fork's ``query_mode`` (as ``loaders/layouts/query_free.py`` reads it)."""
    if config.get("query_mode") is not None:
        return str(config["query_mode"])
    if config.get("use_query_weights") is not None:
        return "original" if config["use_query_weights"] else "identity"
    return "identity" if variant == "wq_identity" else "original"


def runnable(architecture: str, sd: Mapping[str, torch.Tensor], config: Mapping, *,
             variant: str, n_heads: int, n_kv_heads: int, attn_scale: float,
             norm: str = "layernorm") -> GPT:
    """The GPT for a checkpoint the weight converter named ``architecture``.

    ``variant``, ``n_heads``, ``n_kv_heads``, ``attn_scale``, ``norm``: the
    converter's reading (``loaders`` ``ModelMeta``); the model must agree with it.
    Raises :class:`ForeignCheckpointError` with the reason otherwise.
    """
    try:
        if architecture == "nanogpt":
            plain = norm == "layernorm" and swiglu_names(
                {strip_key_prefixes(k) for k in sd}, "transformer.h.0.mlp.") is None
            model = (GPT.from_nanogpt(sd, n_head=n_heads) if plain
                     else from_nanogpt_variant(sd, config, n_head=n_heads, norm=norm))
            if plain:
                model.context_limit = int(model.cfg.block_size)
        elif architecture == "llama_meta":
            model = from_llama_meta(sd, config)
        elif architecture == "query_free":
            mode = _query_mode(config, variant)
            if mode not in _QUERY_FREE_MODES:
                raise ForeignCheckpointError(
                    f"query_mode {mode!r} (q = x + GELU(x Wq + bq)) is not a linear query; "
                    f"runnable modes: {', '.join(_QUERY_FREE_MODES)}")
            model = GPT.from_nanogpt(sd, n_head=n_heads, query_mode=_QUERY_FREE_MODES[mode],
                                     attn_scale=attn_scale)
        elif architecture == "projection_sharing":
            model = from_projection_sharing(sd, config, n_kv_heads=n_kv_heads)
        else:
            raise ForeignCheckpointError(f"no GPT builder for a {architecture} checkpoint")
    except ForeignCheckpointError:
        raise
    except KeyError as exc:          # a plain dict lookup names the key; from_state_dict explains
        msg = str(exc.args[0]) if exc.args else "missing tensor"
        raise ForeignCheckpointError(msg if " " in msg else f"missing tensor {msg}") from None
    except ValueError as exc:
        raise ForeignCheckpointError(str(exc)) from None
    if norm != "layernorm" and model.cfg.norm != norm:
        raise ForeignCheckpointError(f"the forward-pass model normalises with {model.cfg.norm}; the weight "
                                     f"converter read {norm}")
    got = (model.cfg.variant, model.cfg.n_head, model.cfg.n_kv_heads)
    if got != (variant, n_heads, n_kv_heads) or abs(model.cfg.attn_scale - attn_scale) > 1e-12 * attn_scale:
        raise ForeignCheckpointError(
            f"the forward-pass model reads this checkpoint as {got[0]} with {got[1]} heads, {got[2]} "
            f"kv heads, scale {model.cfg.attn_scale:g}; the weight converter as {variant} with "
            f"{n_heads} heads, {n_kv_heads} kv heads, scale {attn_scale:g}")
    return model
