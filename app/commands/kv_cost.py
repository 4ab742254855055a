"""KV-cache size, users per GPU and cost per million tokens of an attention variant.

Geometry from a preset (--preset, see --list-presets), a checkpoint
(--checkpoint PATH) or typed in (--layers --heads --kv-heads --d-head --d-model).
Every figure is compared with the baseline (separate Q, K, V at the model's
own KV heads). Units: GB = 1e9 bytes, GiB = 2^30 bytes, KiB = 1024 bytes.
Serving: GPUs needed for --users under a batch cap per replica (--max-batch,
vLLM's max_num_seqs), USD per month, and one request's time to first token
(prefill of --prompt-len) and time per output token (a roofline).
--figures DIR writes the page's four sweeps (kv_plot_cache, kv_plot_users,
kv_plot_cost, kv_plot_gpus) as SVG, PDF and PNG (app/figures.py).

Hybrid stacks (sliding-window and global layers, other KV heads or head widths
per type, layers sharing a cache) are read from a checkpoint's config or typed
with --layer-types; one user's cache at the context sums over the layer types,
so "KV bytes per user" is no longer bytes/token * context.

Capacity is counted from the datasheet by default (--engine datasheet: the
card's GB * --utilisation - weights - --reserve-gb). --engine vllm counts it
as vLLM does at start-up and prints its line "Maximum concurrency for N tokens
per request: X" (CUDA's GiB, --gpu-memory-utilization default 0.92, the
profiled activation peak, blocks of 16 tokens); an engine will print that
figure, not the datasheet's. --engine transformers keeps the datasheet's
capacity with transformers' cache rule (a sliding layer keeps window - 1).

Examples:
  python -m app kv-cost --preset llama-3-8b --variant k_eq_v --gpu h100-sxm
  python -m app kv-cost --preset projection-sharing-300m --variant k_eq_v --kv-heads 1 --json
  python -m app kv-cost --layers 24 --heads 16 --kv-heads 4 --d-head 64 --d-model 1024 --context 8192
  python -m app kv-cost --preset llama-3-8b --users 100000 --max-batch 128 --prompt-len 2000 --gpu H100
  python -m app kv-cost --preset gemma-3-27b --context 32768
  python -m app kv-cost --preset llama-3-8b --gpu a100-40gb --context 8192 --engine vllm \
      --gpu-memory-utilization 0.90 --activation-gib 9.37
"""
from __future__ import annotations

import argparse
import dataclasses

from analysis.errors import AnalysisError
from analysis.gpus import ALIASES, CATALOGUE, GB, GIB, TB_S, TFLOPS, get_gpu
from analysis import vllm_engine
from analysis.kv_cost import (
    DEFAULT_MAX_BATCH, DTYPE_BITS, Attention, Geometry, Serving, baseline_attention, compare,
    estimate, geometry_from_info, native_attention, savings, standard_configs,
)
from analysis.kv_layers import ENGINES, SPEC_HELP, parse_layer_types
from analysis.presets import PRESETS, get_preset
from analysis.variants import ALL_VARIANTS
from app.commands._common import add_figures_argument, checkpoint_path, print_json
from app.figures import report_written, write_figures

NAME = "kv-cost"
HELP = "KV-cache bytes, users per GPU and USD per 1M tokens of a variant, against the baseline"


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_argument_group("model geometry (one of)")
    src.add_argument("--preset", help="a preset model (see --list-presets)")
    src.add_argument("--checkpoint", help="read the geometry from a checkpoint file or folder, or a Hugging "
                                          "Face name (org/name) in the local cache")
    src.add_argument("--download", action="store_true",
                     help="with --checkpoint ORG/NAME: fetch it when it is not cached (config.json and "
                          "safetensors only, never model code)")
    src.add_argument("--layers", type=int, help="typed geometry: number of layers")
    src.add_argument("--heads", type=int, help="typed geometry: query heads")
    src.add_argument("--d-head", type=int, help="typed geometry: head dimension")
    src.add_argument("--d-model", type=int, help="typed geometry: residual width")
    src.add_argument("--d-mlp", type=int, help="typed geometry: MLP width (default 4 * d_model)")
    src.add_argument("--vocab", type=int, default=0, help="typed geometry: vocabulary (default 0: "
                     "embeddings not counted)")
    att = p.add_argument_group("attention being costed")
    att.add_argument("--variant", choices=ALL_VARIANTS, help="default: the model's own variant "
                     "(the '+' variants cache and count as their base)")
    att.add_argument("--kv-heads", type=int, help="KV heads (n_heads: MHA, 1: MQA, else GQA); "
                     "default: the model's")
    att.add_argument("--mla-latent", type=int, help="cost multi-head latent attention with this latent dim")
    att.add_argument("--mla-rope", type=int, default=0, help="MLA decoupled rotary key dim (default 0)")
    att.add_argument("--layers-per-cache", type=int, default=1, help="cross-layer KV sharing (default 1: none)")
    att.add_argument("--window", type=int, help="sliding window in tokens for the sliding layers (every layer "
                     "of a uniform model); 0: none, every layer global; default: the model's")
    att.add_argument("--layer-types", help="the model's layer types by hand, replacing the config's: " + SPEC_HELP)
    srv = p.add_argument_group("serving")
    srv.add_argument("--context", type=int, help="tokens cached per user (default 4096, or prompt + output)")
    srv.add_argument("--users", type=int, help="concurrent users (default: one full replica, min(--max-batch, what "
                     "memory holds))")
    srv.add_argument("--prompt-len", type=int, help="prompt tokens (with --output-len: decode costed at "
                     "prompt + output/2)")
    srv.add_argument("--output-len", type=int, help="generated tokens per request")
    srv.add_argument("--kv-dtype", default="bf16", choices=list(DTYPE_BITS), help="cache dtype (default bf16); int8/int4 add a scale and "
                     "zero point per --quant-group-size elements, fp4 (OCP MXFP4) one scale byte per 32 "
                     "elements, nvfp4 (NVIDIA NVFP4) one per 16")
    srv.add_argument("--weight-dtype", default="bf16", choices=list(DTYPE_BITS),
                     help="weight dtype (default bf16)")
    srv.add_argument("--quant-group-size", type=int, default=64,
                     help="int8/int4 cache: elements per scale group (default 64)")
    srv.add_argument("--gpu", default="h100-sxm",
                     help=f"GPU from the catalogue, any case ({', '.join(CATALOGUE)}; also "
                          f"{', '.join(repr(a) for a in ALIASES)}; see --list-gpus)")
    srv.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH,
                     help=f"most sequences one replica decodes at once (default {DEFAULT_MAX_BATCH}, vLLM's "
                          "max_num_seqs; 0: no cap, memory alone limits the batch)")
    srv.add_argument("--gpus-per-replica", type=int, default=1, help="tensor-parallel GPUs per model copy")
    srv.add_argument("--price-per-hour", type=float, help="USD per GPU-hour (default: the catalogue's)")
    srv.add_argument("--gpu-memory-gb", type=float, help="override GPU memory, GB (1e9 bytes)")
    srv.add_argument("--bandwidth-tb-s", type=float, help="override memory bandwidth, TB/s")
    srv.add_argument("--bf16-tflops", type=float, help="override dense bf16 throughput, TFLOPS")
    srv.add_argument("--utilisation", type=float, default=0.9, help="datasheet mode: usable memory fraction (default 0.9; "
                     "--engine vllm uses --gpu-memory-utilization)")
    srv.add_argument("--reserve-gb", type=float, default=2.0,
                     help="datasheet mode: memory kept for activations and runtime, GB (default 2; --engine vllm "
                          "subtracts --activation-gib and --non-torch-gib instead)")
    srv.add_argument("--bandwidth-efficiency", type=float, default=0.8,
                     help="achieved / peak bandwidth (default 0.8)")
    srv.add_argument("--compute-efficiency", type=float, default=0.5,
                     help="achieved / peak bf16 throughput, the MFU of prefill and decode (default 0.5)")
    eng = p.add_argument_group("engine (how capacity is counted)")
    eng.add_argument("--engine", choices=ENGINES, default="datasheet",
                     help="datasheet (default): the card's GB * --utilisation - weights - --reserve-gb, sliding "
                          "layers holding min(context, window); transformers: the same with transformers' "
                          "DynamicCache rule (a sliding layer keeps window - 1 tokens); vllm: capacity as vLLM "
                          "computes it, with its 'Maximum concurrency' line")
    eng.add_argument("--gpu-memory-gib", type=float,
                     help="vllm: total GPU memory as CUDA reports it, GiB (the 'total_gpu_memory' of vLLM's log; "
                          "default: a published log's figure for the GPU, else the datasheet's bytes)")
    eng.add_argument("--gpu-memory-utilization", type=float, default=vllm_engine.DEFAULT_GPU_MEMORY_UTILIZATION,
                     help=f"vllm: fraction of that memory vLLM may use (default "
                          f"{vllm_engine.DEFAULT_GPU_MEMORY_UTILIZATION}, vLLM's own default)")
    eng.add_argument("--activation-gib", type=float,
                     help="vllm: the profiled activation peak, GiB (vLLM's 'PyTorch activation peak memory'); "
                          "default: estimated, max_num_batched_tokens * (3 d_mlp + 3 d_model) * 2 + "
                          "256 * vocab * 4 bytes")
    eng.add_argument("--non-torch-gib", type=float, default=vllm_engine.DEFAULT_NON_TORCH_GIB,
                     help=f"vllm: memory outside torch (CUDA context, NCCL), GiB (vLLM's 'non_torch_memory'; "
                          f"default {vllm_engine.DEFAULT_NON_TORCH_GIB})")
    eng.add_argument("--weights-gib", type=float,
                     help="vllm: the weights vLLM subtracts, GiB, as its log states them ('model weights take'); "
                          "default: parameters * bytes per weight")
    eng.add_argument("--max-num-batched-tokens", type=int, default=vllm_engine.DEFAULT_MAX_NUM_BATCHED_TOKENS,
                     help=f"vllm: tokens of the profiling pass and the chunked-prefill budget (default "
                          f"{vllm_engine.DEFAULT_MAX_NUM_BATCHED_TOKENS}; vLLM V0 without chunked prefill used "
                          "max(max_model_len, 2048))")
    out = p.add_argument_group("output")
    out.add_argument("--compare", action="store_true", help="also a table of every variant and GQA/MQA")
    out.add_argument("--list-presets", action="store_true", help="list the preset models")
    out.add_argument("--list-gpus", action="store_true", help="list the GPU catalogue with sources")
    out.add_argument("--json", action="store_true", help="one JSON object on stdout")
    add_figures_argument(out)


def _geometry(args: argparse.Namespace) -> Geometry:
    typed = [args.layers, args.heads, args.d_head, args.d_model]
    chosen = sum([args.preset is not None, args.checkpoint is not None, any(v is not None for v in typed)])
    if chosen != 1:
        raise AnalysisError("kv-cost: give exactly one of --preset NAME, --checkpoint PATH, or "
                            "--layers/--heads/--d-head/--d-model")
    geometry = _base_geometry(args, typed)
    if args.layer_types:
        geometry = dataclasses.replace(geometry, layer_types=parse_layer_types(args.layer_types, geometry.n_layers))
    return geometry


def _base_geometry(args: argparse.Namespace, typed: list) -> Geometry:
    if args.preset is not None:
        return get_preset(args.preset)
    if args.checkpoint is not None:
        # imported here: loaders.checkpoints imports torch (~8 s), which no other path of
        # this command, nor the parser that imports every command, needs
        from loaders.checkpoints import inspect_checkpoint

        path = checkpoint_path(args.checkpoint, args.download)
        return geometry_from_info(inspect_checkpoint(path), name=str(args.checkpoint))
    missing = [f"--{k.replace('_', '-')}" for k, v in
               zip(("layers", "heads", "d_head", "d_model"), typed) if v is None]
    if missing:
        raise AnalysisError(f"kv-cost: a typed geometry needs {', '.join(missing)} as well")
    return Geometry(name="typed", n_layers=args.layers, n_heads=args.heads,
                    n_kv_heads=args.kv_heads or args.heads, d_model=args.d_model, d_head=args.d_head,
                    d_mlp=args.d_mlp or 0, vocab=args.vocab,
                    source="typed in (MLP 2 matrices, no biases; embeddings only with --vocab)")


def _serving(args: argparse.Namespace) -> Serving:
    context = args.context
    if context is None and (args.prompt_len is None or args.output_len is None):
        context = 4096
    return Serving(context=context, users=args.users, prompt_len=args.prompt_len, output_len=args.output_len,
                   kv_dtype=args.kv_dtype, weight_dtype=args.weight_dtype, kv_group_size=args.quant_group_size,
                   mem_utilisation=args.utilisation, reserve_bytes=args.reserve_gb * GB,
                   bandwidth_efficiency=args.bandwidth_efficiency, compute_efficiency=args.compute_efficiency,
                   gpus_per_replica=args.gpus_per_replica, max_batch=args.max_batch or None,
                   engine=args.engine, gpu_memory_gib=args.gpu_memory_gib,
                   gpu_memory_utilization=args.gpu_memory_utilization, activation_gib=args.activation_gib,
                   non_torch_gib=args.non_torch_gib, max_num_batched_tokens=args.max_num_batched_tokens,
                   weights_gib=args.weights_gib)


def _gpu(args: argparse.Namespace):
    gpu = get_gpu(args.gpu)
    return gpu.with_overrides(
        memory_bytes=args.gpu_memory_gb * GB if args.gpu_memory_gb is not None else None,
        bandwidth_bytes_s=args.bandwidth_tb_s * TB_S if args.bandwidth_tb_s is not None else None,
        bf16_flops=args.bf16_tflops * TFLOPS if args.bf16_tflops is not None else None,
        price_per_hour=args.price_per_hour)


_ENGINE_WORDS = {
    "datasheet": "datasheet (GPU GB * utilisation - weights - reserve; an engine prints its own figure: "
                 "--engine vllm)",
    "transformers": "datasheet memory, transformers' cache rule (a sliding layer keeps window - 1 tokens)",
    "vllm": "as vLLM computes it (CUDA GiB * gpu_memory_utilization - weights - non-torch - activation peak, "
            "blocks of 16 tokens)",
}


def _fmt_bytes(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.0f} B = {x / GB:,.3f} GB = {x / GIB:,.3f} GiB"


def _pct(x: float | None) -> str:
    """A saving against the baseline: positive saves, negative costs more."""
    if x is None:
        return "n/a"
    if x == 0:
        return "same"
    return f"saves {x:.1%}" if x > 0 else f"{-x:.1%} more"


def _ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:,.2f} ms"


@dataclasses.dataclass
class Costing:
    """One costing: the variant's figures (``result``) and the baseline's, the savings, and with
    ``--compare`` the table of every variant."""

    geometry: Geometry
    serving: Serving
    gpu: object
    result: object
    base: object
    savings: dict
    attention: Attention
    comparison: object = None

    def to_json(self) -> dict:
        """What ``--json`` prints: the result's fields and working, then ``geometry``, ``serving``,
        ``gpu_figures``, ``baseline``, ``savings`` and (``--compare``) ``comparison``."""
        out = self.result.to_json(with_steps=True)
        out["geometry"] = self.geometry.to_json()
        out["serving"] = dataclasses.asdict(self.serving)
        out["gpu_figures"] = self.gpu.to_json()
        out["baseline"] = self.base.to_json()
        out["savings"] = self.savings
        if self.comparison is not None:
            out["comparison"] = self.comparison.to_dict(orient="records")
        return out


def costing(args: argparse.Namespace) -> Costing:
    """The costing the options ask for, against the baseline."""
    geometry = _geometry(args)
    serving = _serving(args)
    gpu = _gpu(args)
    if args.mla_latent is None and args.variant is None and args.kv_heads is None and geometry.kv_lora_rank:
        attention = dataclasses.replace(native_attention(geometry), layers_per_cache=args.layers_per_cache,
                                        window=args.window)  # an MLA checkpoint: its own attention
    else:
        attention = Attention(variant=args.variant or geometry.variant, n_kv_heads=args.kv_heads,
                              mla_latent=args.mla_latent, mla_rope=args.mla_rope,
                              layers_per_cache=args.layers_per_cache, window=args.window)
    result = estimate(geometry, attention, serving, gpu)
    base = estimate(geometry, baseline_attention(geometry), serving, gpu)
    table = compare(geometry, standard_configs(geometry, args.kv_heads), serving, gpu) if args.compare else None
    return Costing(geometry, serving, gpu, result, base, savings(result, base), attention, table)


def write_page_figures(c: Costing, out_dir) -> None:
    """The KV cost page's four sweeps of this costing as SVG, PDF and PNG in ``out_dir``
    (``app.page_figures.kv_cost_figures``, ``app.figures.write_figures``); the files on stderr."""
    from app.page_figures import kv_configs, kv_cost_figures  # here: plotly only when asked

    plots = kv_cost_figures(c.geometry, kv_configs(c.geometry, c.attention), c.serving, c.gpu, c.result, c.base)
    report_written(write_figures(plots, out_dir))


def run(args: argparse.Namespace) -> int:
    if args.list_presets:
        rows = [{"name": g.name, "n_layers": g.n_layers, "n_heads": g.n_heads, "n_kv_heads": g.n_kv_heads,
                 "d_model": g.d_model, "d_head": g.d_head, "variant": g.variant, "source": g.source}
                for g in PRESETS.values()]
        if args.json:
            print_json(rows)
        else:
            for r in rows:
                print(f"{r['name']:<26} {r['n_layers']:>3} layers  d_model {r['d_model']:>5}  "
                      f"heads {r['n_heads']:>3}/{r['n_kv_heads']:<3} d_head {r['d_head']:>3}  {r['variant']}")
        return 0
    if args.list_gpus:
        rows = [g.to_json() for g in CATALOGUE.values()]
        if args.json:
            print_json(rows)
        else:
            for g in CATALOGUE.values():
                print(f"{g.name:<11} {g.label:<44} {g.memory_bytes / GB:>6.0f} GB  "
                      f"{g.bandwidth_bytes_s / TB_S:>6.3f} TB/s  {g.bf16_flops / TFLOPS:>7.1f} TFLOPS bf16  "
                      f"${g.price_per_hour:.2f}/h")
                for key, text in g.sources.items():
                    print(f"{'':13}{key}: {text}")
        return 0

    c = costing(args)
    geometry, serving, gpu, result, base, saved, table = (c.geometry, c.serving, c.gpu, c.result, c.base,
                                                          c.savings, c.comparison)
    if args.figures is not None:
        write_page_figures(c, args.figures)
    if args.json:
        print_json(c.to_json())
        return 0

    print(f"{geometry.name}: {geometry.n_layers} layers, d_model {geometry.d_model}, "
          f"{geometry.n_heads} heads ({geometry.n_kv_heads} KV), d_head {geometry.d_head}  [{geometry.source}]")
    print(f"costing: {result.label}   baseline: {base.label}")
    print(f"GPU: {gpu.label} x{serving.gpus_per_replica} per replica, {gpu.memory_bytes / GB:g} GB, "
          f"{gpu.bandwidth_bytes_s / TB_S:g} TB/s, {gpu.bf16_flops / TFLOPS:g} TFLOPS bf16, "
          f"${gpu.price_per_hour:g}/GPU-hour")
    print(f"capacity: {_ENGINE_WORDS[serving.engine]}")
    print(f"units: GB = 1e9 bytes, GiB = 2^30 bytes, KiB = 1024 bytes\n")
    print("working:")
    for s in result.steps:
        print(f"  {s.name}: {s.formula}")
        print(f"      {s.filled}")
    print()
    lines = [
        ("parameters", f"{result.params_total:,} (attention {result.params_attention:,}, "
                       f"{result.attention_share:.1%})", _pct(saved["saving_params_total"])),
        ("weight memory", _fmt_bytes(result.weights_bytes), _pct(saved["saving_weights_bytes"])),
        ("KV bytes per token", f"{result.bytes_per_token:,.1f} B = {result.bytes_per_token / 1024:,.3f} KiB",
         _pct(saved["saving_bytes_per_token"])),
        ("KV bytes per user", _fmt_bytes(result.bytes_per_user) + f" at context {result.context:,}",
         _pct(saved["saving_bytes_per_user"])),
        ("KV bytes, all users", _fmt_bytes(result.bytes_all_users), ""),
        ("users per GPU", f"{result.users_per_gpu:,} at context {result.context:,}",
         _ratio(saved["ratio_users_per_gpu"])),
        ("GPUs needed", f"{result.gpus:,} for {result.users:,} users, batch up to {result.batch_per_replica:,} "
                        f"a replica" + (f" (limited by {result.batch_limit})" if result.batch_limit else ""),
         _pct(saved["saving_gpus"])),
        ("decode tokens/s", f"{result.tokens_per_s:,.1f} for {result.users:,} users on {result.gpus} GPU(s)"
         + (f", {result.bound}-bound" if result.bound else ", nothing fits"), _ratio(saved["ratio_tokens_per_s"])),
        ("decode tokens/s per GPU", f"{result.tokens_per_s_per_gpu:,.1f}",
         _ratio(saved["ratio_tokens_per_s_per_gpu"])),
        ("USD per 1M output tokens",
         "n/a" if result.usd_per_million_tokens is None else f"{result.usd_per_million_tokens:,.4f}",
         _pct(saved["saving_usd_per_million_tokens"])),
        ("USD per month", "n/a" if result.usd_per_month is None else
         f"{result.usd_per_month:,.0f} (${result.price_per_hour:g}/GPU-hour * {result.gpus} * 730 h)",
         _pct(saved["saving_usd_per_month"])),
        ("time to first token", f"{_ms(result.ttft_s)} (prefill of {result.prompt_tokens:,} tokens"
         + (f", {result.prefill_bound}-bound)" if result.prefill_bound else ")"), _pct(saved["saving_ttft_s"])),
        ("time per output token", f"{_ms(result.tpot_s)} at batch {result.batch:,}", _pct(saved["saving_tpot_s"])),
    ]
    print(f"{'figure':<26} {'value':<62} vs baseline (saving / ratio)")
    for name, value, vs in lines:
        print(f"{name:<26} {value:<62} {vs}")
    if len(result.layer_types) > 1 or result.layer_types[0]["window"]:
        print(f"\nper layer type at context {result.context:,}:")
        print(f"  {'type':<20} {'layers':>6} {'cached':>6} {'KV heads':>8} {'K/V width':>10} {'window':>8} "
              f"{'tokens':>9} {'B/token':>12} {'bytes':>16}")
        for r in result.layer_types:
            print(f"  {r['name']:<20} {r['n_layers']:>6} {r['cache_layers']:>6} {r['n_kv_heads']:>8} "
                  f"{str(r['d_head_k']) + '/' + str(r['d_head_v']):>10} {r['window'] or 'full':>8} "
                  f"{r['tokens']:>9,.0f} {r['bytes_per_token']:>12,.1f} {r['bytes']:>16,.0f}")
    if result.concurrency_line:
        print(f"\nvLLM: KV cache {result.kv_cache_bytes / GIB:,.2f} GiB, activation peak "
              f"{result.activation_bytes / GIB:,.2f} GiB")
        print(result.concurrency_line)
    if table is not None:
        print()
        cols = ["label", "bytes_per_token", "users_per_gpu", "gpus", "tokens_per_s", "tokens_per_s_per_gpu",
                "usd_per_million_tokens", "ttft_s", "tpot_s", "saving_bytes_per_token"]
        print(table[cols].to_string(index=False))
    return 0
