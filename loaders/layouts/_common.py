"""Helpers shared by the layout converters: config lookup, layer discovery,
shape validation, reshapes into canonical per-head form, parameter counts.

Reshape conventions (x is a row vector, canonical ``q_h = x @ W_Q[h]``):

* ``nn.Linear`` stores ``W`` as ``[out, in]`` and computes ``x @ W.T``. Its rows
  ``h*d_head:(h+1)*d_head`` are head ``h``'s outputs, so
  ``W_Q[h] = W[h*d_head:(h+1)*d_head, :].T``: ``rows_to_heads``.
* A Linear output projection ``[d_model, n*d_head]`` reads head ``h`` from
  columns ``h*d_head:(h+1)*d_head``: ``W_O[h] = W[:, cols].T``: ``cols_to_heads``.
* GPT-2's ``Conv1D`` stores ``[in, out]`` and computes ``x @ W`` (no transpose):
  ``conv_cols_to_heads`` / ``conv_rows_to_heads``.

Every function returns fresh tensors (``clone``), never views of the source's
tensors, so callers may modify results without touching the checkpoint.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Callable, Iterable

import torch

from loaders.canonical import AttentionWeights, ModelMeta
from loaders.errors import CheckpointFormatError
from loaders.tensor_source import TensorSource

#: Non-parameter buffers that some frameworks save next to the weights:
#: nanoGPT/GPT-2/GPT-J/NeoX causal masks (``attn.bias`` [1, 1, T, T],
#: ``masked_bias``), rotary ``inv_freq`` and cached sin/cos tables, BERT's
#: ``position_ids``/``token_type_ids``, DeepSeek-V3's router ``e_score_correction_bias``
#: (a buffer updated outside the gradient). They are excluded from ``params_total``.
_BUFFER_SUFFIXES = ("masked_bias", "inv_freq", "position_ids", "token_type_ids",
                    "embed_positions", "freqs_cos", "freqs_sin", "cos_cached", "sin_cached",
                    "e_score_correction_bias")

#: Output-embedding / input-embedding key endings checked for weight tying.
_OUT_EMBED = ("lm_head.weight", "output.weight", "embed_out.weight")
_IN_EMBED = ("wte.weight", "embed_tokens.weight", "tok_embeddings.weight",
             "word_embeddings.weight", "embed_in.weight")


def fmt_shape(shape: Iterable[int]) -> str:
    """``(48, 20)``; a 1-d shape prints as ``(48)``."""
    return "(" + ", ".join(str(int(s)) for s in shape) + ")"


def cfg(source: TensorSource, *names: str, default=None):
    """The first of ``names`` present (and not None) in the source's config."""
    config = source.config or {}
    for name in names:
        if config.get(name) is not None:
            return config[name]
    return default


def as_int(source: TensorSource, value, what: str) -> int:
    """A config value that must be a whole number (a JSON int, or a float with
    no fractional part); anything else names the field and what was found."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
        raise CheckpointFormatError(
            source.path, f"config {what} must be a whole number, found {value!r:.80}")
    return int(value)


def cfg_int(source: TensorSource, *names: str, default=None):
    """``cfg`` for a whole-number field; ``default`` (from tensor shapes) is trusted."""
    for name in names:
        value = (source.config or {}).get(name)
        if value is not None:
            return as_int(source, value, repr(name))
    return default


def cfg_float(source: TensorSource, *names: str, default=None):
    """``cfg`` for a finite real-number field."""
    for name in names:
        value = (source.config or {}).get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise CheckpointFormatError(
                    source.path, f"config {name!r} must be a finite number, found {value!r:.80}")
            return float(value)
    return default


def declared_other(source: TensorSource, model_types) -> bool:
    """True when the config names a model type that is not one of ``model_types``
    (then a layout must not claim the file by its key names alone)."""
    mt = model_type(source)
    return mt is not None and mt not in model_types


def keys_match(source: TensorSource, model_types, pattern: str) -> bool:
    """The common ``detect``: no other declared model type, and a key matching ``pattern``."""
    return not declared_other(source, model_types) and any_match(source.keys(), pattern)


def model_type(source: TensorSource) -> str | None:
    mt = (source.config or {}).get("model_type")
    return str(mt).lower() if mt else None


def find_layers(source: TensorSource, pattern: str, keys: list[str] | None = None
                ) -> tuple[str, list[int]]:
    """Match ``pattern`` (a regex with groups ``p``: prefix, ``i``: layer index)
    against every key. Returns the prefix and the sorted layer indices, or
    ``("", [])`` when nothing matches. Raises when the matching keys disagree on
    the prefix or the layer indices have gaps."""
    rx = re.compile(pattern)
    prefixes: set[str] = set()
    layers: set[int] = set()
    for key in keys if keys is not None else source.keys():
        m = rx.match(key)
        if m:
            prefixes.add(m.group("p"))
            layers.add(int(m.group("i")))
    if not layers:
        return "", []
    if len(prefixes) > 1:
        raise CheckpointFormatError(
            source.path, f"attention weights under several prefixes {sorted(prefixes)}; "
                         "expected one model per file")
    idx = sorted(layers)
    if idx != list(range(len(idx))):
        raise CheckpointFormatError(
            source.path, f"attention weights found for layers {idx}; "
                         f"expected layers 0..{len(idx) - 1} without gaps")
    return prefixes.pop(), idx


def any_match(keys: Iterable[str], pattern: str) -> bool:
    rx = re.compile(pattern)
    return any(rx.match(k) for k in keys)


def check_layers(source: TensorSource, n_found: int, n_config) -> None:
    if n_config is not None and as_int(source, n_config, "layer count") != n_found:
        raise CheckpointFormatError(
            source.path, f"config gives {int(n_config)} layers; "
                         f"found attention weights for {n_found} layers")


def require(source: TensorSource, keys: Iterable[str], have: set[str], layout: str) -> None:
    """One error listing every missing key, sorted."""
    missing = sorted(k for k in keys if k not in have)
    if missing:
        shown = ", ".join(f"'{k}'" for k in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        raise CheckpointFormatError(
            source.path, f"missing attention tensors for layout {layout}: {shown}{more}")


def expect_shape(source: TensorSource, key: str, expected: tuple[int, ...], layer: int,
                 basis: str) -> None:
    """``layer 3 key 'k' has shape (48, 20); expected (16, 48) for d_model 16``."""
    found = tuple(source.shape(key))
    if found != tuple(expected):
        raise CheckpointFormatError(
            source.path, f"layer {layer} key '{key}' has shape {fmt_shape(found)}; "
                         f"expected {fmt_shape(expected)} for {basis}")


def need_int(source: TensorSource, value, what: str, names: tuple[str, ...]) -> int:
    if value is None:
        raise CheckpointFormatError(
            source.path, f"config has no {what} ({'/'.join(names)}); "
                         "it cannot be inferred from tensor shapes")
    return as_int(source, value, what)


def split_heads_check(source: TensorSource, d_model: int, n_heads: int, d_head: int | None
                      ) -> int:
    if d_head is not None:
        return as_int(source, d_head, "head_dim")
    if n_heads <= 0 or d_model % n_heads:
        raise CheckpointFormatError(
            source.path, f"d_model {d_model} is not divisible by {n_heads} heads")
    return d_model // n_heads


def basis(d_model: int, n_heads: int, n_kv: int, d_head: int) -> str:
    kv = f", {n_kv} kv heads" if n_kv != n_heads else ""
    return f"d_model {d_model}, {n_heads} heads{kv} of d_head {d_head}"


# ---- reshapes --------------------------------------------------------------

def fresh(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` that shares no memory with it, in ``t``'s own stride order.

    The reshapes above hand back transposed views of the stored matrices; a
    contiguous copy would transpose every projection element by element (half
    of reading a bfloat16 checkpoint), while a copy in the view's own layout is
    a linear ``memcpy``. The analysis reads the per-head matrices through
    ``matmul``, which takes either layout without copying.
    """
    return t.clone(memory_format=torch.preserve_format)


def rows_to_heads(w: torch.Tensor, n: int, d_head: int) -> torch.Tensor:
    """Linear ``[n*d_head, d_model]`` -> ``[n, d_model, d_head]``."""
    d = w.shape[1]
    return fresh(w.reshape(n, d_head, d).transpose(1, 2))  # (n, dh, d) -> (n, d, dh)


def cols_to_heads(w: torch.Tensor, n: int, d_head: int) -> torch.Tensor:
    """Linear output projection ``[d_model, n*d_head]`` -> ``[n, d_head, d_model]``."""
    d = w.shape[0]
    return fresh(w.reshape(d, n, d_head).permute(1, 2, 0))  # (d, n, dh) -> (n, dh, d)


def conv_cols_to_heads(w: torch.Tensor, n: int, d_head: int) -> torch.Tensor:
    """Conv1D ``[d_model, n*d_head]`` (x @ W) -> ``[n, d_model, d_head]``."""
    d = w.shape[0]
    return fresh(w.reshape(d, n, d_head).transpose(0, 1))  # (d, n, dh) -> (n, d, dh)


def conv_rows_to_heads(w: torch.Tensor, n: int, d_head: int) -> torch.Tensor:
    """Conv1D output projection ``[n*d_head, d_model]`` -> ``[n, d_head, d_model]``."""
    return fresh(w.reshape(n, d_head, w.shape[1]))


def bias_heads(b: torch.Tensor | None, n: int, d_head: int) -> torch.Tensor | None:
    """``[n*d_head]`` -> ``[n, d_head]``."""
    return None if b is None else fresh(b.reshape(n, d_head))


def expand_kv(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``[n_kv, ...]`` -> ``[n_heads, ...]`` with query head h reading kv head
    ``h // (n_heads // n_kv)`` (used only for tied ``W_Q = W_K``)."""
    group = n_heads // w.shape[0]
    return fresh(w.repeat_interleave(group, dim=0))


def identity_heads(d_model: int, n_heads: int, d_head: int, dtype: torch.dtype) -> torch.Tensor:
    """``[n, d_model, d_head]`` with ``I[h][h*d_head + j, j] = 1``: head h reads
    its slice ``x[h*d_head:(h+1)*d_head]``."""
    eye = torch.eye(d_model, n_heads * d_head, dtype=dtype)
    return fresh(eye.reshape(d_model, n_heads, d_head).transpose(0, 1))


def getter(source: TensorSource, have: set[str]) -> Callable[[str], torch.Tensor | None]:
    def get(key: str) -> torch.Tensor | None:
        return source.get(key) if key in have else None
    return get


# ---- metadata --------------------------------------------------------------

def _is_buffer(source: TensorSource, key: str) -> bool:
    if key.endswith(_BUFFER_SUFFIXES):
        return True
    # causal masks registered as ``attn.bias`` / ``attention.bias``: [1, 1, T, T]
    return key.endswith(".bias") and len(source.shape(key)) == 4


def params_total(source: TensorSource) -> int:
    """Sum of numel over every tensor except buffers; an output embedding equal
    to the input embedding (weight tying saved twice) is counted once. The
    config's ``tie_word_embeddings`` decides when present, else the values."""
    keys = [k for k in source.keys() if not _is_buffer(source, k)]
    total = sum(source.numel(k) for k in keys)
    outs = [k for k in keys if k.endswith(_OUT_EMBED)]
    ins = [k for k in keys if k.endswith(_IN_EMBED)]
    declared = (source.config or {}).get("tie_word_embeddings")
    for o in outs:
        for i in ins:
            if source.shape(o) == source.shape(i):
                if isinstance(declared, bool):
                    # The config says; reading two vocab-sized tensors to check
                    # would dominate the memory of `info` on a large model.
                    if declared:
                        total -= source.numel(o)
                    break
                a, b = source.get(o), source.get(i)
                if a.data_ptr() == b.data_ptr() or torch.equal(a, b):
                    total -= source.numel(o)
                    break
    return total


@dataclass(frozen=True)
class Geometry:
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int


def make_meta(source: TensorSource, *, architecture: str, variant: str, geom: Geometry,
              norm: str, positions: str, attn_scale: float | None, dtype_key: str,
              attention_keys: Iterable[str], **extra) -> ModelMeta:
    """``attention_keys``: every source tensor holding attention projection
    weights or biases; a tied tensor is one key, so it is counted once.
    ``extra``: the optional ``ModelMeta`` fields (``towers``, ``qk_norm``,
    ``logit_softcap``, ``latent``, ``notes``)."""
    if attn_scale is None:
        attn_scale = 1.0 / math.sqrt(geom.d_head)
    return ModelMeta(
        architecture=architecture, variant=variant, n_layers=geom.n_layers,
        n_heads=geom.n_heads, n_kv_heads=geom.n_kv_heads, d_model=geom.d_model,
        d_head=geom.d_head, norm=norm, positions=positions, attn_scale=float(attn_scale),
        dtype=source.dtype(dtype_key), params_total=params_total(source),
        params_attention=sum(source.numel(k) for k in set(attention_keys)),
        config=_jsonable(source.config or {}), **extra)


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, torch.Tensor) and obj.numel() == 1:
        return obj.item()
    return str(obj)


def layer_fn(build: Callable[[int], AttentionWeights]) -> Callable[[int], AttentionWeights]:
    """Wrap a per-layer builder: reshapes run without autograd; the results are
    ordinary tensors (not inference tensors), so callers may put them in modules."""
    def fn(i: int) -> AttentionWeights:
        with torch.no_grad():
            return build(i)
    return fn


# ---- the common "separate q, k, v, o Linear projections" shape ------------

def convert_separate(source: TensorSource, *, name: str, names: dict[str, str], layers: list[int],
                     d: int, n: int, n_kv: int, dh: int, norm: str, positions: str,
                     attn_scale: float | None, have: set[str]):
    """Layouts with one ``nn.Linear`` per projection. ``names`` maps ``q``,
    ``k``, ``v``, ``o`` to key stems with an ``{i}`` placeholder (``.weight``
    and the optional ``.bias`` are appended). Shapes: q ``[n*dh, d]``, k and v
    ``[n_kv*dh, d]``, o ``[d, n*dh]``; biases ``[rows]`` / ``[d]``."""
    why = basis(d, n, n_kv, dh)
    shapes = {"q": (n * dh, d), "k": (n_kv * dh, d), "v": (n_kv * dh, d), "o": (d, n * dh)}
    require(source, [names[r].format(i=i) + ".weight" for i in layers for r in "qkvo"], have, name)
    attn_keys = []
    for i in layers:
        for r in "qkvo":
            stem = names[r].format(i=i)
            expect_shape(source, stem + ".weight", shapes[r], i, why)
            attn_keys.append(stem + ".weight")
            if stem + ".bias" in have:
                expect_shape(source, stem + ".bias", (shapes[r][0],), i, why)
                attn_keys.append(stem + ".bias")
    geom = Geometry(len(layers), n, n_kv, d, dh)
    meta = make_meta(source, architecture=name, variant="qkv", geom=geom, norm=norm,
                     positions=positions, attn_scale=attn_scale,
                     dtype_key=names["q"].format(i=0) + ".weight", attention_keys=attn_keys)
    get = getter(source, have)

    def build(i: int) -> AttentionWeights:
        w = {r: get(names[r].format(i=i) + ".weight") for r in "qkvo"}
        b = {r: get(names[r].format(i=i) + ".bias") for r in "qkvo"}
        return AttentionWeights(
            layer=i,
            W_Q=rows_to_heads(w["q"], n, dh), W_K=rows_to_heads(w["k"], n_kv, dh),
            W_V=rows_to_heads(w["v"], n_kv, dh), W_O=cols_to_heads(w["o"], n, dh),
            b_Q=bias_heads(b["q"], n, dh), b_K=bias_heads(b["k"], n_kv, dh),
            b_V=bias_heads(b["v"], n_kv, dh),
            b_O=None if b["o"] is None else fresh(b["o"]))

    return meta, layer_fn(build)


# ---- fused q/k/v projections ----------------------------------------------

def split_concat(n: int, n_kv: int, d_head: int):
    """Rows ``[q (n*dh); k (n_kv*dh); v (n_kv*dh)]`` (Phi-3, Falcon multi-query)."""
    def split(t: torch.Tensor):
        a, b = n * d_head, (n + n_kv) * d_head
        return t[:a], t[a:b], t[b:]
    return split


def split_interleaved(n: int, d_head: int):
    """Rows grouped per head ``[n, 3, d_head]``: head h's q, k, v rows are
    adjacent (GPT-NeoX, Falcon-7B-style non-multi-query)."""
    def split(t: torch.Tensor):
        rest = t.shape[1:]
        t4 = t.reshape(n, 3, d_head, *rest)              # (n, 3, dh, ...)
        return (t4[:, 0].reshape(n * d_head, *rest), t4[:, 1].reshape(n * d_head, *rest),
                t4[:, 2].reshape(n * d_head, *rest))
    return split


def split_grouped(n: int, n_kv: int, d_head: int):
    """Rows grouped per kv head ``[n_kv, n/n_kv + 2, d_head]``: the group's
    queries, then its key, then its value (Falcon ``new_decoder_architecture``)."""
    g = n // n_kv

    def split(t: torch.Tensor):
        rest = t.shape[1:]
        t4 = t.reshape(n_kv, g + 2, d_head, *rest)       # (n_kv, g+2, dh, ...)
        return (t4[:, :g].reshape(n * d_head, *rest), t4[:, g].reshape(n_kv * d_head, *rest),
                t4[:, g + 1].reshape(n_kv * d_head, *rest))
    return split


def convert_fused(source: TensorSource, *, name: str, qkv: str, o: str, layers: list[int],
                  d: int, n: int, n_kv: int, dh: int, split, norm: str, positions: str,
                  attn_scale: float | None, have: set[str]):
    """Layouts with one fused ``nn.Linear`` ``[(n + 2*n_kv)*dh, d]`` for q, k, v
    (row order given by ``split``) and a Linear output projection ``[d, n*dh]``.
    ``qkv`` and ``o`` are key stems with an ``{i}`` placeholder."""
    why = basis(d, n, n_kv, dh)
    rows = (n + 2 * n_kv) * dh
    require(source, [s.format(i=i) + ".weight" for i in layers for s in (qkv, o)], have, name)
    attn_keys = []
    for i in layers:
        kq, ko = qkv.format(i=i), o.format(i=i)
        expect_shape(source, kq + ".weight", (rows, d), i, why)
        expect_shape(source, ko + ".weight", (d, n * dh), i, why)
        attn_keys += [kq + ".weight", ko + ".weight"]
        for kb, shape in ((kq + ".bias", (rows,)), (ko + ".bias", (d,))):
            if kb in have:
                expect_shape(source, kb, shape, i, why)
                attn_keys.append(kb)
    geom = Geometry(len(layers), n, n_kv, d, dh)
    meta = make_meta(source, architecture=name, variant="qkv", geom=geom, norm=norm,
                     positions=positions, attn_scale=attn_scale,
                     dtype_key=qkv.format(i=0) + ".weight", attention_keys=attn_keys)
    get = getter(source, have)

    def build(i: int) -> AttentionWeights:
        wq, wk, wv = split(get(qkv.format(i=i) + ".weight"))
        b = get(qkv.format(i=i) + ".bias")
        bq, bk, bv = split(b) if b is not None else (None, None, None)
        bo = get(o.format(i=i) + ".bias")
        return AttentionWeights(
            layer=i,
            W_Q=rows_to_heads(wq, n, dh), W_K=rows_to_heads(wk, n_kv, dh),
            W_V=rows_to_heads(wv, n_kv, dh),
            W_O=cols_to_heads(get(o.format(i=i) + ".weight"), n, dh),
            b_Q=bias_heads(bq, n, dh), b_K=bias_heads(bk, n_kv, dh), b_V=bias_heads(bv, n_kv, dh),
            b_O=None if bo is None else fresh(bo))

    return meta, layer_fn(build)


@dataclass(frozen=True)
class LayerGeometry:
    """What every Hugging Face-style converter reads first (see ``hf_geometry``)."""

    prefix: str
    layers: list[int]
    d: int
    n: int
    dh: int
    have: set


def hf_geometry(source: TensorSource, pattern: str, first_q: str, *,
                layer_keys=("num_hidden_layers",), d_keys=("hidden_size",),
                head_keys=("num_attention_heads",), head_dim_key: str | None = None) -> LayerGeometry:
    """Layers found by ``pattern`` (checked against the config's layer count),
    d_model from the config or the shape of ``first_q`` (a key template with
    ``{p}`` for the prefix; its input dimension is d_model), the head count
    from the config (it cannot come from shapes) and d_head."""
    keys = source.keys()
    p, layers = find_layers(source, pattern, keys)
    check_layers(source, len(layers), cfg(source, *layer_keys))
    d = cfg_int(source, *d_keys, default=source.shape(first_q.format(p=p))[1])
    n = need_int(source, cfg(source, *head_keys), "head count", tuple(head_keys))
    dh = split_heads_check(source, d, n, cfg(source, head_dim_key) if head_dim_key else None)
    return LayerGeometry(p, layers, d, n, dh, set(keys))


# ---- QK-norm ------------------------------------------------------------------

#: Metric names (``analysis.registry``) that read W_Q or W_K: a QK-norm changes
#: what they describe. Metrics of W_V, W_O and the value cache alone do not.
Q_METRICS = ("qk_symmetry", "qk_directionality", "erank_q", "stable_rank_q", "energy_rank90_q",
             "energy_rank99_q", "erank_qk", "stable_rank_qk", "energy_rank90_qk",
             "energy_rank99_qk", "norm_q", "wq_condition", "wq_basis_orth_defect",
             "wq_absorb_error", "logit_symmetry")
K_METRICS = ("kv_cosine_flat", "kv_cka", "kv_share_r2", "erank_k", "stable_rank_k",
             "energy_rank90_k", "energy_rank99_k", "norm_k", "kv_cka_act", "kv_cosine_act",
             "kv_share_r2_act", "erank_kcache")
V_METRICS = ("erank_v", "stable_rank_v", "energy_rank90_v", "energy_rank99_v", "norm_v",
             "erank_vcache")


def qk_norm_notes(scope: str) -> dict[str, str]:
    """The note each Q- or K-reading metric carries when q and k pass an RMSNorm
    (``scope`` ``head`` or ``layer``) after the projection."""
    over = "each head's d_head" if scope == "head" else "all heads' concatenated projection"
    why = (f"computed on W_Q/W_K before the model's QK-norm: attention uses g * q / rms(q) and "
           f"g * k / rms(k) (RMSNorm over {over}; gains q_norm/k_norm in the canonical layer), "
           "so the logits' bilinear form is W_Q diag(g_q g_k) W_K^T up to per-token scales")
    return {m: why for m in Q_METRICS + K_METRICS}


def norm_gains(source: TensorSource, key: str, n: int, d_head: int, scope: str, layer: int,
               why: str) -> None:
    """Check a QK-norm weight's shape: ``[d_head]`` for ``head`` scope (one gain
    shared by every head), ``[n*d_head]`` for ``layer`` scope."""
    expect_shape(source, key, (d_head,) if scope == "head" else (n * d_head,), layer, why)


def gains_to_heads(w: torch.Tensor, n: int, d_head: int, offset: float = 0.0) -> torch.Tensor:
    """A QK-norm weight ``[d_head]`` (shared by the heads) or ``[n*d_head]`` -> ``[n, d_head]``
    gains, ``offset`` added (Gemma's RMSNorm multiplies by ``1 + weight``)."""
    g = w.float() + offset if offset else w
    if g.dim() == 1 and g.shape[0] == d_head:
        return fresh(g.expand(n, d_head))                  # (dh,) -> (n, dh), shared gain
    return fresh(g.reshape(n, d_head))                     # (n*dh,) -> (n, dh)


def add_qk_norm(source: TensorSource, meta: ModelMeta, build: Callable[[int], AttentionWeights],
                *, q_key: str, k_key: str, scope: str, offset: float = 0.0, have: set[str],
                layers: list[int], name: str):
    """Wrap a converted separate-projection layout with its QK-norm weights
    (``q_key``/``k_key``: key templates with ``{i}``): shapes checked now, gains
    in every layer, ``meta.qk_norm`` and the notes set."""
    n, g, dh = meta.n_heads, meta.n_kv_heads, meta.d_head
    why = basis(meta.d_model, n, g, dh)
    require(source, [t.format(i=i) for i in layers for t in (q_key, k_key)], have, name)
    for i in layers:
        norm_gains(source, q_key.format(i=i), n, dh, scope, i, why)
        norm_gains(source, k_key.format(i=i), g, dh, scope, i, why)
    meta = replace(meta, qk_norm=scope, notes={**meta.notes, **qk_norm_notes(scope)})

    def with_norms(i: int) -> AttentionWeights:
        layer = build(i)
        layer.q_norm = gains_to_heads(source.get(q_key.format(i=i)), n, dh, offset)
        layer.k_norm = gains_to_heads(source.get(k_key.format(i=i)), g, dh, offset)
        return layer

    return meta, layer_fn(with_norms)
