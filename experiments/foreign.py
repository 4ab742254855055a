"""Other people's checkpoints as runnable :class:`experiments.model.GPT` models, built
from the canonical container.

The activation metrics need a forward pass. A layout converter that can hand over a
whole model defines ``convert_model(source) -> (ModelMeta, layer_fn, Body)``
(``loaders/layouts/_body.py``): the canonical attention layers and the embeddings,
norms and MLPs in canonical names. This module builds the project's GPT from those
three and nothing else, so a checkpoint's own key names and config fields are
written in its layout module only: the projection-sharing paper's language models
(``loaders/layouts/projection_sharing.py``), the query-free paper's nanoGPT fork
(``query_free.py``), nanoGPT and its RMSNorm/SwiGLU variants (``nanogpt.py``),
llama2.c and Meta's Llama (``llama_meta.py``). Nothing here reads files: callers
pass the state dict (names to tensors) and the checkpoint's config dict.

* :func:`runnable`: the GPT for a checkpoint a layout named ``architecture``,
  checked against the reading the caller stored (``ModelMeta``).
* :func:`from_canonical`: the GPT of (meta, layer_fn, body).

From canonical to the GPT (``experiments.model``'s names): head h's
``W_Q[h]`` ``[d_model, d_head]`` is rows ``h*d_head:(h+1)*d_head`` of the Linear
``attn.q.weight`` (transposed), likewise ``W_K``/``W_V`` at the kv heads; a tied
variant's one tensor (``kv``, ``qk``, ``qkv``) is ``W_K``; ``W_O[h]`` ``[d_head,
d_model]`` is columns of ``attn.o.weight`` (transposed). The body's ``ln1``/``ln2``/
``ln_final`` are ``ln_1``/``ln_2``/``ln_f``; a GELU MLP's ``in``/``out`` are
``mlp.fc``/``mlp.proj``, a SwiGLU's ``gate``/``in``/``out`` are :class:`SwiGLU`'s
``gate``/``up``/``down``. The GPT has one bias flag for its Linears and LayerNorms:
a bias the checkpoint does not have is zero, which computes the same. RMSNorm has
no bias (a norm bias there is refused). With rotary positions (interleaved pairs,
``experiments.model.rotary``) the layout gives the base. Grouped query head h reads
kv head ``h // (n_heads / n_kv_heads)``, as the canonical container says. QK-norm,
logit soft-capping, latent attention and several towers are refused: this GPT has
none of them.

Every model built here carries ``context_limit``: the positions it was trained on,
the longest window to feed it.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from experiments.model import GPT, PROJECTIONS, GPTConfig
from loaders.canonical import AttentionWeights, ModelMeta
from loaders.errors import CheckpointFormatError
from loaders.layouts import LAYOUTS
from loaders.layouts._body import Body, NotRunnable, listed, memory_source

__all__ = ["ForeignCheckpointError", "runnable", "from_canonical", "from_projection_sharing",
           "SwiGLU", "RUNNABLE"]

#: Layouts whose whole model this module builds: those defining ``convert_model``.
RUNNABLE = tuple(sorted(m.NAME for m in LAYOUTS if hasattr(m, "convert_model")))


class ForeignCheckpointError(ValueError):
    """This checkpoint cannot be run as a GPT; ``str()`` says why."""


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` (Shazeer 2020, arXiv 2002.05202)."""

    def __init__(self, d_model: int, hidden: int, bias: bool = False):
        super().__init__()
        self.gate = nn.Linear(d_model, hidden, bias=bias)
        self.up = nn.Linear(d_model, hidden, bias=bias)
        self.down = nn.Linear(hidden, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


# ---- canonical -> the GPT's names ------------------------------------------------------

#: The canonical tensor each of the GPT's projections holds (``PROJECTIONS`` names).
_CANONICAL = {"q": "Q", "k": "K", "v": "V", "kv": "K", "qk": "K", "qkv": "K"}
_TOP = {"embed": "wte.weight", "pos_embed": "wpe.weight", "unembed": "lm_head.weight",
        "ln_final.weight": "ln_f.weight", "ln_final.bias": "ln_f.bias"}
_BLOCK = {"ln1": "ln_1", "ln2": "ln_2"}
_MLP = {"gelu": {"mlp.in": "mlp.fc", "mlp.out": "mlp.proj"},
        "swiglu": {"mlp.gate": "mlp.gate", "mlp.in": "mlp.up", "mlp.out": "mlp.down"}}


def _attention(a: AttentionWeights, variant: str, d: int) -> dict[str, torch.Tensor]:
    """Layer ``a``'s canonical tensors as the GPT's ``blocks.N.attn.*`` Linear weights."""
    out = {}
    stem = f"blocks.{a.layer}.attn."
    for name in PROJECTIONS[variant]:
        w, b = getattr(a, "W_" + _CANONICAL[name]), getattr(a, "b_" + _CANONICAL[name])
        out[stem + name + ".weight"] = w.transpose(1, 2).reshape(-1, d)        # (h, d, dh) -> (h*dh, d)
        if b is not None:
            out[stem + name + ".bias"] = b.reshape(-1)                       # (h, dh) -> (h*dh,)
    out[stem + "o.weight"] = a.W_O.permute(2, 0, 1).reshape(d, -1)           # (h, dh, d) -> (d, h*dh)
    if a.b_O is not None:
        out[stem + "o.bias"] = a.b_O
    return out


def _body(body: Body, n_layers: int) -> dict[str, torch.Tensor]:
    """The body's canonical names as the GPT's."""
    if body.mlp not in _MLP:
        raise ForeignCheckpointError(f"no GPT MLP for a {body.mlp} body (runnable: {', '.join(_MLP)})")
    names = {**_BLOCK, **_MLP[body.mlp]}
    out = {}
    for k, v in body.tensors.items():
        if k in _TOP:
            out[_TOP[k]] = v
            continue
        parts = k.split(".", 2)                                              # blocks.{i}.<module>.<param>
        i, (mod, _, p) = (parts[1], parts[2].rpartition(".")) if len(parts) == 3 else ("", ("", "", ""))
        if parts[0] != "blocks" or mod not in names or not i.isdigit() or int(i) >= n_layers:
            raise ForeignCheckpointError(f"the body tensor {k} has no place in the GPT")
        out[f"blocks.{i}.{names[mod]}.{p}"] = v
    return out


def _unsupported(meta: ModelMeta) -> str | None:
    if meta.qk_norm != "none":
        return f"its QK-norm ({meta.qk_norm})"
    if meta.logit_softcap is not None:
        return "its logit soft-capping"
    if meta.latent is not None:
        return "its latent attention"
    if len(meta.towers) > 1:
        return "its several attention stacks"
    return None


def from_canonical(meta: ModelMeta, layer: Callable[[int], AttentionWeights], body: Body) -> GPT:
    """The GPT computing what (meta, layer_fn, body) describe (module docstring).
    Raises :class:`ForeignCheckpointError` for what this GPT does not run."""
    why = _unsupported(meta)
    if why is not None:
        raise ForeignCheckpointError(f"this GPT does not run {why}")
    embed = body.tensors["embed"]                                            # (vocab, d)
    vocab, d = embed.shape
    own = _body(body, meta.n_layers)
    for i in range(meta.n_layers):
        own.update(_attention(layer(i), meta.variant, d))
    tied = "lm_head.weight" not in own or torch.equal(own["lm_head.weight"], embed)
    if tied:
        own.pop("lm_head.weight", None)
    norm_bias = any(k.endswith(".bias") and (".ln_" in k or k.startswith("ln_f.")) for k in own)
    if meta.norm == "rmsnorm" and norm_bias:
        raise ForeignCheckpointError("the norms have biases, which RMSNorm does not")
    hidden = own["blocks.0.mlp.fc.weight" if body.mlp == "gelu" else "blocks.0.mlp.gate.weight"].shape[0]
    try:
        cfg = GPTConfig(vocab_size=vocab, block_size=int(body.context), n_layer=meta.n_layers,
                        n_head=meta.n_heads, n_kv_heads=meta.n_kv_heads, d_model=d, d_head=meta.d_head,
                        variant=meta.variant, norm=meta.norm, positions=meta.positions,
                        mlp_ratio=hidden / d, attn_scale=meta.attn_scale,
                        bias=norm_bias or any(k.endswith(".bias") for k in own), tie_embeddings=tied,
                        rope_base=body.rope_base, norm_eps=body.norm_eps)
    except ValueError as exc:
        raise ForeignCheckpointError(str(exc)) from None
    return _assemble(cfg, own, swiglu_hidden=hidden if body.mlp == "swiglu" else None, context=body.context)


#: Above this many parameters a GPT is built on the meta device before its weights are assigned.
_META_PARAMS = 100_000_000


def _assemble(cfg: GPTConfig, own: dict[str, torch.Tensor], *, swiglu_hidden: int | None,
              context: int) -> GPT:
    """A GPT of ``cfg`` holding exactly the tensors ``own`` (in the GPT's names; SwiGLU
    blocks as ``blocks.N.mlp.gate/up/down``), a bias it lacks beside a weight it has
    zero, filled by assignment (float32 copies where the dtype differs; the caller's
    tensors are not modified). Missing or unexpected names are listed, sorted. A model
    of more than ``_META_PARAMS`` parameters is built on the meta device (no second
    copy of its weights); a smaller one on the CPU, where GPT's random init is faster
    than under the meta device mode (0.8 s against 3.8 s for stories15M's shape,
    measured on this project's 2-core machine)."""
    big = sum(v.numel() for v in own.values()) > _META_PARAMS
    with torch.device("meta") if big else nullcontext():
        model = GPT(cfg)
        if swiglu_hidden is not None:
            for block in model.blocks:
                block.mlp = SwiGLU(cfg.d_model, swiglu_hidden, bias=cfg.bias)
    want = dict(model.state_dict())
    own = dict(own)
    if cfg.tie_embeddings:
        own["lm_head.weight"] = own.get("wte.weight")
    for k, t in want.items():                 # a bias the checkpoint does not have computes as zero
        if k.endswith(".bias") and k not in own and k[:-4] + "weight" in own:
            own[k] = torch.zeros(t.shape, dtype=own[k[:-4] + "weight"].dtype)
    missing, unexpected = sorted(set(want) - set(own)), sorted(set(own) - set(want))
    if missing or unexpected:
        raise ForeignCheckpointError(f"the GPT has no place for {listed(unexpected) or 'nothing'} and "
                                     f"lacks {listed(missing) or 'nothing'}")
    for k, t in want.items():
        if tuple(own[k].shape) != tuple(t.shape):
            raise ForeignCheckpointError(f"{k}: expected shape {tuple(t.shape)}, found {tuple(own[k].shape)}")
    model.load_state_dict({k: v.detach().float() for k, v in own.items()}, strict=True, assign=True)
    if cfg.tie_embeddings:
        model.lm_head.weight = model.wte.weight
    model.context_limit = int(context)
    return model


# ---- entry points ----------------------------------------------------------------------

def _build(architecture: str, sd: Mapping[str, torch.Tensor], config: Mapping) -> GPT:
    layout = next((m for m in LAYOUTS if m.NAME == architecture), None)
    if layout is None or not hasattr(layout, "convert_model"):
        raise ForeignCheckpointError(f"no GPT builder for a {architecture} checkpoint")
    try:
        meta, layer, body = layout.convert_model(memory_source(sd, config))
    except CheckpointFormatError as exc:
        raise ForeignCheckpointError(exc.problem) from None
    except NotRunnable as exc:
        raise ForeignCheckpointError(str(exc)) from None
    return from_canonical(meta, layer, body)


def runnable(architecture: str, sd: Mapping[str, torch.Tensor], config: Mapping, *,
             variant: str, n_heads: int, n_kv_heads: int, attn_scale: float,
             norm: str = "layernorm") -> GPT:
    """The GPT for a checkpoint the weight converter named ``architecture``.

    ``sd``: its state dict (torch.compile's and DDP's key prefixes allowed; not modified);
    ``config``: the config that came with it. ``variant``, ``n_heads``, ``n_kv_heads``,
    ``attn_scale``, ``norm``: the converter's stored reading (``loaders`` ``ModelMeta``);
    the model must agree with it. Raises :class:`ForeignCheckpointError` with the
    reason otherwise.
    """
    model = _build(architecture, sd, config)
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


def from_projection_sharing(sd: Mapping[str, torch.Tensor], config: Mapping, *,
                            n_kv_heads: int | None = None) -> GPT:
    """A GPT computing what the projection-sharing paper's language model computes
    (``loaders/layouts/projection_sharing.py``): ``sd`` their ``model_state_dict``,
    ``config`` their ``model_config``. ``n_kv_heads``, when given, must be what the
    layout reads."""
    model = _build("projection_sharing", sd, config)
    if n_kv_heads is not None and model.cfg.n_kv_heads != int(n_kv_heads):
        raise ForeignCheckpointError(f"the attention shapes give {model.cfg.n_kv_heads} kv heads, "
                                     f"expected {n_kv_heads}")
    return model
