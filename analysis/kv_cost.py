"""KV-cache size and serving cost of an attention variant (DESIGN.md, "KV-cache and serving cost").

Pure arithmetic on a model's geometry; no tensors. Every figure is in bytes,
bytes/s, FLOP/s, seconds or USD; a ``GB`` is 1e9 bytes and a ``GiB`` 2^30 bytes,
and the two are never mixed (the projection-sharing paper's "67x" cache
reduction for the 1.2B model with MQA and K=V mixes them: the consistent ratio
is 2 * 32 / 1 = 64x).

The formulas, in the order :func:`estimate` applies them (each one is also
returned, with the numbers filled in, in ``Estimate.steps``)::

    bytes/elem       = bits/8 + group overhead / group size     (int8, int4 only)
    n_cached         = 2, or 1 when K = V (k_eq_v, q_eq_k_eq_v)
    cache layers     = ceil(n_layers / layers per shared cache)  (cross-layer sharing)
    bytes/token      = cache layers * n_cached * n_kv_heads * d_head * bytes/elem
                     = cache layers * (kv_lora_rank + qk_rope_head_dim) * bytes/elem   (MLA)
    cached tokens    = min(context, window)
    bytes/user       = bytes/token * cached tokens
                     = sum over layer types of bytes/token (type) * tokens (type)   (hybrid stacks,
                       :mod:`analysis.kv_layers`: sliding layers hold their window, shared layers nothing)
    usable           = GPU memory * gpus per replica * utilisation          (engine "datasheet")
    users per GPU    = floor((usable - weights - reserve) / bytes/user), 0 if negative
                     = floor(vLLM's maximum concurrency)                    (engine "vllm",
                       :mod:`analysis.vllm_engine`: CUDA's GiB, its utilisation default, the
                       profiled activation peak, blocks of 16 tokens)
    batch/replica    = min(batch cap, users per GPU)       (the engine's max_num_seqs)
    GPUs needed      = ceil(users / batch per replica) * gpus per replica
    step time        = max((weight bytes read + batch * KV bytes read) / (bandwidth * eff_bw),
                           batch * FLOPs/token / (peak bf16 * eff_compute))
    tokens/s         = batch / step time, summed over replicas when the users
                       need more than one (split as evenly as possible)
    USD / 1M tokens  = price/hour * GPUs / (tokens/s * 3600) * 1e6
    USD / month      = price/hour * GPUs * 730 h            (8760 h / 12, always on)
    prefill FLOPs    = 2 * params read * prompt + attention FLOPs/pair * causal pairs
    prefill time     = max(prefill FLOPs / (peak bf16 * eff_compute),
                           (weight bytes read + prompt * bytes/token) / (bandwidth * eff_bw))
    TTFT             = prefill time;   TPOT = step time at the largest batch

Latency is one request's alone (no queueing, prefill not chunked or batched
with other requests, no sampling or network time): the prefill of a prompt
is compute-bound for any prompt of more than a few hundred tokens (2 FLOPs
per parameter per token against 2 bytes per parameter read once), decoding
is memory-bound until the batch is large. ``eff_compute`` is the model FLOPs
utilisation (MFU) and ``eff_bw`` the achieved fraction of peak bandwidth.
The prompt is ``prompt_len`` when given, else the whole context. Causal
pairs of a prompt of P tokens: sum over i = 1..P of min(i, window);
attention FLOPs per pair: :func:`analysis.kv_geometry.attention_flops_per_pair`
(q.k and p.v; for MLA, keys decompressed in prefill and W_UK, W_UV absorbed
into the query and output in decode, as DeepSeek-V2 section 2.1.2 describes).

The batch cap: vLLM's scheduler admits at most ``max_num_seqs`` sequences
per step, default 256 (``vllm/engine/arg_utils.py``; vLLM V1 raises it to
1024 on GPUs with at least 70 GiB other than the A100); a replica serves
min(cap, users whose cache fits) users at once, and more users need more
replicas even when memory would hold them.

Decode reads every weight once per step (except the input embedding tables, of
which it reads one row per token) and every cached K/V of every user in the
batch; FLOPs per token = 2 * (matmul parameters) + attention FLOPs per pair *
attended tokens. Sources: the roofline model (Williams,
Waterman, Patterson, CACM 2009) as applied to decoding in e.g. Pope et al.,
"Efficiently Scaling Transformer Inference" (MLSys 2023); MLA cache from
DeepSeek-V2 (arXiv 2405.04434, latent 512 + rotary key 64 per layer);
cross-layer KV sharing from Brandon et al. (arXiv 2405.12981); K=V and
head-sharing cache sizes from the projection-sharing paper (arXiv 2606.04032).

The model half (dtypes, ``Geometry``, ``Attention``, parameter counts, KV bytes
per token, the comparison set) is :mod:`analysis.kv_geometry`; its names are
importable from here as before.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import pandas as pd

from analysis import vllm_engine
from analysis.errors import AnalysisError
from analysis.gpus import GB, GIB, GPU
from analysis.kv_layers import ENGINES, cached_tokens_for
from analysis.variants import ALL_VARIANTS, n_cached
# The model half, re-exported so ``from analysis.kv_cost import Geometry, ...`` keeps working
# (presets, paper_claims, the page, the command and the tests import from here).
from analysis.kv_geometry import (  # noqa: F401
    DTYPE_ALIASES, DTYPE_BITS, KV_TIED, Q_DROPPED, QUANTISED, VARIANT_LABELS, VARIANTS, Attention, Geometry,
    attention_flops_per_pair, attention_params, baseline_attention, bytes_per_element, cache_layers,
    cached_tokens, causal_pairs, check_kv_heads, effective_window, embedding_params, formula_params,
    geometry_from_info, kv_bytes_per_token, kv_bytes_per_user, kv_layer_rows, native_attention,
    normalise_dtype, params, resolved_layer_types, standard_configs,
)

#: Sequences one replica decodes at once, at most: vLLM's ``max_num_seqs`` default.
DEFAULT_MAX_BATCH = 256
#: Hours in a month of continuous serving: 365 * 24 / 12.
HOURS_PER_MONTH = 730.0


@dataclass(frozen=True)
class Serving:
    """The deployment: lengths, dtypes, efficiency factors. Every factor is editable.

    ``context``: tokens cached per user (capacity). ``prompt_len`` and
    ``output_len``, when both given, set ``context`` to their sum if ``context``
    is None, and the decode step is costed at the mean length during
    generation, prompt + output/2; otherwise at the full context (worst case).
    ``users``: concurrent users; None fills one replica (min(batch cap, the
    largest batch whose caches fit)). ``reserve_bytes``: memory kept for
    activations, CUDA context and fragmentation. ``gpus_per_replica``: tensor-parallel GPUs that hold one copy
    of the weights (memory, bandwidth, FLOPs and price all multiply).
    ``max_batch``: the most sequences one replica decodes at once (vLLM's
    ``max_num_seqs``, default 256); None for no cap. ``prompt_len`` alone
    sets the prompt whose prefill gives the time to first token (else the
    whole context is the prompt).

    ``engine``: how capacity is counted. ``datasheet`` (the default): the datasheet's
    bytes * ``mem_utilisation`` - weights - ``reserve_bytes``, sliding layers holding
    min(context, window) tokens. ``transformers``: the same, with sliding layers holding
    what transformers' ``DynamicCache`` keeps (window - 1). ``vllm``: as vLLM computes it
    (:mod:`analysis.vllm_engine`) from ``gpu_memory_gib`` (None: the CUDA figure of a
    published log, else the datasheet's), ``gpu_memory_utilization``, ``activation_gib``
    (None: estimated from the model and ``max_num_batched_tokens``) and ``non_torch_gib``;
    ``mem_utilisation`` and ``reserve_bytes`` are then unused; ``weights_gib`` replaces the
    weights vLLM subtracts (as its log states them; None: parameters * bytes/elem).
    """

    context: int | None = 4096
    users: int | None = None
    prompt_len: int | None = None
    output_len: int | None = None
    kv_dtype: str = "bf16"
    weight_dtype: str = "bf16"
    kv_group_size: int = 64
    weight_group_size: int = 128
    group_overhead_bytes: float = 4.0
    mem_utilisation: float = 0.90
    reserve_bytes: float = 2 * GB
    bandwidth_efficiency: float = 0.80
    compute_efficiency: float = 0.50
    gpus_per_replica: int = 1
    max_batch: int | None = DEFAULT_MAX_BATCH
    engine: str = "datasheet"
    gpu_memory_gib: float | None = None
    gpu_memory_utilization: float = vllm_engine.DEFAULT_GPU_MEMORY_UTILIZATION
    activation_gib: float | None = None
    non_torch_gib: float = vllm_engine.DEFAULT_NON_TORCH_GIB
    max_num_batched_tokens: int = vllm_engine.DEFAULT_MAX_NUM_BATCHED_TOKENS
    weights_gib: float | None = None

    def resolved_context(self) -> int:
        if self.context is not None:
            return self.context
        if self.prompt_len is not None and self.output_len is not None:
            return self.prompt_len + self.output_len
        raise AnalysisError("serving: give a context length, or both prompt and output lengths")

    def prompt_tokens(self) -> int:
        """The prompt whose prefill is timed: ``prompt_len`` when given, else the whole context."""
        return self.prompt_len if self.prompt_len is not None else self.resolved_context()

    def decode_length(self) -> float:
        """Tokens attended per decode step: prompt + output/2 when both are given, else the context."""
        context = self.resolved_context()
        if self.prompt_len is not None and self.output_len is not None:
            return min(float(context), self.prompt_len + self.output_len / 2)
        return float(context)

    def validate(self) -> None:
        context = self.resolved_context()
        if context < 1:
            raise AnalysisError(f"serving: context must be >= 1 token, got {context}")
        for key in ("prompt_len", "output_len"):
            value = getattr(self, key)
            if value is not None and value < 0:
                raise AnalysisError(f"serving: {key} must be >= 0, got {value}")
        if self.users is not None and self.users < 1:
            raise AnalysisError(f"serving: users must be >= 1, got {self.users}")
        for key in ("mem_utilisation", "bandwidth_efficiency", "compute_efficiency"):
            value = getattr(self, key)
            if not 0 < value <= 1:
                raise AnalysisError(f"serving: {key} must be in (0, 1], got {value}")
        if self.reserve_bytes < 0:
            raise AnalysisError(f"serving: reserve_bytes must be >= 0, got {self.reserve_bytes}")
        if self.gpus_per_replica < 1:
            raise AnalysisError(f"serving: gpus_per_replica must be >= 1, got {self.gpus_per_replica}")
        if self.max_batch is not None and self.max_batch < 1:
            raise AnalysisError(f"serving: max_batch must be >= 1 (or None: no cap), got {self.max_batch}")
        normalise_dtype(self.kv_dtype)
        normalise_dtype(self.weight_dtype)
        if self.engine not in ENGINES:
            raise AnalysisError(f"serving: engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise AnalysisError(f"serving: gpu_memory_utilization must be in (0, 1], "
                                f"got {self.gpu_memory_utilization}")
        for key in ("activation_gib", "non_torch_gib", "weights_gib"):
            value = getattr(self, key)
            if value is not None and value < 0:
                raise AnalysisError(f"serving: {key} must be >= 0, got {value}")
        if self.max_num_batched_tokens < 1:
            raise AnalysisError(f"serving: max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")


# -- the estimate -------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """One line of the working: a name, its formula, the formula with numbers, the value."""

    name: str
    formula: str
    filled: str
    value: float | None
    unit: str


@dataclass
class Estimate:
    """Every figure of one configuration; ``steps`` shows how each was reached.

    ``users_per_gpu`` is what memory holds per replica; ``batch_per_replica``
    what one replica decodes at once (the batch cap may be lower, said by
    ``batch_limit``); ``gpus`` the GPUs needed for ``users``; ``ttft_s`` and
    ``tpot_s`` one request's time to first token and time per output token.

    ``bytes_per_token`` is what one token costs while it is inside every window (all
    layers cache it); ``bytes_per_user`` the true total at ``context`` (sliding layers
    hold their window only), and ``cached_tokens`` their ratio. ``layer_types``: per type,
    its layers, cache layers, KV heads, K and V head widths, window, tokens held, bytes/token
    and bytes. ``engine`` names how capacity was counted; with ``vllm``, ``max_concurrency``,
    ``kv_cache_bytes``, ``activation_bytes`` and ``concurrency_line`` are what vLLM logs at
    start-up (None otherwise), and ``users_per_gpu`` is floor(max_concurrency)."""

    label: str
    variant: str
    n_kv_heads: int
    params_total: int
    params_attention: int
    attention_share: float
    weights_bytes: float
    bytes_per_element_kv: float
    bytes_per_token: float
    context: int
    cached_tokens: float
    bytes_per_user: float
    bytes_all_users: float | None
    usable_bytes: float
    users_per_gpu: int
    fits: bool
    users: int
    replicas: int
    gpus: int
    batch: int
    decode_length: float
    step_time_s: float | None
    memory_time_s: float | None
    compute_time_s: float | None
    bound: str | None
    tokens_per_s: float
    tokens_per_s_per_user: float
    price_per_hour: float
    usd_per_million_tokens: float | None
    gpu: str
    max_batch: int | None = None
    batch_per_replica: int = 0
    batch_limit: str | None = None
    tokens_per_s_per_gpu: float = 0.0
    usd_per_month: float | None = None
    prompt_tokens: int = 0
    prefill_flops: float | None = None
    prefill_time_s: float | None = None
    prefill_bound: str | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    engine: str = "datasheet"
    layer_types: list[dict] = field(default_factory=list)
    max_concurrency: float | None = None
    kv_cache_bytes: float | None = None
    activation_bytes: float | None = None
    concurrency_line: str | None = None
    steps: list[Step] = field(default_factory=list)

    def to_json(self, *, with_steps: bool = False) -> dict:
        out = asdict(self)
        out.pop("steps")
        out["bytes_per_token_KiB"] = self.bytes_per_token / 1024
        out["bytes_per_user_GB"] = self.bytes_per_user / GB
        out["bytes_per_user_GiB"] = self.bytes_per_user / GIB
        out["weights_GB"] = self.weights_bytes / GB
        out["weights_GiB"] = self.weights_bytes / GIB
        if with_steps:
            out["steps"] = [asdict(s) for s in self.steps]
        return out


def _gb(x: float) -> str:
    return f"{x / GB:,.3f} GB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.3f} ms"


def estimate(geometry: Geometry, attention: Attention, serving: Serving, gpu: GPU) -> Estimate:
    """All serving figures for one configuration (formulas in the module docstring)."""
    serving.validate()
    if attention.variant not in ALL_VARIANTS:
        raise AnalysisError(f"variant must be one of {', '.join(ALL_VARIANTS)}, got {attention.variant!r}")
    nkv = attention.n_kv_heads or geometry.n_kv_heads
    check_kv_heads(geometry.name, geometry.n_heads, nkv)
    steps: list[Step] = []

    total, attn = params(geometry, attention)
    wb = bytes_per_element(serving.weight_dtype, group_size=serving.weight_group_size,
                           group_overhead_bytes=serving.group_overhead_bytes)
    weights = total * wb
    steps.append(Step("parameters", "embeddings + layers * (attention + MLP + norms) + head",
                      f"{total:,} of which attention {attn:,} ({attn / total:.1%})", total, "parameters"))
    steps.append(Step("weight memory", "parameters * bytes/elem (weights)",
                      f"{total:,} * {wb:g} = {_gb(weights)}", weights, "bytes"))

    kb = bytes_per_element(serving.kv_dtype, group_size=serving.kv_group_size,
                           group_overhead_bytes=serving.group_overhead_bytes)
    layers = cache_layers(geometry, attention)
    per_token = kv_bytes_per_token(geometry, attention, serving.kv_dtype, group_size=serving.kv_group_size,
                                   group_overhead_bytes=serving.group_overhead_bytes)
    context = serving.resolved_context()
    rows = kv_layer_rows(geometry, attention, context, serving.kv_dtype, engine=serving.engine,
                         max_num_batched_tokens=serving.max_num_batched_tokens, group_size=serving.kv_group_size,
                         group_overhead_bytes=serving.group_overhead_bytes)
    hybrid = bool(geometry.layer_types)
    if hybrid:
        filled = " + ".join(
            f"{r['cache_layers']} * {r['n_kv_heads']} * ({r['d_head_k']}"
            + (")" if attention.variant in KV_TIED or attention.mla_latent else f" + {r['d_head_v']})")
            + f" * {kb:g}" for r in rows)
        filled += f" = {per_token:,.1f} B ({per_token / 1024:,.3f} KiB)"
        formula = ("sum over layer types of cache layers * n_kv_heads * (K width + V width) * bytes/elem "
                   "(K = V: K width only; shared layers cache nothing)")
    elif attention.mla_latent:
        filled = (f"{layers} * ({attention.mla_latent} + {attention.mla_rope}) * {kb:g} "
                  f"= {per_token:,.1f} B ({per_token / 1024:,.3f} KiB)")
        formula = "cache layers * (kv_lora_rank + qk_rope_head_dim) * bytes/elem (MLA: shared by all heads)"
    else:
        filled = (f"{layers} * {n_cached(attention.variant)} * {nkv} * {geometry.d_head} * {kb:g} "
                  f"= {per_token:,.1f} B ({per_token / 1024:,.3f} KiB)")
        formula = "cache layers * n_cached * n_kv_heads * d_head * bytes/elem"
    steps.append(Step("KV bytes per token", formula, filled, per_token, "bytes"))

    per_user = sum(r["bytes"] for r in rows)
    tokens = per_user / per_token if per_token > 0 else float(context)
    rule = {"datasheet": "min(context, window)", "transformers": "min(context, window - 1)",
            "vllm": "blocks of 16: 16 * ceil(context / 16), sliding 16 * (ceil(min(context, window - 1 + "
                    "max_num_batched_tokens) / 16) + 1)"}[serving.engine]
    if hybrid or serving.engine != "datasheet":
        steps.append(Step("KV bytes per user", f"sum over layer types of bytes/token * tokens held, {rule}",
                          " + ".join(f"{r['bytes_per_token']:,.1f} * {r['tokens']:,.0f}" for r in rows)
                          + f" = {_gb(per_user)} ({per_user / GIB:,.3f} GiB)", per_user, "bytes"))
    else:
        steps.append(Step("KV bytes per user", "bytes/token * min(context, window)",
                          f"{per_token:,.1f} * {tokens:,.0f} = {_gb(per_user)} ({per_user / GIB:,.3f} GiB)",
                          per_user, "bytes"))

    n = serving.gpus_per_replica
    cap_engine = None
    if serving.engine == "vllm":
        total_mem, mem_source = vllm_engine.total_memory_bytes(gpu.name, gpu.memory_bytes, serving.gpu_memory_gib)
        if serving.activation_gib is not None:
            act, act_source = serving.activation_gib * GIB, "given"
        else:
            act = vllm_engine.activation_estimate(geometry.d_model, geometry.d_mlp or 4 * geometry.d_model,
                                                  geometry.vocab, serving.max_num_batched_tokens)
            act_source = (f"estimated: {serving.max_num_batched_tokens:,} * (3 * {geometry.d_mlp or 4 * geometry.d_model}"
                          f" + 3 * {geometry.d_model}) * 2 + {min(256, serving.max_num_batched_tokens)} * "
                          f"{geometry.vocab} * 4")
        engine_weights = serving.weights_gib * GIB if serving.weights_gib is not None else weights
        page, per_request = vllm_engine.pages([(r["cache_layers"], r["bytes_per_token"] / r["cache_layers"]
                                                if r["cache_layers"] else 0.0, r["tokens"]) for r in rows])
        cap_engine = vllm_engine.capacity(
            total_bytes=total_mem * n, utilization=serving.gpu_memory_utilization, weights_bytes=engine_weights,
            non_torch_bytes=serving.non_torch_gib * GIB * n, activation_bytes=act * n, activation_source=act_source,
            page_bytes=page, blocks_per_request=per_request, context=context)
        usable = cap_engine.usable_bytes
        free = cap_engine.kv_cache_bytes
        users_per_gpu = max(0, math.floor(cap_engine.max_concurrency))
        steps.append(Step("vLLM usable memory", "total GPU memory (CUDA, GiB) * GPUs * gpu_memory_utilization",
                          f"{total_mem / GIB:,.2f} GiB * {n} * {serving.gpu_memory_utilization:g} = "
                          f"{usable / GIB:,.2f} GiB [{mem_source}]", usable, "bytes"))
        steps.append(Step("vLLM KV cache memory", "usable - weights - non-torch memory - activation peak",
                          f"{usable / GIB:,.2f} - {engine_weights / GIB:,.2f} - {cap_engine.non_torch_bytes / GIB:,.2f} - "
                          f"{cap_engine.activation_bytes / GIB:,.2f} GiB = {free / GIB:,.2f} GiB "
                          f"[activation {act_source}]", free, "bytes"))
        steps.append(Step("vLLM maximum concurrency",
                          "floor(KV cache bytes / page bytes) / blocks a request holds (page: 16 tokens of one "
                          "KV-cache group's layers; every layer when uniform)",
                          f"{cap_engine.num_blocks:,} blocks / {cap_engine.blocks_per_request:,} blocks per request = "
                          f"{cap_engine.max_concurrency:.4f}: \"{cap_engine.line()}\"", cap_engine.max_concurrency, "x"))
        steps.append(Step("users per GPU", "floor(maximum concurrency)",
                          f"floor({cap_engine.max_concurrency:.4f}) = {users_per_gpu:,}", users_per_gpu, "users"))
    else:
        usable = gpu.memory_bytes * n * serving.mem_utilisation
        free = usable - weights - serving.reserve_bytes
        users_per_gpu = max(0, math.floor(free / per_user)) if per_user > 0 else 0
        steps.append(Step("users per GPU",
                          "floor((GPU memory * GPUs * utilisation - weights - reserve) / bytes/user) [datasheet]",
                          f"floor(({_gb(gpu.memory_bytes)} * {n} * {serving.mem_utilisation:g} - {_gb(weights)} - "
                          f"{_gb(serving.reserve_bytes)}) / {_gb(per_user)}) = {users_per_gpu:,}",
                          users_per_gpu, "users"))

    fits = users_per_gpu > 0
    price = gpu.price_per_hour
    decode_len = serving.decode_length()
    cap = serving.max_batch
    prompt = serving.prompt_tokens()
    inputs, _ = embedding_params(geometry)
    read_params = max(total - inputs, 0)
    weight_read = read_params * wb
    bandwidth = gpu.bandwidth_bytes_s * n * serving.bandwidth_efficiency
    compute = gpu.bf16_flops * n * serving.compute_efficiency
    bw_text = f"({gpu.bandwidth_bytes_s / 1e12:g} TB/s * {n} * {serving.bandwidth_efficiency:g})"
    fl_text = f"({gpu.bf16_flops / 1e12:g} TFLOPS * {n} * {serving.compute_efficiency:g})"
    prefill_flops = prefill_time = ttft = tpot = None
    prefill_bound = batch_limit = usd_month = None
    per_gpu_rate = 0.0
    if fits:
        per_replica = min(users_per_gpu, cap) if cap else users_per_gpu
        batch_limit = "batch cap" if cap and cap < users_per_gpu else "memory"
        users = serving.users if serving.users is not None else per_replica
        replicas = math.ceil(users / per_replica)
        batch = math.ceil(users / replicas)  # the largest batch; users split as evenly as possible
        gpus = replicas * n
        steps.append(Step("GPUs needed", "ceil(users / min(batch cap, users per GPU)) * GPUs per replica",
                          f"ceil({users:,} / min({cap if cap else 'no cap'}, {users_per_gpu:,})) * {n} = "
                          f"{replicas:,} * {n} = {gpus:,} GPU(s), batch up to {batch:,} "
                          f"(limited by {batch_limit})", gpus, "GPUs"))
        # per layer type: the share of layers and the tokens each attends (its window)
        # (a layer without KV cache, linear attention, attends nothing here)
        shares = [(t.n_layers / geometry.n_layers if t.cached else 0.0, t.window)
                  for t in resolved_layer_types(geometry, attention)]
        attended = sum(f * cached_tokens_for(w, decode_len) for f, w in shares)
        attended_bytes = kv_bytes_per_user(geometry, attention, decode_len, serving.kv_dtype,
                                           group_size=serving.kv_group_size,
                                           group_overhead_bytes=serving.group_overhead_bytes)
        flops_token = 2 * read_params + attention_flops_per_pair(geometry, attention, "decode") * attended

        def times(b: int) -> tuple[float, float]:
            """(memory time, compute time) of one decode step at batch b."""
            mem_t = (weight_read + b * attended_bytes) / bandwidth
            return mem_t, (b * flops_token / compute if compute > 0 else math.inf)

        memory_time, compute_time = times(batch)
        step = max(memory_time, compute_time)
        bound = "memory" if memory_time >= compute_time else "compute"
        steps.append(Step("memory time per step",
                          "(weight bytes read + batch * KV bytes at the decode length) / (bandwidth * GPUs * efficiency)",
                          f"({_gb(weight_read)} + {batch} * {attended_bytes:,.0f}) / "
                          f"{bw_text} = {_ms(memory_time)}", memory_time, "s"))
        steps.append(Step("compute time per step",
                          "batch * (2 * params read + attention FLOPs/pair * attended) / "
                          "(peak bf16 * GPUs * efficiency)",
                          f"{batch} * {flops_token:,.0f} / {fl_text} = {_ms(compute_time)}",
                          compute_time, "s"))
        # replicas holding q+1 users (rem of them) and q users: each runs at its own batch's pace
        q, rem = divmod(users, replicas)
        rate = rem * (q + 1) / max(times(q + 1)) + ((replicas - rem) * q / max(times(q)) if q else 0.0)
        per_user_rate = 1 / step
        per_gpu_rate = rate / gpus
        split = (f"{rem} replica(s) at batch {q + 1}, {replicas - rem} at batch {q}" if rem
                 else f"{replicas} replica(s) at batch {q}")
        steps.append(Step("decode tokens/s", "sum over replicas of batch / max(memory time, compute time)",
                          f"{split}: {rate:,.1f} tokens/s = {per_gpu_rate:,.1f} per GPU ({bound}-bound at "
                          f"batch {batch}, step {_ms(step)})", rate, "tokens/s"))
        usd = price * gpus / (rate * 3600) * 1e6 if rate > 0 else None
        steps.append(Step("USD per 1M output tokens", "price/hour * GPUs / (tokens/s * 3600) * 1e6",
                          f"{price:g} * {gpus} / ({rate:,.1f} * 3600) * 1e6 = "
                          + (f"{usd:,.4f} USD" if usd is not None else "n/a"), usd, "USD"))
        usd_month = price * gpus * HOURS_PER_MONTH
        steps.append(Step("USD per month", "price/hour * GPUs * 730 hours",
                          f"{price:g} * {gpus} * {HOURS_PER_MONTH:g} = {usd_month:,.0f} USD", usd_month, "USD"))

        pairs = round(sum(f * causal_pairs(prompt, w) for f, w in shares))
        per_pair = attention_flops_per_pair(geometry, attention, "prefill")
        prefill_flops = 2 * read_params * prompt + per_pair * pairs
        p_compute = prefill_flops / compute if compute > 0 else math.inf
        p_memory = (weight_read + prompt * per_token) / bandwidth
        prefill_time = max(p_compute, p_memory)
        prefill_bound = "compute" if p_compute >= p_memory else "memory"
        steps.append(Step("prefill FLOPs", "2 * params read * prompt + attention FLOPs/pair * causal pairs",
                          f"2 * {read_params:,} * {prompt:,} + {per_pair:,} * {pairs:,} = {prefill_flops:.4g}",
                          prefill_flops, "FLOPs"))
        steps.append(Step("time to first token (prefill)",
                          "max(prefill FLOPs / (peak bf16 * GPUs * MFU), "
                          "(weight bytes read + prompt * bytes/token) / (bandwidth * GPUs * efficiency))",
                          f"max({prefill_flops:.4g} / {fl_text}, ({_gb(weight_read)} + {prompt:,} * "
                          f"{per_token:,.1f}) / {bw_text}) = max({_ms(p_compute)}, {_ms(p_memory)}) = "
                          f"{_ms(prefill_time)} ({prefill_bound}-bound)", prefill_time, "s"))
        ttft, tpot = prefill_time, step
        steps.append(Step("time per output token", "decode step time at the largest batch",
                          f"{_ms(tpot)} at batch {batch} = {1 / tpot:,.1f} tokens/s per user", tpot, "s"))
    else:
        users = serving.users if serving.users is not None else 0
        replicas = gpus = batch = per_replica = 0
        memory_time = compute_time = step = None
        bound = None
        rate = per_user_rate = 0.0
        usd = None
        reason = ("the weights and reserve do not fit" if free < 0
                  else "not even one user's cache fits beside the weights")
        steps.append(Step("decode tokens/s", "no user fits", f"{reason}: 0 tokens/s", 0.0, "tokens/s"))

    return Estimate(
        label=attention.label(geometry), variant=attention.variant if not attention.mla_latent else "mla",
        n_kv_heads=nkv, params_total=total, params_attention=attn, attention_share=attn / total,
        weights_bytes=weights, bytes_per_element_kv=kb, bytes_per_token=per_token, context=context,
        cached_tokens=tokens, bytes_per_user=per_user,
        bytes_all_users=per_user * users if users else None, usable_bytes=usable,
        users_per_gpu=users_per_gpu, fits=fits, users=users, replicas=replicas, gpus=gpus, batch=batch,
        decode_length=decode_len, step_time_s=step, memory_time_s=memory_time, compute_time_s=compute_time,
        bound=bound, tokens_per_s=rate, tokens_per_s_per_user=per_user_rate, price_per_hour=price,
        usd_per_million_tokens=usd, gpu=gpu.name, max_batch=cap, batch_per_replica=per_replica,
        batch_limit=batch_limit, tokens_per_s_per_gpu=per_gpu_rate, usd_per_month=usd_month,
        prompt_tokens=prompt, prefill_flops=prefill_flops, prefill_time_s=prefill_time,
        prefill_bound=prefill_bound, ttft_s=ttft, tpot_s=tpot, engine=serving.engine, layer_types=rows,
        max_concurrency=cap_engine.max_concurrency if cap_engine else None,
        kv_cache_bytes=cap_engine.kv_cache_bytes if cap_engine else None,
        activation_bytes=cap_engine.activation_bytes if cap_engine else None,
        concurrency_line=cap_engine.line() if cap_engine else None, steps=steps)


#: Figures where smaller is better (saving = 1 - value / baseline) and larger is better
#: (ratio = value / baseline). Pages colour a change by these: a drop is good only in the first.
SMALLER_BETTER = ("params_total", "params_attention", "weights_bytes", "bytes_per_token",
                  "bytes_per_user", "usd_per_million_tokens", "gpus", "usd_per_month", "ttft_s", "tpot_s")
LARGER_BETTER = ("users_per_gpu", "tokens_per_s", "tokens_per_s_per_gpu")


def savings(value: Estimate, baseline: Estimate) -> dict:
    """``saving_<x>`` = 1 - value/baseline for sizes and cost; ``ratio_<x>`` = value/baseline
    for users and throughput (None where the baseline is 0 or missing, and for GPUs when
    either configuration does not fit: 0 GPUs is then no saving)."""
    out = {}
    for key in SMALLER_BETTER:
        v, b = getattr(value, key), getattr(baseline, key)
        if key == "gpus" and not (value.fits and baseline.fits):
            v = None
        out[f"saving_{key}"] = (1 - v / b) if (v is not None and b) else None
    for key in LARGER_BETTER:
        v, b = getattr(value, key), getattr(baseline, key)
        out[f"ratio_{key}"] = (v / b) if (v is not None and b) else None
    return out


TABLE_COLUMNS = [
    "label", "variant", "n_kv_heads", "params_total", "params_attention", "attention_share",
    "weights_bytes", "bytes_per_token", "bytes_per_user", "bytes_all_users", "users_per_gpu", "users",
    "gpus", "tokens_per_s", "bound", "usd_per_million_tokens",
    # added with the batch cap and latency; the columns above keep their meaning
    "max_batch", "batch_per_replica", "batch_limit", "batch", "tokens_per_s_per_gpu", "usd_per_month",
    "prompt_tokens", "prefill_time_s", "ttft_s", "tpot_s",
]


def compare(geometry: Geometry, configs: list[Attention], serving: Serving, gpu: GPU,
            baseline: Attention | None = None) -> pd.DataFrame:
    """One row per configuration: the figures of :func:`estimate` and their savings
    against ``baseline`` (default :func:`baseline_attention`)."""
    base = estimate(geometry, baseline or baseline_attention(geometry), serving, gpu)
    rows = []
    for cfg in configs:
        e = estimate(geometry, cfg, serving, gpu)
        row = {k: getattr(e, k) for k in TABLE_COLUMNS}
        row.update(savings(e, base))
        rows.append(row)
    return pd.DataFrame(rows)


def sweep_context(geometry: Geometry, configs: list[Attention], serving: Serving, gpu: GPU,
                  contexts: list[int]) -> pd.DataFrame:
    """Tidy (label, context, bytes_per_user, users_per_gpu, usd_per_million_tokens) over contexts.

    The prompt/output split is dropped so each point is costed at its own context."""
    rows = []
    for ctx in contexts:
        s = replace(serving, context=int(ctx), prompt_len=None, output_len=None)
        for cfg in configs:
            e = estimate(geometry, cfg, s, gpu)
            rows.append({"label": e.label, "context": int(ctx), "bytes_per_user": e.bytes_per_user,
                         "users_per_gpu": e.users_per_gpu, "usd_per_million_tokens": e.usd_per_million_tokens})
    return pd.DataFrame(rows)


def sweep_users(geometry: Geometry, configs: list[Attention], serving: Serving, gpu: GPU,
                users: list[int]) -> pd.DataFrame:
    """Tidy (label, users, gpus, tokens_per_s, tokens_per_s_per_gpu, usd_per_million_tokens,
    usd_per_month, bound) over concurrent users."""
    rows = []
    for u in users:
        s = replace(serving, users=int(u))
        for cfg in configs:
            e = estimate(geometry, cfg, s, gpu)
            rows.append({"label": e.label, "users": int(u), "gpus": e.gpus, "tokens_per_s": e.tokens_per_s,
                         "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu,
                         "usd_per_million_tokens": e.usd_per_million_tokens,
                         "usd_per_month": e.usd_per_month, "bound": e.bound})
    return pd.DataFrame(rows)
