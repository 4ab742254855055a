"""What a model holds and caches, for the serving-cost calculator (:mod:`analysis.kv_cost`).

Pure arithmetic, no tensors: dtype sizes, the model ``Geometry``, the
``Attention`` configuration being costed, parameter counts, KV-cache bytes per
token, the attention FLOPs of one (query, key) pair, and the standard set of
configurations a comparison shows::

    bytes/elem   = bits/8 + group overhead / group size            (int8, int4 only)
    n_cached     = 2, or 1 when K = V (``analysis.variants.n_cached``)
    cache layers = ceil(n_layers / layers per shared cache)        (cross-layer sharing)
    bytes/token  = cache layers * n_cached * n_kv_heads * d_head * bytes/elem
                 = cache layers * (kv_lora_rank + qk_rope_head_dim) * bytes/elem   (MLA)

MLA (multi-head latent attention, DeepSeek-V2 arXiv 2405.04434 section 2.1, and
DeepSeek-V3 arXiv 2412.19437): each layer caches one compressed latent
c_KV of ``kv_lora_rank`` elements and one decoupled rotary key k_R of
``qk_rope_head_dim`` elements per token, both shared by all heads, so the
cache does not grow with the number of heads. DeepSeek-V3 (61 layers,
kv_lora_rank 512, qk_rope_head_dim 64) at bf16: 61 * (512 + 64) * 2 = 70,272
bytes per token, against 61 * 2 * 128 heads * 128 * 2 = 3,997,696 for MHA
with its 128 heads of 128 (56.9x more).

Parameter counts: ``wq_identity`` and ``q_eq_k`` drop W_Q (d_model * n_heads *
d_head per layer, and b_Q), ``k_eq_v`` drops W_V (d_model * n_kv_heads * d_head,
and b_V), ``q_eq_k_eq_v`` drops both. Paper B's "+" variants (``q_eq_k_plus``,
``q_eq_k_eq_v_plus``, ``analysis.variants.PLUS``) cache and count as their base
variant: the score correction's m + 1 weights per layer are left out of the
formula (a checkpoint's own count keeps them).

Sources: MLA from DeepSeek-V2 (arXiv 2405.04434) and the Hugging Face
``DeepseekV3Attention``; cross-layer KV sharing from Brandon et al. (arXiv
2405.12981); K=V and head-sharing cache sizes from the projection-sharing paper
(arXiv 2606.04032).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from analysis.errors import AnalysisError
from analysis.kv_layers import LayerType, cached_tokens_for, layer_types_from_config, type_cache
from analysis.variants import ALL_VARIANTS, KV_TIED, Q_DROPPED, VARIANTS, sharing
from analysis.variants import LABELS as VARIANT_LABELS
from analysis.variants import kv_bytes_per_token as variant_kv_bytes

#: Bits per element of each cache / weight dtype name; int8 and int4 also carry
#: one group of scale (+ zero point) bytes per ``group_size`` elements, fp4 and nvfp4
#: their format's fixed block scale (:data:`BLOCK_SCALED`).
DTYPE_BITS = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4, "fp4": 4, "nvfp4": 4}
QUANTISED = frozenset({"int8", "int4"})
#: 4-bit floats (E2M1) with one scale per block, as each format fixes it: (elements per block,
#: scale bytes). fp4 is MXFP4 of the OCP Microscaling Formats (MX) Specification v1.0: blocks of
#: 32 with one E8M0 scale (1 byte), 0.5 + 1/32 = 0.53125 bytes/element. nvfp4 is NVIDIA's NVFP4:
#: blocks of 16 with one FP8 E4M3 scale (1 byte), 0.5 + 1/16 = 0.5625 bytes/element, plus one FP32
#: scale per tensor (not per token: left out).
BLOCK_SCALED = {"fp4": (32, 1.0), "nvfp4": (16, 1.0)}
DTYPE_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16",
                 "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "uint8": "int8"}


def normalise_dtype(name: str) -> str:
    key = str(name).replace("torch.", "").strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BITS:
        raise AnalysisError(f"unknown dtype {name!r}: expected one of {', '.join(DTYPE_BITS)}")
    return key


def bytes_per_element(dtype: str, *, group_size: int = 64, group_overhead_bytes: float = 4.0) -> float:
    """bits/8, plus ``group_overhead_bytes / group_size`` for int8 and int4, plus the block
    scale of fp4 (MXFP4, 1/32) and nvfp4 (1/16) (:data:`BLOCK_SCALED`).

    The default overhead, 4 bytes per group of 64, is one fp16 scale and one fp16
    zero point (asymmetric quantisation as in KIVI, arXiv 2402.02750): int4 then
    costs 0.5 + 4/64 = 0.5625 bytes per element.
    """
    key = normalise_dtype(dtype)
    out = DTYPE_BITS[key] / 8
    if key in BLOCK_SCALED:
        block, scale = BLOCK_SCALED[key]
        return out + scale / block
    if key in QUANTISED:
        if group_size < 1:
            raise AnalysisError(f"quantisation group size must be >= 1, got {group_size}")
        out += group_overhead_bytes / group_size
    return out


@dataclass(frozen=True)
class Geometry:
    """What the calculator needs to know about a model.

    ``mlp``: ``"gelu"`` (two matrices, GPT-2) or ``"gated"`` (three, SwiGLU as in
    Llama). ``bias``: biases on every linear layer (GPT-2); ``qkv_bias``: on the
    Q, K, V projections only (Qwen2). ``norm``: ``layernorm`` (weight, plus bias
    when ``bias``) or ``rmsnorm`` (weight). ``n_positions``: rows of a learned
    position table (0 for rotary). ``variant``: the model's own attention
    variant. ``params_total`` / ``params_attention``: known counts (from a
    checkpoint); when set they replace the formula for the native configuration
    and other configurations are derived from them by the attention difference.
    ``sliding_window``: the model's own attention window (Mistral 7B v0.1: 4096).
    ``kv_lora_rank`` set: the model's own attention is MLA (DeepSeek-V2/V3), with
    ``qk_rope_head_dim`` rotary key elements and, when set, a query compressed to
    ``q_lora_rank``, and per-head key and value widths ``qk_nope_head_dim`` and
    ``v_head_dim`` (None: ``d_head``) (Hugging Face ``DeepseekV3Config`` names).
    ``layer_types``: the stack's groups of layers that cache alike
    (:class:`analysis.kv_layers.LayerType`: sliding windows, heads and head widths per type,
    shared caches); empty for a uniform stack, whose one window is ``sliding_window``.
    """

    name: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    d_mlp: int = 0
    mlp: str = "gelu"
    vocab: int = 0
    n_positions: int = 0
    tied_embeddings: bool = True
    bias: bool = False
    qkv_bias: bool = False
    norm: str = "layernorm"
    variant: str = "qkv"
    params_total: int | None = None
    params_attention: int | None = None
    sliding_window: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int = 0
    q_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    source: str = ""
    layer_types: tuple[LayerType, ...] = ()

    def __post_init__(self):
        for key in ("n_layers", "n_heads", "n_kv_heads", "d_model", "d_head"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise AnalysisError(f"geometry {self.name!r}: {key} must be an integer >= 1, got {value!r}")
        check_kv_heads(self.name, self.n_heads, self.n_kv_heads)
        if self.variant not in ALL_VARIANTS:
            raise AnalysisError(f"geometry {self.name!r}: variant must be one of {', '.join(ALL_VARIANTS)}, "
                                f"got {self.variant!r}")
        if self.mlp not in ("gelu", "gated"):
            raise AnalysisError(f"geometry {self.name!r}: mlp must be 'gelu' or 'gated', got {self.mlp!r}")
        for key in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "v_head_dim"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise AnalysisError(f"geometry {self.name!r}: {key} must be None or an integer >= 1, "
                                    f"got {value!r}")
        if self.layer_types and sum(t.n_layers for t in self.layer_types) != self.n_layers:
            raise AnalysisError(f"geometry {self.name!r}: layer types cover "
                                f"{sum(t.n_layers for t in self.layer_types)} layers, the model has {self.n_layers}")
        if not isinstance(self.qk_rope_head_dim, int) or self.qk_rope_head_dim < 0:
            raise AnalysisError(f"geometry {self.name!r}: qk_rope_head_dim must be an integer >= 0, "
                                f"got {self.qk_rope_head_dim!r}")

    def to_json(self) -> dict:
        return asdict(self)


def check_kv_heads(name: str, n_heads: int, n_kv_heads: int) -> None:
    if not 1 <= n_kv_heads <= n_heads or n_heads % n_kv_heads:
        raise AnalysisError(f"geometry {name!r}: n_kv_heads must divide n_heads={n_heads} "
                            f"(1 for MQA, {n_heads} for MHA), got {n_kv_heads}")


@dataclass(frozen=True)
class Attention:
    """The attention / cache configuration being costed.

    ``n_kv_heads`` None keeps the geometry's. ``mla_latent`` set switches to
    multi-head latent attention (cache: latent + rope elements per layer per
    token, shared by all heads; the variant's K=V tie does not apply;
    ``mla_q_rank`` a compressed query as DeepSeek-V3's). ``layers_per_cache``: layers
    that share one cache (cross-layer attention; 1 = none). ``window`` None
    keeps the geometry's own sliding window (or none); 0 removes it.
    """

    variant: str = "qkv"
    n_kv_heads: int | None = None
    mla_latent: int | None = None
    mla_rope: int = 0
    layers_per_cache: int = 1
    window: int | None = None
    mla_q_rank: int | None = None

    def label(self, geometry: Geometry) -> str:
        kv = self.n_kv_heads or geometry.n_kv_heads
        if self.mla_latent:
            text = f"MLA latent {self.mla_latent}+rope {self.mla_rope}"
        else:
            text = f"{VARIANT_LABELS[self.variant]}, {sharing(geometry.n_heads, kv)}"
        if self.layers_per_cache > 1:
            text += f", CLA x{self.layers_per_cache}"
        window = effective_window(geometry, self)
        if window:
            text += f", window {window}"
        return text


def native_attention(geometry: Geometry) -> Attention:
    """The model's own attention: MLA with its ranks when it has ``kv_lora_rank``, else its
    variant at its own KV heads."""
    if geometry.kv_lora_rank:
        return Attention(variant=geometry.variant, n_kv_heads=geometry.n_kv_heads,
                         mla_latent=geometry.kv_lora_rank, mla_rope=geometry.qk_rope_head_dim,
                         mla_q_rank=geometry.q_lora_rank)
    return Attention(variant=geometry.variant, n_kv_heads=geometry.n_kv_heads)


def effective_window(geometry: Geometry, attention: Attention) -> int | None:
    """The window ``attention`` costs: its own, else the geometry's; 0 means none (None)."""
    if attention.window is None:
        return geometry.sliding_window
    return attention.window or None


# -- parameters ---------------------------------------------------------------------------

def attention_params(geometry: Geometry, attention: Attention) -> int:
    """Attention parameters of all layers for ``attention`` on this geometry.

    Per layer: W_Q d*nh*dh (absent for wq_identity, q_eq_k, q_eq_k_eq_v),
    W_K d*nkv*dh, W_V d*nkv*dh (absent for k_eq_v, q_eq_k_eq_v), W_O nh*dh*d,
    and their biases where the model has them. MLA (DeepSeek-V2 section 2.1,
    Hugging Face ``DeepseekV3Attention``): the query W_Q d*nh*(dh+rope), or
    compressed W_DQ d*q_rank + its norm q_rank + W_UQ q_rank*nh*(dh+rope); W_DKV
    d*latent and W_KR d*rope (one matrix, ``kv_a_proj_with_mqa``), the latent's
    norm latent, W_UK latent*nh*nope, W_UV latent*nh*v, W_O nh*v*d, where nope
    and v are the geometry's ``qk_nope_head_dim`` and ``v_head_dim`` (default d_head).
    """
    d, nh, dh = geometry.d_model, geometry.n_heads, geometry.d_head
    nkv = attention.n_kv_heads or geometry.n_kv_heads
    check_kv_heads(geometry.name, nh, nkv)
    if attention.mla_latent:
        r, rope, qr = attention.mla_latent, attention.mla_rope, attention.mla_q_rank
        nope, v = geometry.qk_nope_head_dim or dh, geometry.v_head_dim or dh
        query = d * qr + qr + qr * nh * (nope + rope) if qr else d * nh * (nope + rope)
        per_layer = query + d * (r + rope) + r + r * nh * (nope + v) + nh * v * d
        return geometry.n_layers * per_layer
    q = 0 if attention.variant in Q_DROPPED else d * nh * dh
    k = d * nkv * dh
    v = 0 if attention.variant in KV_TIED else d * nkv * dh
    o = nh * dh * d
    per_layer = q + k + v + o
    if geometry.bias or geometry.qkv_bias:
        per_layer += (0 if attention.variant in Q_DROPPED else nh * dh) + nkv * dh
        per_layer += 0 if attention.variant in KV_TIED else nkv * dh
    if geometry.bias:
        per_layer += d
    return geometry.n_layers * per_layer


def embedding_params(geometry: Geometry) -> tuple[int, int]:
    """(input embedding tables, output head): vocab*d + n_positions*d, and vocab*d if untied."""
    d = geometry.d_model
    inputs = geometry.vocab * d + geometry.n_positions * d
    head = 0 if geometry.tied_embeddings else geometry.vocab * d
    return inputs, head


def formula_params(geometry: Geometry, attention: Attention) -> int:
    """Total parameters from the geometry: embeddings, attention, MLP, norms, head."""
    d = geometry.d_model
    d_mlp = geometry.d_mlp or 4 * d
    mlp = (3 if geometry.mlp == "gated" else 2) * d * d_mlp
    if geometry.bias:
        mlp += d_mlp + d
    norm = d * (2 if geometry.norm == "layernorm" and geometry.bias else 1)
    if geometry.norm == "none":
        norm = 0
    inputs, head = embedding_params(geometry)
    return (inputs + head + geometry.n_layers * (mlp + 2 * norm) + norm
            + attention_params(geometry, attention))


def params(geometry: Geometry, attention: Attention) -> tuple[int, int]:
    """(total, attention) parameters of ``geometry`` under ``attention``.

    A geometry that carries known counts (a checkpoint) keeps them for its
    native configuration; any other is the known total plus the attention
    difference: total' = total - attn(native) + attn(target).
    """
    native = native_attention(geometry)
    attn = attention_params(geometry, attention)
    if geometry.params_total is None:
        return formula_params(geometry, attention), attn
    native_attn = geometry.params_attention if geometry.params_attention is not None \
        else attention_params(geometry, native)
    delta = attn - attention_params(geometry, native)
    return geometry.params_total + delta, native_attn + delta


# -- cache --------------------------------------------------------------------------------

def kv_bytes_per_token(geometry: Geometry, attention: Attention, kv_dtype: str = "bf16", *,
                       group_size: int = 64, group_overhead_bytes: float = 4.0) -> float:
    """Cache bytes one token adds: cache layers * n_cached * n_kv_heads * d_head * bytes/elem,
    summed over the layer types (:func:`kv_layer_rows`; a token inside every window).

    cache layers = ceil(n_layers / layers_per_cache); n_cached = 1 for K=V
    variants, else 2. MLA caches (kv_lora_rank + qk_rope_head_dim) elements per
    cache layer: one latent and the decoupled rotary key, shared by all heads.
    """
    b = bytes_per_element(kv_dtype, group_size=group_size, group_overhead_bytes=group_overhead_bytes)
    return sum(r["bytes_per_token"] for r in _type_rows(geometry, attention, b))


def resolved_layer_types(geometry: Geometry, attention: Attention) -> tuple[LayerType, ...]:
    """The layer types ``attention`` costs: the geometry's (one type of every layer, window
    ``sliding_window``, for a uniform stack), with ``attention``'s overrides: ``window`` 0 makes
    every layer global, another window replaces the sliding layers' (every layer's when uniform);
    ``n_kv_heads`` other than the model's sets every type's KV heads."""
    types = geometry.layer_types or (LayerType("attention", geometry.n_layers, window=geometry.sliding_window),)
    heads = attention.n_kv_heads if attention.n_kv_heads not in (None, geometry.n_kv_heads) else None
    out = []
    for t in types:
        changes: dict = {}
        if attention.window == 0:
            changes["window"] = None
        elif attention.window is not None and (t.window or not geometry.layer_types):
            changes["window"] = attention.window
        if heads is not None:
            changes["n_kv_heads"] = heads
        out.append(replace(t, **changes) if changes else t)
    return tuple(out)


def _type_rows(geometry: Geometry, attention: Attention, bytes_per_elem: float) -> list[dict]:
    """Per layer type: its geometry, cache layers and bytes/token (module docstring of
    :mod:`analysis.kv_layers`)."""
    if attention.variant not in ALL_VARIANTS:
        raise AnalysisError(f"variant must be one of {', '.join(ALL_VARIANTS)}, got {attention.variant!r}")
    if attention.layers_per_cache < 1:
        raise AnalysisError(f"layers per shared cache must be >= 1, got {attention.layers_per_cache}")
    check_kv_heads(geometry.name, geometry.n_heads, attention.n_kv_heads or geometry.n_kv_heads)
    rows = []
    for t in resolved_layer_types(geometry, attention):
        # a type's own head count (Gemma 4's global layers) stands as the config declares it
        cache = type_cache(t, attention.variant, geometry.n_kv_heads, geometry.d_head, bytes_per_elem,
                           layers_per_cache=attention.layers_per_cache,
                           mla_width=(attention.mla_latent + attention.mla_rope) if attention.mla_latent else None)
        rows.append({"name": t.name, "n_layers": t.n_layers, "shared": t.shared, **cache, "window": t.window})
    return rows


def kv_layer_rows(geometry: Geometry, attention: Attention, context: float, kv_dtype: str = "bf16", *,
                  engine: str = "datasheet", max_num_batched_tokens: int = 8192, group_size: int = 64,
                  group_overhead_bytes: float = 4.0) -> list[dict]:
    """Per layer type at ``context``: name, layers, shared, cache_layers, n_kv_heads, d_head_k,
    d_head_v, window, bytes_per_token, tokens (what each of its layers holds, by ``engine``'s
    rule) and bytes (bytes_per_token * tokens). Their ``bytes`` sum to one user's cache."""
    b = bytes_per_element(kv_dtype, group_size=group_size, group_overhead_bytes=group_overhead_bytes)
    rows = _type_rows(geometry, attention, b)
    for r in rows:
        r["tokens"] = cached_tokens_for(r["window"], context, engine, max_num_batched_tokens=max_num_batched_tokens)
        r["bytes"] = r["bytes_per_token"] * r["tokens"]
    return rows


def kv_bytes_per_user(geometry: Geometry, attention: Attention, context: float, kv_dtype: str = "bf16",
                      **kw) -> float:
    """One user's cache at ``context``: the sum over :func:`kv_layer_rows`."""
    return sum(r["bytes"] for r in kv_layer_rows(geometry, attention, context, kv_dtype, **kw))


def cache_layers(geometry: Geometry, attention: Attention) -> int:
    if attention.layers_per_cache < 1:
        raise AnalysisError(f"layers per shared cache must be >= 1, got {attention.layers_per_cache}")
    return math.ceil(geometry.n_layers / attention.layers_per_cache)


def cached_tokens(geometry: Geometry, attention: Attention, context: float) -> float:
    """min(context, window): a sliding-window layer keeps only the last ``window`` tokens."""
    window = effective_window(geometry, attention)
    return min(context, window) if window else context


# -- attention FLOPs ---------------------------------------------------------------------

def causal_pairs(prompt: int, window: int | None) -> int:
    """(query, key) pairs a causal prefill of ``prompt`` tokens scores: sum over i = 1..P of
    min(i, window) = P(P+1)/2 without a window."""
    p = int(prompt)
    if not window or p <= window:
        return p * (p + 1) // 2
    return window * (window + 1) // 2 + (p - window) * window


def attention_flops_per_pair(geometry: Geometry, attention: Attention, phase: str) -> int:
    """FLOPs of one (query, key) pair summed over layers and heads (multiply-add = 2 FLOPs).

    q.k and p.v: 4 * n_layers * n_heads * d_head. MLA: keys decompressed in
    prefill, 2 * L * nh * (nope + rope + v) (nope = v = d_head unless the geometry
    says otherwise); absorbed in decode (scores and values over the latent),
    2 * L * nh * (2 * latent + rope)."""
    L, nh, dh = geometry.n_layers, geometry.n_heads, geometry.d_head
    if attention.mla_latent:
        if phase == "decode":
            width = 2 * attention.mla_latent
        else:
            width = (geometry.qk_nope_head_dim or dh) + (geometry.v_head_dim or dh)
        return 2 * L * nh * (width + attention.mla_rope)
    return 4 * L * nh * dh


# -- what a comparison shows ---------------------------------------------------------------

def baseline_attention(geometry: Geometry) -> Attention:
    """The reference: separate Q, K, V with the geometry's own KV heads and window."""
    return Attention(variant="qkv", n_kv_heads=geometry.n_kv_heads)


def standard_configs(geometry: Geometry, n_kv_heads: int | None = None) -> list[Attention]:
    """Every variant at ``n_kv_heads`` (default: the geometry's), then K=V with GQA
    (n_heads/4 KV heads, when it divides) and with MQA; an MLA model's own attention
    first (its row type ``mla``)."""
    nkv = n_kv_heads or geometry.n_kv_heads
    configs = [native_attention(geometry)] if geometry.kv_lora_rank else []
    configs += [Attention(variant=v, n_kv_heads=nkv) for v in VARIANTS]
    extra = []
    g4 = geometry.n_heads // 4
    if geometry.n_heads % 4 == 0 and g4 >= 1 and g4 != nkv:
        extra.append(g4)
    if nkv != 1:
        extra.append(1)
    for kv in extra:
        configs.append(Attention(variant="qkv", n_kv_heads=kv))
        configs.append(Attention(variant="k_eq_v", n_kv_heads=kv))
    return configs


# -- from a checkpoint ----------------------------------------------------------------------

def geometry_from_info(info: dict, *, name: str | None = None) -> Geometry:
    """A Geometry from a checkpoint description (``inspect_checkpoint`` or a store row):
    keys n_layers, n_heads, n_kv_heads, d_model, d_head, variant, and the
    parameter counts as ``params: {total, attention}`` or ``params_total`` /
    ``params_attention``. The attention biases (none, Q/K/V only, or all) are the
    layout whose count equals ``params_attention``, so variants drop their biases too.
    MLA models: ``latent`` as ``inspect_checkpoint`` gives it (``kv_lora_rank``,
    ``q_lora_rank``, ``rope_dim``, ``nope_dim``, ``v_dim``), or the Hugging Face DeepSeek
    config names (``kv_lora_rank``, ``qk_rope_head_dim``, ``q_lora_rank``,
    ``qk_nope_head_dim``, ``v_head_dim``) at the top level or under ``mla``. Layer types
    (sliding windows, per-type heads, shared caches) from the checkpoint's own ``config``
    (:func:`analysis.kv_layers.layer_types_from_config`)."""
    missing = [k for k in ("n_layers", "n_heads", "n_kv_heads", "d_model", "d_head") if info.get(k) is None]
    label = name or str(info.get("path") or info.get("name") or "checkpoint")
    if missing:
        raise AnalysisError(f"{label}: checkpoint geometry lacks {', '.join(missing)}")
    p = info.get("params") or {}
    total = p.get("total", info.get("params_total"))
    attn = p.get("attention", info.get("params_attention"))
    variant = info.get("variant") or "qkv"
    if variant not in ALL_VARIANTS:
        raise AnalysisError(f"{label}: variant must be one of {', '.join(ALL_VARIANTS)}, got {variant!r}")
    latent = info.get("latent") or {}
    mla = {"kv_lora_rank": latent.get("kv_lora_rank"), "q_lora_rank": latent.get("q_lora_rank"),
           "qk_rope_head_dim": latent.get("rope_dim"), "qk_nope_head_dim": latent.get("nope_dim"),
           "v_head_dim": latent.get("v_dim")}
    mla.update({k: v for k, v in (info.get("mla") or {}).items() if v is not None})
    for key in ("kv_lora_rank", "qk_rope_head_dim", "q_lora_rank", "qk_nope_head_dim", "v_head_dim"):
        if info.get(key) is not None:
            mla[key] = info[key]

    def dim(key: str) -> int | None:
        return int(mla[key]) if mla.get(key) else None

    g = Geometry(name=label, n_layers=int(info["n_layers"]), n_heads=int(info["n_heads"]),
                 n_kv_heads=int(info["n_kv_heads"]), d_model=int(info["d_model"]),
                 d_head=int(info["d_head"]), variant=variant,
                 params_total=int(total) if total else None,
                 params_attention=int(attn) if attn is not None else None,
                 kv_lora_rank=dim("kv_lora_rank"), qk_rope_head_dim=dim("qk_rope_head_dim") or 0,
                 q_lora_rank=dim("q_lora_rank"), qk_nope_head_dim=dim("qk_nope_head_dim"),
                 v_head_dim=dim("v_head_dim"),
                 layer_types=layer_types_from_config(info.get("config") or {}),
                 source=f"checkpoint {label}")
    if attn is not None and not g.kv_lora_rank:
        # Which biases the attention has follows from its parameter count: the count
        # equals exactly one of no biases, Q/K/V biases only, or biases everywhere.
        native = Attention(variant=variant, n_kv_heads=g.n_kv_heads)
        for flags in ({"bias": True}, {"qkv_bias": True}):
            candidate = replace(g, **flags)
            if attention_params(candidate, native) == int(attn):
                return candidate
    return g
