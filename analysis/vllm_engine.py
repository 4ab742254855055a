"""Capacity as vLLM computes it at start-up: its KV-cache memory and "Maximum concurrency" line.

vLLM profiles one forward pass of ``max_num_batched_tokens`` tokens, then gives the
KV cache what is left of its share of the card (``vllm/v1/worker/gpu_worker.py``,
``determine_available_memory``; the V0 worker logged the same terms)::

    usable          = total GPU memory (GiB, as CUDA reports it) * gpu_memory_utilization
    KV cache bytes  = usable - weights - non-torch memory - activation peak
    group size      = layers of the type with fewest (the most, when that is under
                      1.5x the fewest); each type makes ceil(its layers / group size)
                      groups, the last one padded (one group of every layer when uniform)
    page bytes      = block_size (16) * bytes/token of one layer * group size
    blocks          = floor(KV cache bytes / page bytes)
    blocks/request  = sum over groups of the blocks one request holds at max_model_len
                      (full layers: ceil(C / 16) blocks; sliding layers:
                       ceil(min(C, window - 1 + max_num_batched_tokens) / 16) + 1)
    max concurrency = blocks / blocks/request        printed "%.2fx"

which is ``vllm/v1/core/kv_cache_utils.py``'s ``_get_kv_cache_groups_uniform_page_size``,
``get_max_concurrency_for_kv_cache_config`` and ``SlidingWindowSpec.max_memory_usage_bytes``.
Types whose layers cost different bytes a token (Gemma 4's wider global layers) are
not grouped: one page of every layer and blocks/request = ceil(bytes/request / page)
(vLLM unifies their page sizes otherwise; that is left out).

The activation peak, when not given, is estimated from the model's shape::

    activation peak = max_num_batched_tokens * (3 * d_mlp + 3 * d_model) * 2 bytes
                    + max_num_seqs * vocab * 4 bytes

the first term the MLP's widest moment of the profiling pass (residual, its
normed copy and the down projection's output, d_model each; the fused gate/up
output, 2 * d_mlp, and the activated half, d_mlp, in bf16), the second the
fp32 logits of the sampled positions (one per sequence). Checked against the
published start-up logs listed in ``docs/serving.md``.

Defaults: ``gpu_memory_utilization`` 0.92 (``vllm serve --help``: "If unspecified,
will use the default value of 0.92", docs.vllm.ai/en/stable/cli/serve/); block
size 16 (``CacheConfig.block_size``); non-torch memory 0.10 GiB (CUDA context
and NCCL buffers outside torch's allocator; the single-GPU V0 logs print 0.09
to 0.12 GiB); ``max_num_batched_tokens`` 8192 (V1 ``vllm serve`` on a large GPU;
V0 without chunked prefill used max(max_model_len, 2048): pass it). With
tensor parallelism over n GPUs the calculator multiplies memory, non-torch
memory and activation peak by n against the whole model's weights and cache
(vLLM logs one worker's share of each).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from analysis.errors import AnalysisError
from analysis.gpus import GIB

#: vLLM's current ``gpu_memory_utilization`` default (module docstring).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
#: Tokens per KV-cache block, vLLM's ``block_size`` default.
BLOCK_SIZE = 16
#: Memory outside torch's allocator, GiB (module docstring).
DEFAULT_NON_TORCH_GIB = 0.10
#: Tokens of vLLM's profiling pass, ``max_num_batched_tokens`` (module docstring).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
#: Sequences in the profiling pass, vLLM's ``max_num_seqs`` default.
DEFAULT_MAX_NUM_SEQS = 256

#: Total memory CUDA reports for a catalogue GPU (GiB) where a published vLLM log prints it,
#: with that log; other GPUs fall back to the datasheet's bytes (then pass --gpu-memory-gib).
CUDA_MEMORY_GIB: dict[str, tuple[float, str]] = {
    "a100-40gb": (39.50, "vLLM start-up log, A100 40GB: 'total_gpu_memory (39.50GiB)', "
                         "https://github.com/vllm-project/vllm/issues/12330"),
}


def activation_estimate(d_model: int, d_mlp: int, vocab: int, max_num_batched_tokens: int,
                        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS) -> float:
    """Bytes of the profiled activation peak (formula in the module docstring)."""
    if max_num_batched_tokens < 1:
        raise AnalysisError(f"vllm: max_num_batched_tokens must be >= 1, got {max_num_batched_tokens}")
    seqs = min(max_num_seqs, max_num_batched_tokens)
    return max_num_batched_tokens * (3 * d_mlp + 3 * d_model) * 2 + seqs * vocab * 4


@dataclass(frozen=True)
class Capacity:
    """What vLLM logs at start-up (bytes unless named otherwise)."""

    total_bytes: float
    utilization: float
    usable_bytes: float
    weights_bytes: float
    non_torch_bytes: float
    activation_bytes: float
    activation_source: str
    kv_cache_bytes: float
    page_bytes: float
    num_blocks: int
    blocks_per_request: int
    max_concurrency: float
    context: int

    def line(self) -> str:
        """vLLM's own line, as ``kv_cache_utils.py`` prints it."""
        return f"Maximum concurrency for {self.context:,} tokens per request: {self.max_concurrency:.2f}x"


def pages(types: list[tuple[int, float, float]], block_size: int = BLOCK_SIZE) -> tuple[float, int]:
    """(page bytes, blocks a request holds) of layer types given as (cache layers, bytes/token of
    one layer, tokens a request holds, block-rounded), grouped as vLLM groups them (module
    docstring)."""
    types = [t for t in types if t[0] > 0]
    if not types:
        return 0.0, 0
    rates = {t[1] for t in types}
    if len(rates) > 1:   # no common page: one page of every layer
        page = block_size * sum(n * r for n, r, _ in types)
        return page, math.ceil(sum(n * r * tokens for n, r, tokens in types) / page)
    rate = rates.pop()
    counts = [n for n, _, _ in types]
    group = min(counts) if max(counts) >= 1.5 * min(counts) else max(counts)
    blocks = sum(math.ceil(n / group) * math.ceil(tokens / block_size) for n, _, tokens in types)
    return block_size * rate * group, blocks


def capacity(*, total_bytes: float, utilization: float, weights_bytes: float, non_torch_bytes: float,
             activation_bytes: float, activation_source: str, page_bytes: float, blocks_per_request: int,
             context: int) -> Capacity:
    """The KV-cache memory, blocks and maximum concurrency (module docstring), with the page and
    blocks per request of :func:`pages`."""
    if not 0 < utilization <= 1:
        raise AnalysisError(f"vllm: gpu_memory_utilization must be in (0, 1], got {utilization}")
    usable = total_bytes * utilization
    kv = usable - weights_bytes - non_torch_bytes - activation_bytes
    page, per_request = page_bytes, blocks_per_request
    blocks = max(0, math.floor(kv / page)) if page > 0 else 0
    conc = blocks / per_request if per_request else 0.0
    return Capacity(total_bytes=total_bytes, utilization=utilization, usable_bytes=usable,
                    weights_bytes=weights_bytes, non_torch_bytes=non_torch_bytes,
                    activation_bytes=activation_bytes, activation_source=activation_source,
                    kv_cache_bytes=kv, page_bytes=page, num_blocks=blocks, blocks_per_request=per_request,
                    max_concurrency=conc, context=int(context))


def total_memory_bytes(gpu_name: str, datasheet_bytes: float, override_gib: float | None) -> tuple[float, str]:
    """(bytes, where from): the override, else the CUDA figure a published log prints, else the
    datasheet's bytes."""
    if override_gib is not None:
        if not override_gib > 0:
            raise AnalysisError(f"vllm: gpu memory must be > 0 GiB, got {override_gib}")
        return override_gib * GIB, "given"
    if gpu_name in CUDA_MEMORY_GIB:
        gib, source = CUDA_MEMORY_GIB[gpu_name]
        return gib * GIB, source
    return datasheet_bytes, "datasheet bytes (no published CUDA figure for this GPU: give --gpu-memory-gib)"
