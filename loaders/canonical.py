"""The canonical attention container (see DESIGN.md, "The canonical container").

Every checkpoint layout is converted into this one form. Naming and shapes follow
TransformerLens; ``x`` is a row vector and head ``h``'s query is ``x @ W_Q[h]``.

Per layer, the tensors of ``analysis.layer.AttentionWeights`` (its docstring gives their
names and shapes).

Tied variants keep every tensor present so that formulas apply uniformly:
``q_eq_k`` has ``W_Q`` equal to ``W_K`` (expanded to n_heads when n_kv_heads <
n_heads, as ``W_K[h // group]``), ``k_eq_v`` has ``W_V`` equal to ``W_K``,
``q_eq_k_eq_v`` both. ``variant`` in the metadata says which tie holds;
parameter counts count a tied tensor once. ``wq_identity`` has ``W_Q = None``.

For GQA, query head ``h`` uses kv head ``h // (n_heads // n_kv_heads)``.

Beyond the projections (each with a default, so a layout without them is unchanged):

* Towers. A checkpoint with several attention stacks (CLIP's and SigLIP's
  vision and text encoders) numbers its layers across them: the first tower's
  layers come first. ``ModelMeta.towers`` lists each stack's name, first layer,
  layer count and geometry (a one-tower CLIP/SigLIP lists its one; empty where a
  layout names no towers); ``AttentionWeights.tower`` names
  the layer's. The top-level geometry is the first tower's; ``layer_meta(i)`` is
  the metadata with layer ``i``'s tower geometry, what a layer's metrics need.
* QK-norm. ``q_norm`` ``[n_heads, d_head]`` and ``k_norm`` ``[n_kv_heads,
  d_head]`` are the multiplicative gains of an RMSNorm applied to q and k after
  the projection: q = g_q * (x W_Q) / rms(x W_Q). ``ModelMeta.qk_norm`` says
  over what the rms runs: ``head`` (each head's d_head: Qwen3, Gemma 3),
  ``layer`` (all heads' concatenated projection: OLMo 2), ``none``. Gemma's
  ``(1 + weight)`` convention is folded in, so the stored gain is what multiplies.
  ``W_Q``/``W_K`` stay the projections before the norm.
* ``ModelMeta.logit_softcap``: ``c`` of ``c * tanh(logits / c)`` (Gemma 2), None without.
* ``ModelMeta.latent``: multi-head latent attention (DeepSeek-V2/V3, see
  ``loaders.layouts.deepseek_mla``): the ranks and head widths of the real
  layer; ``W_K``/``W_V`` are then the composed maps and the KV cache is the latent.
* ``ModelMeta.query_module``: what computes the query when it is not a linear map
  of x (the nonlinear queries of arXiv 2603.13381, ``q = x + f(x)`` with a small
  MLP ``f``), None otherwise. ``W_Q`` is then None, or the inner weight of the
  module, and never the identity slice; metrics of ``W_Q`` are absent with this
  text as their note; K and V are ordinary projections.
* ``ModelMeta.notes``: ``{metric name: note}`` for metrics the layout's
  conventions change (QK-norm, composed maps); ``analyze`` shows them beside the
  rows. The key ``norm`` says how the norm type was read where the weights alone
  cannot tell (nanoGPT forks).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Iterator

import torch

# the layer type and variant facts live in analysis' leaves; re-exported here for callers that import them from loaders
from analysis.layer import AttentionWeights  # noqa: F401  (the canonical layer type)
from analysis.kv_layers import layer_types_from_config, type_cache
from analysis.variants import kv_bytes_per_token as variant_kv_bytes

QK_NORMS = ("none", "head", "layer")
NORMS = ("layernorm", "rmsnorm", "none")

_DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1,
    "bool": 1, "complex64": 8, "complex128": 16,
}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype named as in torch (``"bfloat16"``); ``ValueError`` naming the
    dtype for one not in the table (a silent 4 would misstate a checkpoint's size and KV bytes)."""
    name = str(dtype).replace("torch.", "")
    try:
        return _DTYPE_BYTES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}: expected one of {', '.join(_DTYPE_BYTES)}") from None


@dataclass(frozen=True)
class Tower:
    """One attention stack of a multi-tower checkpoint: layers
    ``first_layer .. first_layer + n_layers - 1`` of the checkpoint's numbering."""

    name: str
    first_layer: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int

    def has(self, layer: int) -> bool:
        return self.first_layer <= layer < self.first_layer + self.n_layers


@dataclass(frozen=True)
class Latent:
    """Multi-head latent attention geometry (DeepSeek-V2/V3 ``DeepseekV3Attention``).

    ``kv_lora_rank``: width of the cached latent c_kv; ``q_lora_rank``: the query's
    (None: a full ``q_proj``); ``rope_dim``: the decoupled rotary key, one per token
    shared by all heads and cached beside c_kv; ``nope_dim``/``v_dim``: per-head
    widths of the key's position-free part and of the value. The canonical
    ``d_head`` is ``max(nope_dim + rope_dim, v_dim)`` (the narrower of W_K and W_V
    is zero-padded, see the layout).
    """

    kv_lora_rank: int
    q_lora_rank: int | None
    rope_dim: int
    nope_dim: int
    v_dim: int

    @property
    def cache_width(self) -> int:
        """Elements cached per token and layer: kv_lora_rank + rope_dim."""
        return self.kv_lora_rank + self.rope_dim


@dataclass(frozen=True)
class ModelMeta:
    """Geometry and provenance of one checkpoint's attention.

    ``architecture`` is the layout converter's name (``gpt2``, ``nanogpt``,
    ``llama``, ``llama_meta``, ``neox``, ``bert``, ``phi3``, ``falcon``, ``opt``, ``gptj``,
    ``query_free``, ``projection_sharing``, ``qkvscope``, ...).
    ``positions``: ``learned``, ``rotary``, ``alibi``, ``none`` or ``unknown``.
    ``attn_scale`` multiplies q.k (usually ``1/sqrt(d_head)``).
    ``dtype`` is the storage dtype of the attention weights, as torch names it.
    ``config`` is the source's own configuration, JSON-serialisable.
    """

    architecture: str
    variant: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    norm: str
    positions: str
    attn_scale: float
    dtype: str
    params_total: int
    params_attention: int
    config: dict = field(default_factory=dict)
    towers: tuple[Tower, ...] = ()
    qk_norm: str = "none"
    logit_softcap: float | None = None
    latent: Latent | None = None
    notes: dict = field(default_factory=dict)
    query_module: str | None = None

    @property
    def kv_layer_types(self) -> tuple:
        """The layer types the source config declares (``analysis.kv_layers``: sliding windows,
        per-type KV heads and head widths, shared caches); ``()`` for a uniform stack and for
        multi-tower checkpoints. The one place a layout's per-layer-type config fields are read."""
        return () if self.towers else layer_types_from_config(self.config)

    @property
    def kv_bytes_per_token(self) -> int:
        """n_layers * n_cached * n_kv_heads * d_head * bytes(dtype), summed over the
        towers of a multi-tower checkpoint, and over the config's layer types (each with its
        own KV heads and head width; shared layers add nothing) for a hybrid stack: the bytes
        a token adds while it is inside every window. For latent attention (MLA) what the
        model really caches: n_layers * (kv_lora_rank + rope_dim) * bytes(dtype)."""
        per = dtype_bytes(self.dtype)
        if self.latent is not None:
            return self.n_layers * self.latent.cache_width * per
        types = self.kv_layer_types
        if types:
            return int(sum(type_cache(t, self.variant, self.n_kv_heads, self.d_head, per)["bytes_per_token"]
                           for t in types))
        stacks = self.towers or (self,)
        return sum(variant_kv_bytes(self.variant, t.n_layers, t.n_kv_heads, t.d_head, per) for t in stacks)

    def tower_of(self, layer: int) -> Tower | None:
        """The tower holding ``layer``, None for a one-stack checkpoint."""
        return next((t for t in self.towers if t.has(layer)), None)

    def layer_meta(self, layer: int) -> "ModelMeta":
        """This metadata with layer ``layer``'s geometry (its tower's); ``self`` when
        the checkpoint has one stack or the tower's geometry is the top-level one."""
        t = self.tower_of(layer)
        if t is None or (t.n_heads, t.n_kv_heads, t.d_model, t.d_head) == (
                self.n_heads, self.n_kv_heads, self.d_model, self.d_head):
            return self
        return replace(self, n_heads=t.n_heads, n_kv_heads=t.n_kv_heads, d_model=t.d_model,
                       d_head=t.d_head)

    def to_json(self) -> dict:
        """The stable JSON shape of ``python -m app info --json`` (geometry part).
        ``towers`` is a list (empty for one stack), ``latent`` an object or null."""
        out = asdict(self)
        out.pop("params_total")
        out.pop("params_attention")
        out["towers"] = [asdict(t) for t in self.towers]
        out["params"] = {"total": self.params_total, "attention": self.params_attention}
        out["kv_bytes_per_token"] = self.kv_bytes_per_token
        out["kv_layer_types"] = [t.to_json() for t in self.kv_layer_types]
        if self.latent is not None:
            out["latent"]["cache_width"] = self.latent.cache_width
        return out


class Checkpoint:
    """An opened checkpoint: metadata now, layers one at a time on demand.

    ``layer_fn(i)`` reads and converts only layer ``i``'s tensors, so a pass
    over ``layers()`` holds about one layer in memory (safetensors are mmapped).
    ``close()`` releases file handles and temporary folders (zip uploads).
    """

    def __init__(self, path: str, meta: ModelMeta,
                 layer_fn: Callable[[int], AttentionWeights],
                 close_fn: Callable[[], None] | None = None):
        self.path = path
        self.meta = meta
        self._layer_fn = layer_fn
        self._close_fn = close_fn

    def layer(self, i: int) -> AttentionWeights:
        if not 0 <= i < self.meta.n_layers:
            raise IndexError(f"layer {i} out of range 0..{self.meta.n_layers - 1}")
        return self._layer_fn(i)

    def layers(self) -> Iterator[AttentionWeights]:
        for i in range(self.meta.n_layers):
            yield self._layer_fn(i)

    def close(self) -> None:
        if self._close_fn is not None:
            self._close_fn()
            self._close_fn = None

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
