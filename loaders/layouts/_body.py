"""The rest of a model beside its attention, in canonical names: what a forward pass reads.

The canonical container (``loaders.canonical``) holds each layer's attention
projections. A forward pass also needs the embeddings, the norms and the MLPs.
A layout that can hand those over too defines, beside ``convert``,

* ``convert_model(source) -> (ModelMeta, layer_fn, Body)``: ``convert``'s
  result plus the :class:`Body`; raises :class:`NotRunnable` (the reason) for a
  checkpoint whose attention it reads but whose whole model it cannot hand over.

``experiments.foreign`` builds the project's GPT from these three and nothing
else, so a layout's key names are written in its own module only. The models
described are pre-norm blocks ``x + attn(ln1(x))``, ``x + mlp(ln2(x))``, then
``ln_final`` and the output projection. Canonical names of the body's tensors
(after TransformerLens's ``embed``, ``pos_embed``, ``ln1``, ``ln2``,
``ln_final``, ``unembed``, ``mlp.W_in/W_gate/W_out``), every matrix in
``nn.Linear``'s ``[out, in]`` (``x @ W.T + b``), every ``.bias`` optional:

==========================  =====================  ============================================
name                        shape                  what
==========================  =====================  ============================================
``embed``                   ``[vocab, d_model]``   token embedding
``pos_embed``               ``[context, d_model]`` learned positions (absent with rotary ones)
``unembed``                 ``[vocab, d_model]``   output projection, no bias (absent: ``embed``)
``ln_final.weight``/``.bias`` ``[d_model]``        the norm before ``unembed``
``blocks.{i}.ln1.*``        ``[d_model]``          the norm before attention
``blocks.{i}.ln2.*``        ``[d_model]``          the norm before the MLP
``blocks.{i}.mlp.in.*``     ``[d_mlp, d_model]``   GELU MLP ``out(gelu(in x))``; SwiGLU's up
``blocks.{i}.mlp.gate.*``   ``[d_mlp, d_model]``   SwiGLU ``out(silu(gate x) * in x)`` only
``blocks.{i}.mlp.out.*``    ``[d_model, d_mlp]``
==========================  =====================  ============================================
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

import torch

from loaders.layouts import _common as C
from loaders.sources import strip_key_prefixes
from loaders.tensor_source import DictSource, TensorSource

MLPS = ("gelu", "swiglu")
#: Keys an error message lists before it says how many more.
LISTED = 8
#: Parameter names some code gives a norm's weight and bias (LayerNorm ``gamma``/``beta``).
NORM_ALIASES = {"gamma": "weight", "beta": "bias"}


class NotRunnable(ValueError):
    """The layout reads this checkpoint's attention, but cannot hand over its whole model
    for a forward pass; ``str()`` says why."""


@dataclass
class Body:
    """The non-attention tensors in canonical names (module docstring), and how to run them.

    ``mlp``: ``gelu`` (exact, not the tanh approximation) or ``swiglu``.
    ``context``: the positions the model was trained on. ``norm_eps``: every norm's eps.
    ``rope_base``: rotary base (``meta.positions == "rotary"``): position ``t`` turns
    the pair ``(x[2i], x[2i+1])`` of each head by ``t * rope_base^(-2i/d_head)``.
    """

    tensors: dict[str, torch.Tensor]
    mlp: str
    context: int
    norm_eps: float = 1e-5
    rope_base: float = 10000.0

    def __post_init__(self):
        if self.mlp not in MLPS:
            raise ValueError(f"mlp {self.mlp!r} is not one of {', '.join(MLPS)}")


def memory_source(sd: Mapping[str, torch.Tensor], config: Mapping | None = None,
                  extras: Mapping | None = None) -> DictSource:
    """A state dict already in memory as a source, ``_orig_mod.``/``module.`` prefixes
    removed as the file readers remove them."""
    return DictSource({strip_key_prefixes(k): v for k, v in sd.items()}, config=dict(config or {}),
                      extras=dict(extras or {}))


def listed(keys: Iterable[str]) -> str:
    """The first ``LISTED`` keys, sorted, and how many more."""
    keys = sorted(keys)
    more = f" and {len(keys) - LISTED} more" if len(keys) > LISTED else ""
    return ", ".join(keys[:LISTED]) + more


def gather(source: TensorSource, *, top: Mapping[str, str], block: str, modules: Mapping[str, str],
           attention: Iterable[str], skip: Iterable[str] = (), aliases: Mapping[str, str] | None = None,
           hint: str = "") -> dict[str, torch.Tensor]:
    """Read every tensor of ``source`` into canonical names: ``top`` maps whole keys
    (``wte.weight``) to canonical names; ``block`` is the layer stem with ``{i}``
    (``h.{i}.``), ``modules`` maps a module under it (``mlp.c_fc``) to its canonical
    module (``mlp.in``), ``.weight``/``.bias`` kept (``aliases`` renames parameter
    names first). Keys of the ``attention`` modules (the canonical layers hold them),
    buffers (``_common``'s list, causal masks) and ``skip`` keys are passed over.
    Returns the canonical tensors; any other key is :class:`NotRunnable`, listed, with
    ``hint`` (what the layout runs) in brackets."""
    rx = re.compile(re.escape(block).replace(r"\{i\}", r"(\d+)") + r"(.+)\.(\w+)")
    attention, skip, aliases = set(attention), set(skip), dict(aliases or {})
    out: dict[str, torch.Tensor] = {}
    unplaced = []
    for k in source.keys():
        if k in top:
            out[top[k]] = source.get(k)
            continue
        if k in skip or C.is_buffer(source, k):
            continue
        m = rx.fullmatch(k)
        if m is None:
            unplaced.append(k)
            continue
        i, mod, p = m.group(1), m.group(2), aliases.get(m.group(3), m.group(3))
        if mod in attention:
            continue
        if mod in modules and p in ("weight", "bias"):
            out[f"blocks.{i}.{modules[mod]}.{p}"] = source.get(k)
        else:
            unplaced.append(k)
    if unplaced:
        raise NotRunnable(f"tensors this GPT has no place for: {listed(unplaced)}"
                          + (f" ({hint})" if hint else ""))
    return out


def aliased(names: Mapping[str, str], aliases: Mapping[str, str]) -> dict[str, str]:
    """``names`` (whole keys to canonical names) plus each ``.weight``/``.bias`` key's
    aliased spelling (``ln_f.gamma`` beside ``ln_f.weight``)."""
    out = dict(names)
    for key, canon in names.items():
        stem, _, p = key.rpartition(".")
        for alias, real in aliases.items():
            if real == p:
                out[f"{stem}.{alias}"] = canon
    return out
