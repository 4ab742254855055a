"""KV cache & serving cost: what a variant buys in memory, users, GPUs, latency and dollars.

Reads widgets (defaults from the URL), calls ``analysis.kv_cost``, renders.
Every selection is written back to the URL, so a copied link reopens the
same comparison; the link values it cannot use are named in one warning
(``app.state.url_notes``). The stored-checkpoint list is cached by database file and
its ``data_version``, an upload's geometry by the upload's id.

Deltas against the baseline are coloured by whether the change is better for
that figure (``SMALLER_BETTER`` / ``LARGER_BETTER`` of ``analysis.kv_cost``):
a drop in tokens/s is red, a drop in bytes or dollars green; the arrow follows
the sign.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
import streamlit as st

from analysis.errors import AnalysisError
from analysis.gpus import CATALOGUE, GB, GIB, TB_S, TFLOPS, resolve_gpu_name
from analysis.kv_cost import (
    DEFAULT_MAX_BATCH, DTYPE_BITS, LARGER_BETTER, SMALLER_BETTER, VARIANT_LABELS, VARIANTS, Attention,
    Estimate, Geometry, Serving, baseline_attention, compare, estimate, geometry_from_info,
)
from analysis.kv_layers import ENGINES
from analysis.presets import PRESETS
from analysis.vllm_engine import (
    CUDA_MEMORY_GIB, DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_NON_TORCH_GIB,
)
from app import figures, tables
from app.charts import CHART_THEME
from app.page_figures import kv_configs, kv_cost_figures
from app.plain import md
from app.state import (data_version, get_store, project_filter, query_param, set_query_params, url_choice, url_float,
                       url_ignored, url_int, url_notes, cached_read)
from loaders.errors import QkvscopeError
from loaders.projects import NO_PROJECT
from loaders.store import Store

TITLE = "KV cache & serving cost"
ICON = ":material/memory:"
ORDER = 60
URL_PATH = "kv-cost"

SOURCES = ("preset", "checkpoint", "typed")
def _q_gpu(default: str) -> str:
    """The ``gpu`` link value as a catalogue name; common spellings (``H100``) are accepted."""
    raw = query_param("gpu")
    if raw is None or raw == "":
        return default
    try:
        return resolve_gpu_name(raw)
    except AnalysisError:
        url_ignored("gpu", raw, f"expected one of {', '.join(CATALOGUE)}")
        return default


#: Stored checkpoints' geometry rows of database ``db``, cached until the file changes.
_checkpoint_rows = cached_read(Store.checkpoints)


def _stored_checkpoints() -> list[dict]:
    """Stored checkpoints' geometry rows; [] when the database is absent or unreadable."""
    store = get_store()
    if not store.path.exists():
        return []
    try:
        rows = _checkpoint_rows(str(store.path), data_version(store))
        chosen = st.session_state.get("project_filter") or []      # the sidebar's (render draws it)
        return [r for r in rows if not chosen or (r.get("project") or NO_PROJECT) in chosen]
    except QkvscopeError as exc:
        st.caption(f"Stored checkpoints unavailable: {md(exc)}")
        return []


@st.cache_data(show_spinner=False, max_entries=4)
def _inspect_upload(file_id: str, name: str, _data: bytes) -> dict:
    """Geometry of an uploaded checkpoint, cached by the upload's id (its bytes are not hashed)."""
    # imported here: loaders.checkpoints imports torch, which only this path of the page needs
    from loaders.checkpoints import inspect_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(name).name
        path.write_bytes(_data)
        return inspect_checkpoint(str(path))


def _geometry_inputs(state: dict) -> Geometry:
    labels = {"preset": "Preset", "checkpoint": "Checkpoint", "typed": "Typed in"}
    source = st.radio("Model geometry from", SOURCES, index=SOURCES.index(url_choice("src", list(SOURCES), "preset")),
                      format_func=labels.get, horizontal=True, key="kv_src")
    state["src"] = source
    if source == "preset":
        names = list(PRESETS)
        name = st.selectbox("Preset", names, index=names.index(url_choice("preset", names, "llama-3-8b")),
                            key="kv_preset")
        state["preset"] = name
        geometry = PRESETS[name]
        st.caption(f"Source: {geometry.source}")
        return geometry
    if source == "checkpoint":
        rows = _stored_checkpoints()
        upload = st.file_uploader("…or upload a checkpoint (geometry only is read)", key="kv_upload",
                                  type=["pt", "pth", "bin", "safetensors", "ckpt"])
        if upload is not None:
            try:
                info = _inspect_upload(upload.file_id, upload.name, upload.getvalue())
            except QkvscopeError as exc:  # the file's problem, named; the page goes on
                st.error(md(exc), icon=":material/error:")
                info = {}
            if info:
                return geometry_from_info(info, name=upload.name)
        if not rows:
            st.info("No stored checkpoints: ingest one with `python -m app ingest PATH`, or choose a preset.")
            state["src"] = "preset"
            return PRESETS["llama-3-8b"]
        ids = [int(r["id"]) for r in rows]
        wanted = url_int("ckpt", ids[0])
        if wanted not in ids:
            url_ignored("ckpt", wanted, "no stored checkpoint has this id")
            wanted = ids[0]
        by_id = {int(r["id"]): r for r in rows}
        chosen = st.selectbox("Stored checkpoint", ids, index=ids.index(wanted), key="kv_ckpt",
                              format_func=lambda i: f"#{i} {by_id[i]['path']} ({by_id[i]['variant']})")
        state["ckpt"] = chosen
        return geometry_from_info(by_id[chosen], name=f"#{chosen} {by_id[chosen]['path']}")
    c = st.columns(6)
    layers = c[0].number_input("Layers", 1, 1000, url_int("layers", 32, 1, 1000), key="kv_layers")
    heads = c[1].number_input("Heads", 1, 1024, url_int("heads", 32, 1, 1024), key="kv_heads")
    native_kv = c[2].number_input("KV heads", 1, 1024, url_int("nkv", 8, 1, 1024), key="kv_nkv")
    d_head = c[3].number_input("d_head", 1, 4096, url_int("dhead", 128, 1, 4096), key="kv_dhead")
    d_model = c[4].number_input("d_model", 1, 65536, url_int("dmodel", 4096, 1, 65536), key="kv_dmodel")
    vocab = c[5].number_input("Vocabulary", 0, 10_000_000, url_int("vocab", 0), key="kv_vocab")
    state.update(layers=layers, heads=heads, nkv=native_kv, dhead=d_head, dmodel=d_model, vocab=vocab)
    return Geometry(name="typed", n_layers=int(layers), n_heads=int(heads), n_kv_heads=int(native_kv),
                    d_model=int(d_model), d_head=int(d_head), vocab=int(vocab),
                    source="typed in (MLP 4 x d_model, two matrices, no biases)")


def _attention_inputs(state: dict, geometry: Geometry) -> Attention:
    c = st.columns(3)
    # the five variants, and a checkpoint's own "+" variant when it has one
    options = list(VARIANTS) + ([geometry.variant] if geometry.variant not in VARIANTS else [])
    variant = c[0].selectbox("Variant", options, format_func=VARIANT_LABELS.get, key="kv_variant",
                             index=options.index(url_choice("variant", options, geometry.variant)))
    divisors = [k for k in range(1, geometry.n_heads + 1) if geometry.n_heads % k == 0]
    kv_default = url_int("kvh", geometry.n_kv_heads)
    if kv_default not in divisors:
        url_ignored("kvh", kv_default, f"must divide n_heads={geometry.n_heads}")
        kv_default = geometry.n_kv_heads
    kv = c[1].selectbox("KV heads", divisors, index=divisors.index(kv_default), key="kv_kvh",
                        format_func=lambda k: "MHA" if k == geometry.n_heads else "MQA (1)" if k == 1
                        else f"GQA, {k} KV heads")
    own_mla, own_rope = geometry.kv_lora_rank or 0, geometry.qk_rope_head_dim if geometry.kv_lora_rank else 64
    with c[2].expander("Compare: MLA (latent attention), cross-layer sharing, window",
                       expanded=bool(own_mla)):
        mla = st.number_input("MLA latent dim, kv_lora_rank (0: off)", 0, 65536,
                              url_int("mla", own_mla, 0, 65536), key="kv_mla")
        rope = st.number_input("MLA rotary key dim, qk_rope_head_dim", 0, 4096,
                               url_int("rope", own_rope, 0, 4096), key="kv_rope")
        st.caption("MLA caches one latent and one rotary key per layer and token, shared by all heads: "
                   "(kv_lora_rank + qk_rope_head_dim) x bytes/elem (DeepSeek-V2/V3: 512 + 64).")
        lpc = st.number_input("Layers per shared cache (1: off)", 1, 64, url_int("lpc", 1, 1, 64), key="kv_lpc")
        window = st.number_input("Sliding window, tokens (0: none)", 0, 10_000_000,
                                 url_int("window", geometry.sliding_window or 0), key="kv_window")
    state.update(variant=variant, kvh=kv, mla=mla if mla != own_mla else None,
                 rope=rope if mla and rope != own_rope else None, lpc=lpc if lpc > 1 else None,
                 window=window if window != (geometry.sliding_window or 0) else None)
    return Attention(variant=variant, n_kv_heads=int(kv), mla_latent=int(mla) or None,
                     mla_rope=int(rope) if mla else 0,
                     mla_q_rank=geometry.q_lora_rank if own_mla and mla == own_mla else None,
                     layers_per_cache=int(lpc),
                     window=None if window == (geometry.sliding_window or 0) else int(window))


def _serving_inputs(state: dict) -> tuple[Serving, object]:
    c = st.columns(6)
    dtypes = list(DTYPE_BITS)
    kv_dtype = c[0].selectbox("KV dtype", dtypes, index=dtypes.index(url_choice("kvdtype", dtypes, "bf16")),
                              key="kv_kvdtype")
    w_dtype = c[1].selectbox("Weight dtype", dtypes, index=dtypes.index(url_choice("wdtype", dtypes, "bf16")),
                             key="kv_wdtype")
    context = c[2].number_input("Context (tokens per user)", 1, 10_000_000, url_int("ctx", 4096, 1), key="kv_ctx")
    users = c[3].number_input("Concurrent users (0: one full replica)", 0, 10_000_000, url_int("users", 0),
                              key="kv_users")
    prompt = c[4].number_input("Prompt tokens (0: the whole context)", 0, 10_000_000,
                               url_int("prompt", 0), key="kv_prompt",
                               help="Its prefill gives the time to first token; with output tokens as well, "
                                    "decoding is costed at prompt + output/2 tokens instead of the full context.")
    output = c[5].number_input("Output tokens", 0, 10_000_000, url_int("output", 0), key="kv_output")

    c = st.columns(5)
    names = list(CATALOGUE)
    gpu_name = c[0].selectbox("GPU", names, index=names.index(_q_gpu("h100-sxm")),
                              format_func=lambda n: CATALOGUE[n].label, key="kv_gpu")
    base = CATALOGUE[gpu_name]
    tp = c[1].number_input("GPUs per model copy (tensor parallel)", 1, 64, url_int("tp", 1, 1, 64), key="kv_tp")
    cap = c[2].number_input("Batch cap per replica (0: none)", 0, 1_000_000,
                            url_int("maxbatch", DEFAULT_MAX_BATCH, 0, 1_000_000), key="kv_maxbatch",
                            help=f"Most sequences one replica decodes at once: vLLM's max_num_seqs, default "
                                 f"{DEFAULT_MAX_BATCH} (vLLM V1 raises it to 1024 on GPUs of 70 GiB or more "
                                 "other than the A100). More users need more replicas even when memory would "
                                 "hold them.")
    price = c[3].number_input("Price, USD per GPU-hour", 0.0, 1000.0,
                              url_float("price", base.price_per_hour, 0.0, 1000.0),
                              key=f"kv_price_{gpu_name}", format="%.3f",
                              help=f"Default: {base.sources.get('price', 'assumed')}.")
    group = c[4].number_input("int8/int4 group size", 1, 4096, url_int("group", 64, 1, 4096), key="kv_group")
    with st.expander("GPU figures and efficiency factors (every one editable)"):
        c = st.columns(4)
        mem = c[0].number_input("Memory, GB (1e9 B)", 0.0, 10_000.0, url_float("mem", base.memory_bytes / GB, 0.0, 10_000.0),
                                key=f"kv_mem_{gpu_name}")
        bw = c[1].number_input("Bandwidth, TB/s", 0.001, 1000.0, url_float("bw", base.bandwidth_bytes_s / TB_S, 0.001, 1000.0),
                               key=f"kv_bw_{gpu_name}", format="%.3f")
        tflops = c[2].number_input("Dense bf16, TFLOPS", 0.001, 100_000.0,
                                   url_float("tflops", base.bf16_flops / TFLOPS, 0.001), key=f"kv_tflops_{gpu_name}")
        reserve = c[3].number_input("Reserve, GB", 0.0, 1000.0, url_float("reserve", 2.0, 0.0, 1000.0), key="kv_reserve")
        c = st.columns(3)
        util = c[0].slider("Usable memory fraction", 0.05, 1.0, url_float("util", 0.9, 0.05, 1.0), 0.01, key="kv_util")
        eff_bw = c[1].slider("Bandwidth efficiency", 0.05, 1.0, url_float("effbw", 0.8, 0.05, 1.0), 0.01, key="kv_effbw")
        eff_c = c[2].slider("Compute efficiency (MFU)", 0.01, 1.0, url_float("effc", 0.5, 0.01, 1.0), 0.01,
                            key="kv_effc", help="Achieved / peak bf16 FLOPs, for prefill and decode.")
        st.markdown("\n".join(f"* **{k}**: {v}" for k, v in base.sources.items()))
    engine = st.radio("Capacity counted as", ENGINES, index=ENGINES.index(url_choice("engine", list(ENGINES),
                                                                                    "datasheet")),
                      horizontal=True, key="kv_engine",
                      format_func={"datasheet": "datasheet (GB * usable fraction - weights - reserve)",
                                   "transformers": "transformers' cache (sliding layers keep window - 1)",
                                   "vllm": "vLLM at start-up (its 'Maximum concurrency' line)"}.get,
                      help="An engine prints its own capacity: vLLM counts CUDA's GiB, its utilisation default "
                           f"{DEFAULT_GPU_MEMORY_UTILIZATION}, the profiled activation peak and blocks of 16 tokens.")
    vllm_in: dict = {}
    if engine == "vllm":
        c = st.columns(5)
        cuda = CUDA_MEMORY_GIB.get(gpu_name, (base.memory_bytes / GIB, ""))[0]
        vllm_in["gpu_memory_gib"] = c[0].number_input("GPU memory, GiB (as CUDA reports it)", 0.01, 10_000.0,
                                                      url_float("cudagib", cuda, 0.01, 10_000.0),
                                                      key=f"kv_cudagib_{gpu_name}", format="%.2f")
        vllm_in["gpu_memory_utilization"] = c[1].number_input(
            "gpu_memory_utilization", 0.01, 1.0, url_float("gmu", DEFAULT_GPU_MEMORY_UTILIZATION, 0.01, 1.0),
            key="kv_gmu", format="%.2f")
        act = c[2].number_input("Activation peak, GiB (0: estimate)", 0.0, 10_000.0,
                                url_float("actgib", 0.0, 0.0, 10_000.0), key="kv_actgib", format="%.2f")
        vllm_in["activation_gib"] = act or None
        vllm_in["non_torch_gib"] = c[3].number_input("Non-torch memory, GiB", 0.0, 1000.0,
                                                     url_float("ntgib", DEFAULT_NON_TORCH_GIB, 0.0, 1000.0),
                                                     key="kv_ntgib", format="%.2f")
        vllm_in["max_num_batched_tokens"] = int(c[4].number_input(
            "max_num_batched_tokens", 1, 10_000_000, url_int("mnbt", DEFAULT_MAX_NUM_BATCHED_TOKENS, 1),
            key="kv_mnbt"))
        state.update(cudagib=vllm_in["gpu_memory_gib"] if vllm_in["gpu_memory_gib"] != cuda else None,
                     gmu=vllm_in["gpu_memory_utilization"]
                     if vllm_in["gpu_memory_utilization"] != DEFAULT_GPU_MEMORY_UTILIZATION else None,
                     actgib=act or None,
                     ntgib=vllm_in["non_torch_gib"] if vllm_in["non_torch_gib"] != DEFAULT_NON_TORCH_GIB else None,
                     mnbt=vllm_in["max_num_batched_tokens"]
                     if vllm_in["max_num_batched_tokens"] != DEFAULT_MAX_NUM_BATCHED_TOKENS else None)
    state["engine"] = engine if engine != "datasheet" else None
    gpu = base.with_overrides(memory_bytes=mem * GB, bandwidth_bytes_s=bw * TB_S, bf16_flops=tflops * TFLOPS,
                              price_per_hour=price)
    split = prompt > 0 and output > 0
    serving = Serving(context=int(context), users=int(users) or None,
                      prompt_len=int(prompt) or None, output_len=int(output) if split else None,
                      kv_dtype=kv_dtype, weight_dtype=w_dtype, kv_group_size=int(group),
                      mem_utilisation=float(util), reserve_bytes=reserve * GB,
                      bandwidth_efficiency=float(eff_bw), compute_efficiency=float(eff_c),
                      gpus_per_replica=int(tp), max_batch=int(cap) or None, engine=engine, **vllm_in)
    state.update(kvdtype=kv_dtype, wdtype=w_dtype, ctx=context, users=users or None,
                 prompt=prompt or None, output=output or None, gpu=gpu_name, tp=tp if tp > 1 else None,
                 maxbatch=cap if cap != DEFAULT_MAX_BATCH else None,
                 price=price if price != base.price_per_hour else None, group=group if group != 64 else None,
                 mem=mem if mem != base.memory_bytes / GB else None,
                 bw=bw if bw != base.bandwidth_bytes_s / TB_S else None,
                 tflops=tflops if tflops != base.bf16_flops / TFLOPS else None,
                 reserve=reserve if reserve != 2.0 else None, util=util if util != 0.9 else None,
                 effbw=eff_bw if eff_bw != 0.8 else None, effc=eff_c if eff_c != 0.5 else None)
    return serving, gpu


def delta(key: str, result: Estimate, base: Estimate) -> tuple[str | None, str]:
    """(delta text, delta_color) of ``key`` against the baseline for ``st.metric``.

    The text is the signed change ("-7.0%", with the ratio for throughput: "-7.0% (0.93x)"),
    so the arrow follows the sign; the colour says whether that change is better for this
    figure: ``inverse`` (a drop is green) for sizes, GPUs, latency and dollars, ``normal`` (a
    drop is red) for users and throughput. None where either value is missing or they are equal."""
    value, ref = getattr(result, key), getattr(base, key)
    if key not in SMALLER_BETTER and key not in LARGER_BETTER:
        raise KeyError(f"{key}: not a compared figure")
    if value is None or not ref or (key == "gpus" and not (result.fits and base.fits)):
        return None, "off"
    change = value / ref - 1
    if abs(change) < 5e-4:
        return None, "off"
    text = (f"{change:+.1%}" if abs(change) < 1 else f"{change:+,.0%}")  # -7.0%, +1,522%
    text += f" ({value / ref:.2f}x)" if key in LARGER_BETTER else ""
    return text, "inverse" if key in SMALLER_BETTER else "normal"


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:,.1f} ms"


def _metrics(result: Estimate, base: Estimate) -> None:
    def metric(col, label, value, key, help=None):
        text, color = delta(key, result, base)
        col.metric(label, value, text, delta_color=color, help=help)

    usd = result.usd_per_million_tokens
    c = st.columns(5)
    metric(c[0], "KV per token", f"{result.bytes_per_token / 1024:,.2f} KiB", "bytes_per_token")
    metric(c[1], "KV per user", f"{result.bytes_per_user / GIB:,.3f} GiB", "bytes_per_user",
           help=f"{result.bytes_per_user / GB:,.3f} GB (1e9 B)")
    metric(c[2], "Users per GPU (memory)", f"{result.users_per_gpu:,}", "users_per_gpu",
           help="Users whose cache fits beside the weights in one replica's memory"
                + (": floor of vLLM's maximum concurrency." if result.engine == "vllm" else
                   " (datasheet memory * usable fraction - weights - reserve)."))
    metric(c[3], "Decode tokens/s", f"{result.tokens_per_s:,.0f}", "tokens_per_s",
           help=(f"All {result.users:,} users on {result.gpus:,} GPU(s), {result.bound}-bound"
                 if result.bound else "nothing fits"))
    metric(c[4], "USD per 1M output tokens", "n/a" if usd is None else f"{usd:,.4f}", "usd_per_million_tokens")
    c = st.columns(5)
    metric(c[0], "GPUs needed", f"{result.gpus:,}" if result.fits else "n/a", "gpus",
           help=f"ceil(users / min(batch cap, users per GPU)) x GPUs per replica; batch up to "
                f"{result.batch_per_replica:,} per replica"
                + (f", limited by the {result.batch_limit}" if result.batch_limit else ""))
    metric(c[1], "Tokens/s per GPU", f"{result.tokens_per_s_per_gpu:,.0f}", "tokens_per_s_per_gpu")
    month = result.usd_per_month
    metric(c[2], "USD per month", "n/a" if month is None else f"{month:,.0f}", "usd_per_month",
           help=f"${result.price_per_hour:g} per GPU-hour x GPUs x 730 hours")
    metric(c[3], "Time to first token", _ms(result.ttft_s), "ttft_s",
           help=f"Prefill of {result.prompt_tokens:,} prompt tokens, one request alone"
                + (f", {result.prefill_bound}-bound" if result.prefill_bound else ""))
    metric(c[4], "Time per output token", _ms(result.tpot_s), "tpot_s",
           help=f"One decode step at batch {result.batch:,}")
    st.caption(f"Deltas against the baseline ({base.label}): green is better, red worse, for that figure. "
               f"Parameters {result.params_total:,} (attention {result.attention_share:.1%}), weights "
               f"{result.weights_bytes / GB:,.2f} GB = {result.weights_bytes / GIB:,.2f} GiB. "
               + (f"Decode is **{result.bound}-bound** at batch {result.batch}." if result.bound else
                  "**The weights (plus reserve) do not fit, or no user's cache fits beside them.**"))




def render() -> None:
    st.title(TITLE)
    st.caption("For your model: what a projection-sharing variant buys in cache memory, concurrent users, "
               "GPUs, latency and dollars. Units: GB = 1e9 bytes, GiB = 2^30 bytes, KiB = 1024 bytes.")
    state: dict = {}
    store = get_store()
    if store.path.exists():
        project_filter(store, data_version(store))
    geometry = _geometry_inputs(state)
    mla = (f", MLA latent {geometry.kv_lora_rank} + rope {geometry.qk_rope_head_dim}"
           if geometry.kv_lora_rank else "")
    st.caption(f"**{md(geometry.name)}**: {geometry.n_layers} layers, d_model {geometry.d_model}, "
               f"{geometry.n_heads} heads ({geometry.n_kv_heads} KV), d_head {geometry.d_head}, "
               f"own variant {geometry.variant}{mla}")
    attention = _attention_inputs(state, geometry)
    serving, gpu = _serving_inputs(state)
    set_query_params(**state)
    url_notes(warning=True)

    try:
        result = estimate(geometry, attention, serving, gpu)
        base = estimate(geometry, baseline_attention(geometry), serving, gpu)
    except AnalysisError as exc:
        st.error(md(exc), icon=":material/error:")
        return
    _metrics(result, base)
    if result.concurrency_line:
        st.info(f"vLLM would log: **{result.concurrency_line}** (KV cache {result.kv_cache_bytes / GIB:,.2f} GiB, "
                f"activation peak {result.activation_bytes / GIB:,.2f} GiB)", icon=":material/terminal:")

    configs = kv_configs(geometry, attention)
    table = compare(geometry, configs, serving, gpu)
    st.subheader("Variants side by side")
    shown = table.assign(
        weights_GB=table["weights_bytes"] / GB, KiB_per_token=table["bytes_per_token"] / 1024,
        GiB_per_user=table["bytes_per_user"] / GIB, tokens_per_s=table["tokens_per_s"].round(0),
        tokens_per_s_per_gpu=table["tokens_per_s_per_gpu"].round(0),
        ttft_ms=table["ttft_s"] * 1e3, tpot_ms=table["tpot_s"] * 1e3,
        cache_saving=table["saving_bytes_per_token"], cost_saving=table["saving_usd_per_million_tokens"])
    cols = ["label", "params_total", "attention_share", "weights_GB", "KiB_per_token", "GiB_per_user",
            "users_per_gpu", "batch_per_replica", "gpus", "tokens_per_s", "tokens_per_s_per_gpu", "bound",
            "ttft_ms", "tpot_ms", "usd_per_million_tokens", "usd_per_month", "cache_saving", "cost_saving"]
    st.dataframe(shown[cols], hide_index=True, width="stretch", column_config={
        "label": "configuration", "params_total": st.column_config.NumberColumn("parameters", format="localized"),
        "attention_share": st.column_config.NumberColumn("attention share", format="percent"),
        "weights_GB": st.column_config.NumberColumn("weights, GB", format="%.2f"),
        "KiB_per_token": st.column_config.NumberColumn("KV KiB/token", format="%.2f"),
        "GiB_per_user": st.column_config.NumberColumn("KV GiB/user", format="%.3f"),
        "users_per_gpu": st.column_config.NumberColumn("users/GPU (memory)", format="localized"),
        "batch_per_replica": st.column_config.NumberColumn(
            "batch/replica", format="localized", help="min(batch cap, users per GPU)"),
        "gpus": st.column_config.NumberColumn("GPUs needed", format="localized",
                                              help=f"for {result.users:,} users"),
        "tokens_per_s": st.column_config.NumberColumn("tokens/s (all GPUs)", format="localized"),
        "tokens_per_s_per_gpu": st.column_config.NumberColumn("tokens/s per GPU", format="localized"),
        "ttft_ms": st.column_config.NumberColumn("TTFT, ms", format="%.1f",
                                                 help=f"prefill of {result.prompt_tokens:,} tokens"),
        "tpot_ms": st.column_config.NumberColumn("TPOT, ms", format="%.2f"),
        "usd_per_million_tokens": st.column_config.NumberColumn("USD/1M tokens", format="%.4f"),
        "usd_per_month": st.column_config.NumberColumn("USD/month", format="localized"),
        "cache_saving": st.column_config.NumberColumn("cache saving", format="percent"),
        "cost_saving": st.column_config.NumberColumn("cost saving", format="percent"),
    })
    st.download_button("Download CSV", tables.csv_bytes(table), file_name=f"kv-cost-{geometry.name}.csv",
                       mime="text/csv", icon=":material/download:", key="kv_csv")

    st.subheader("Against context and users")
    plots = kv_cost_figures(geometry, configs, serving, gpu, result, base)
    for i, (key, fig) in enumerate(plots.items()):
        if i % 2 == 0:
            c = st.columns(2)
        figures.show(fig, key=key, theme=CHART_THEME, where=c[i % 2])

    st.subheader("The working, with your numbers")
    st.dataframe(pd.DataFrame([{"step": s.name, "formula": s.formula, "with numbers": s.filled}
                               for s in result.steps]), hide_index=True, width="stretch")
    if len(result.layer_types) > 1 or result.layer_types[0]["window"]:
        st.subheader("Per layer type")
        st.dataframe(pd.DataFrame(result.layer_types), hide_index=True, width="stretch", column_config={
            "name": "layer type", "n_layers": "layers", "shared": "sharing a cache", "cache_layers": "cached",
            "n_kv_heads": "KV heads", "d_head_k": "K width", "d_head_v": "V width", "window": "window",
            "tokens": st.column_config.NumberColumn(f"tokens held at {result.context:,}", format="localized"),
            "bytes_per_token": st.column_config.NumberColumn("bytes/token", format="localized"),
            "bytes": st.column_config.NumberColumn("bytes per user", format="localized")})
    st.caption("Decode reads every weight once per step (input embedding tables excepted) and every cached "
               "token of every user in the batch; the slower of that memory time and the compute time sets "
               "the step (a roofline). A replica decodes at most the batch cap at once. The time to first token "
               "is one request's prefill alone (no queueing): 2 FLOPs per parameter per prompt token plus "
               "attention, at the compute efficiency (MFU). K=V variants cache one tensor per layer instead "
               "of two; MLA one latent and one rotary key shared by all heads.")
