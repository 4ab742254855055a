"""Per-layer-type KV-cache geometry: hybrid local/global stacks, other heads per type, shared caches.

Many deployed models mix layer types: Gemma 2 alternates sliding-window (4096)
and global layers, Gemma 3 has five sliding layers (window 512 or 1024) per
global one, Gemma 4's global layers have their own KV heads and head width,
gpt-oss alternates 128-token windows with full attention, Llama 4 has chunked
layers, and Gemma 3n / Gemma 4 let their last ``num_kv_shared_layers`` layers
reuse the cache of an earlier layer of the same type. A :class:`LayerType` is
one such group of layers; the cache of one user at a context of C tokens is::

    bytes/token (type)  = cache layers * (K width + V width) * kv heads * bytes/elem
                        = cache layers * K width * kv heads * bytes/elem          (K = V: one tensor)
    cache layers (type) = ceil((layers - shared layers) / layers per shared cache)
    tokens (type)       = C                                   (full attention)
                        = min(C, window)                      (sliding, the arithmetic: a token sees
                                                               itself and window - 1 before it)
                        = min(C, window - 1)                  (sliding, transformers' DynamicCache
                                                               after the forward: it keeps window - 1)
                        = 16 * (ceil(min(C, window - 1 + B) / 16) + 1)   (sliding, vLLM: B =
                                                               max_num_batched_tokens, blocks of 16)
                        = 16 * ceil(C / 16)                   (full attention, vLLM)
    bytes/user          = sum over types of bytes/token (type) * tokens (type)

``bytes/token`` of a model is the sum over types (what one token costs while
the context is shorter than every window); ``bytes/user`` at a context is no
longer bytes/token * context once a window is shorter than the context.

Reading a configuration (:func:`layer_types_from_config`), the spellings
across families, each from the model's ``configuration_*.py`` in transformers:

* ``layer_types``: a list per layer of ``full_attention``, ``sliding_attention``
  (window ``sliding_window``), ``chunked_attention`` (window
  ``attention_chunk_size``, Llama 4), or a layer without a growing KV cache
  (``linear_attention`` Qwen3-Next, ``mamba``, ``conv``...: no bytes per token).
* without ``layer_types``: ``sliding_window_pattern`` P (Gemma 3, Cohere 2:
  layer i is global when (i + 1) % P == 0), Gemma 2 (``model_type`` gemma2:
  even layers sliding), Qwen2's ``use_sliding_window`` with ``max_window_layers``
  (layers from that index on slide), else ``sliding_window`` on every layer
  (Mistral 7B v0.1).
* per-type heads: ``global_head_dim`` and ``num_global_key_value_heads``
  (Gemma 4's full-attention layers; the heads only where ``attention_k_eq_v``
  holds, as ``Gemma4TextConfig`` applies them), ``head_dim`` for the others; or
  ``per_layer_config`` (``{layer: {"head_dim", "num_key_value_heads"}}``, what
  transformers' own ``to_dict`` writes for Gemma 4).
* ``num_kv_shared_layers``: the last N layers cache nothing of their own.
* ``attention_k_eq_v`` (Gemma 4) ties the projections of global layers but the
  cached K (rotated) and V (normed) differ, so both are cached: no saving here.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, replace

from analysis.errors import AnalysisError
from analysis.variants import KV_TIED
from analysis.variants import kv_bytes_per_token as variant_kv_bytes

#: The engines whose sliding-window bookkeeping the calculator follows (module docstring).
ENGINES = ("datasheet", "transformers", "vllm")
#: vLLM's KV-cache block size (tokens per page), ``CacheConfig.block_size`` default 16.
VLLM_BLOCK_SIZE = 16

#: ``layer_types`` entries that attend over a window, and the config field holding it.
WINDOW_TYPES = {"sliding_attention": "sliding_window", "chunked_attention": "attention_chunk_size"}
#: ``layer_types`` entries with full causal attention.
FULL_TYPES = frozenset({"full_attention", "global", "attention"})


@dataclass(frozen=True)
class LayerType:
    """One group of layers that cache alike.

    ``n_kv_heads`` / ``d_head_k`` / ``d_head_v`` None: the model's own (``d_head_v``
    None: as wide as K; 0: the layer caches no V of its own, SVFormer's layers after the first). ``window`` None: full attention. ``shared`` of the
    ``n_layers`` reuse another layer's cache and add none. ``cached`` False: a
    layer with no growing KV cache (linear attention, a state-space layer)."""

    name: str
    n_layers: int
    window: int | None = None
    n_kv_heads: int | None = None
    d_head_k: int | None = None
    d_head_v: int | None = None
    shared: int = 0
    cached: bool = True

    def __post_init__(self):
        if not isinstance(self.n_layers, int) or self.n_layers < 1:
            raise AnalysisError(f"layer type {self.name!r}: layers must be an integer >= 1, got {self.n_layers!r}")
        for key in ("window", "n_kv_heads", "d_head_k", "d_head_v"):
            value = getattr(self, key)
            low = 0 if key == "d_head_v" else 1   # V width 0: the layer reads another layer's V (SVFormer)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
                raise AnalysisError(f"layer type {self.name!r}: {key} must be None or an integer >= {low}, "
                                    f"got {value!r}")
        if not 0 <= self.shared <= self.n_layers:
            raise AnalysisError(f"layer type {self.name!r}: shared layers must be 0..{self.n_layers}, "
                                f"got {self.shared!r}")

    def to_json(self) -> dict:
        return asdict(self)


def type_cache(t: LayerType, variant: str, n_kv_heads: int, d_head: int, bytes_per_elem: float, *,
               layers_per_cache: int = 1, mla_width: int | None = None) -> dict:
    """One type's cache_layers, n_kv_heads, d_head_k, d_head_v and bytes_per_token, the model's own
    ``n_kv_heads`` and ``d_head`` filling what the type leaves None (module docstring). ``mla_width``:
    latent + rotary elements a layer caches instead (MLA)."""
    layers = math.ceil((t.n_layers - t.shared) / layers_per_cache) if t.cached else 0
    nkv, dk = t.n_kv_heads or n_kv_heads, t.d_head_k or d_head
    dv = dk if variant in KV_TIED or t.d_head_v is None else t.d_head_v
    if mla_width:
        per_token = layers * mla_width * bytes_per_elem
    else:
        per_token = variant_kv_bytes(variant, layers, nkv, dk, bytes_per_elem, dv)
    return {"cache_layers": layers, "n_kv_heads": nkv, "d_head_k": dk, "d_head_v": dv, "bytes_per_token": per_token}


def cached_tokens_for(window: int | None, context: float, engine: str = "datasheet", *,
                      max_num_batched_tokens: int = 8192, block_size: int = VLLM_BLOCK_SIZE) -> float:
    """Tokens one layer holds for a user at ``context`` (formulas in the module docstring)."""
    if engine not in ENGINES:
        raise AnalysisError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "vllm":
        if window:
            return block_size * (math.ceil(min(context, window - 1 + max_num_batched_tokens) / block_size) + 1)
        return block_size * math.ceil(context / block_size)
    if not window:
        return context
    return min(context, window - 1 if engine == "transformers" else window)


# -- by hand ------------------------------------------------------------------------------------

_ITEM = re.compile(r"^\s*(?:(?P<count>\d+)\s*[x*]\s*)?(?P<name>[A-Za-z_][\w-]*)(?P<opts>(?::[^:,]+)*)\s*$")
_OPT_KEYS = {"kv": "n_kv_heads", "heads": "n_kv_heads", "dk": "d_head_k", "dh": "d_head_k",
             "dv": "d_head_v", "shared": "shared"}
SPEC_HELP = ("comma-separated [COUNTx]NAME[:WINDOW][:kv=H][:dh=D][:dv=D][:shared=N]; the pattern repeats "
             "in order to fill the model's layers (\"5xlocal:512,1xglobal\" on 62 layers: 52 local, 10 "
             "global); WINDOW makes a sliding layer, kv/dh/dv its KV heads and K/V head widths, shared how "
             "many of its layers reuse another's cache, NAME 'none' a layer without KV cache. "
             "YOCO (half sliding self-decoder, one global cache for the cross-decoder) on 24 layers: "
             "\"12xself:1024,12xcross:shared=11\"; SVFormer (V of the first layer only) on 12: "
             "\"1xfirst,11xrest:dv=0\"; MLA cached decompressed (K nope+rope 192, V 128 per head): "
             "\"all:dh=192:dv=128\"")


def parse_layer_types(spec: str, n_layers: int) -> tuple[LayerType, ...]:
    """Layer types from ``spec`` (:data:`SPEC_HELP`) for a model of ``n_layers`` layers."""
    pattern: list[tuple[str, dict]] = []
    for raw in str(spec).split(","):
        m = _ITEM.match(raw)
        if not m:
            raise AnalysisError(f"layer types {spec!r}: cannot read {raw.strip()!r}; expected {SPEC_HELP}")
        fields: dict = {}
        for opt in filter(None, m["opts"].split(":")):
            key, eq, value = opt.partition("=")
            target = "window" if not eq else _OPT_KEYS.get(key.strip().lower())
            if target is None:
                raise AnalysisError(f"layer types {spec!r}: unknown option {key.strip()!r} in {raw.strip()!r}; "
                                    f"expected one of {', '.join(_OPT_KEYS)}")
            text = (value if eq else key).strip()
            if not text.isdigit():
                raise AnalysisError(f"layer types {spec!r}: {target} must be a whole number, got {text!r}")
            fields[target] = int(text)
        pattern += [(m["name"], fields)] * int(m["count"] or 1)
    if len(pattern) > n_layers:
        raise AnalysisError(f"layer types {spec!r}: {len(pattern)} layers, but the model has {n_layers}")
    layers = [pattern[i % len(pattern)] for i in range(n_layers)]
    shared = {name: f.pop("shared") for name, f in pattern if "shared" in f}   # a total per type
    types = _group([(name, {**f, "cached": name.lower() != "none"}) for name, f in layers])
    return tuple(replace(t, shared=shared[t.name]) if t.name in shared else t for t in types)


def _group(layers: list[tuple[str, dict]]) -> tuple[LayerType, ...]:
    """One LayerType per distinct (name, fields), in order of first appearance; ``shared`` summed."""
    groups: dict[tuple, dict] = {}
    for name, fields in layers:
        key = (name, tuple(sorted((k, v) for k, v in fields.items() if k != "shared")))
        g = groups.setdefault(key, {"name": name, "n_layers": 0, "shared": 0,
                                    **{k: v for k, v in fields.items() if k != "shared"}})
        g["n_layers"] += 1
        g["shared"] += fields.get("shared", 0)
    return tuple(LayerType(**g) for g in groups.values())


# -- from a configuration -------------------------------------------------------------------------

def _text_config(config: dict) -> dict:
    """The language model's config: ``text_config`` of a multimodal wrapper, else the config."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) and inner.get("num_hidden_layers") else config


def _int(config: dict, key: str) -> int | None:
    value = config.get(key)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def per_layer_kinds(config: dict) -> list[str] | None:
    """``layer_types`` of ``config``, or the list its older fields imply (module docstring); None
    when the config says nothing about layer types or windows (every layer full attention)."""
    c = _text_config(config)
    n = _int(c, "num_hidden_layers")
    types = c.get("layer_types")
    if isinstance(types, list) and types:
        if n is not None and len(types) != n:
            raise AnalysisError(f"config: layer_types lists {len(types)} layers, num_hidden_layers is {n}")
        return [str(t) for t in types]
    if n is None or not _int(c, "sliding_window"):
        return None
    pattern = _int(c, "sliding_window_pattern")
    if pattern:
        return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)]
    if c.get("model_type") == "gemma2":
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    if "use_sliding_window" in c:
        if not c.get("use_sliding_window"):
            return None
        first = _int(c, "max_window_layers") or 0
        return ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    return ["sliding_attention"] * n


def layer_types_from_config(config: dict) -> tuple[LayerType, ...]:
    """The layer types a checkpoint's config declares (module docstring); ``()`` when every
    layer is alike with full attention (the uniform formula applies)."""
    c = _text_config(config or {})
    kinds = per_layer_kinds(c)
    shared_n = _int(c, "num_kv_shared_layers") or 0
    if kinds is None and not shared_n:
        return ()
    n = _int(c, "num_hidden_layers") or len(kinds or [])
    kinds = kinds or ["full_attention"] * n
    gemma4 = str(c.get("model_type", "")).startswith("gemma4")
    global_kv = _int(c, "num_global_key_value_heads") if c.get("attention_k_eq_v", not gemma4) else None
    global_dh = _int(c, "global_head_dim")
    per_layer = c.get("per_layer_config") if isinstance(c.get("per_layer_config"), dict) else {}
    first_shared = n - shared_n
    layers = []
    for i, kind in enumerate(kinds):
        fields: dict = {"shared": 1 if i >= first_shared else 0}
        if kind in WINDOW_TYPES:
            window = _int(c, WINDOW_TYPES[kind])
            if window is None:
                raise AnalysisError(f"config: layer {i} is {kind} but {WINDOW_TYPES[kind]} is not set")
            fields["window"] = window
        elif kind in FULL_TYPES:
            if global_kv:
                fields["n_kv_heads"] = global_kv
            if global_dh:
                fields["d_head_k"] = global_dh
        else:
            fields["cached"] = False
        own = per_layer.get(str(i), per_layer.get(i)) or {}
        if _int(own, "head_dim"):
            fields["d_head_k"] = _int(own, "head_dim")
        if _int(own, "num_key_value_heads"):
            fields["n_kv_heads"] = _int(own, "num_key_value_heads")
        layers.append((kind, fields))
    return _group(layers)


def describe(types: tuple[LayerType, ...]) -> str:
    """``"5 x sliding_attention (window 512), 1 x full_attention"``."""
    parts = []
    for t in types:
        extra = [f"window {t.window}"] if t.window else []
        extra += [f"{t.n_kv_heads} KV heads"] if t.n_kv_heads else []
        extra += [f"d_head {t.d_head_k}" + (f"/{t.d_head_v}" if t.d_head_v else "")] if t.d_head_k else []
        extra += [f"{t.shared} sharing a cache"] if t.shared else []
        extra += ["no KV cache"] if not t.cached else []
        parts.append(f"{t.n_layers} x {t.name}" + (f" ({', '.join(extra)})" if extra else ""))
    return ", ".join(parts)
