"""KV cache & serving cost: what a variant buys in memory, users and dollars.

Reads widgets (defaults from the URL), calls ``analysis.kv_cost``, renders.
Every selection is written back to the URL, so a copied link reopens the
same comparison.
"""
from __future__ import annotations

import dataclasses

import pandas as pd
import plotly.express as px
import streamlit as st

from analysis.errors import AnalysisError
from analysis.gpus import CATALOGUE, GB, GIB, TB_S, TFLOPS
from analysis.kv_cost import (
    DTYPE_BITS, VARIANT_LABELS, VARIANTS, Attention, Geometry, Serving, baseline_attention, compare,
    estimate, geometry_from_info, savings, standard_configs, sweep_context, sweep_users,
)
from analysis.presets import PRESETS
from app.state import query_param, set_query_params

TITLE = "KV cache & serving cost"
ICON = ":material/memory:"
ORDER = 60
URL_PATH = "kv-cost"

SOURCES = ("preset", "checkpoint", "typed")
_bad_params: list[str] = []


def _q_int(name: str, default: int | None, lo: int = 0, hi: int = 10_000_000) -> int | None:
    raw = query_param(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        _bad_params.append(f"{name}={raw!r} (expected an integer)")
        return default
    if not lo <= value <= hi:
        _bad_params.append(f"{name}={value} (expected {lo}..{hi})")
        return default
    return value


def _q_float(name: str, default: float, lo: float = 0.0, hi: float = 100_000.0) -> float:
    raw = query_param(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        _bad_params.append(f"{name}={raw!r} (expected a number)")
        return default
    if not lo <= value <= hi:
        _bad_params.append(f"{name}={value:g} (expected {lo:g}..{hi:g})")
        return default
    return value


def _q_choice(name: str, options: list[str], default: str) -> str:
    raw = query_param(name)
    if raw is None:
        return default
    if raw not in options:
        _bad_params.append(f"{name}={raw!r} (expected one of {', '.join(options)})")
        return default
    return raw


def _stored_checkpoints() -> list[dict]:
    """Stored checkpoints' geometry rows; [] when the database is absent or unreadable."""
    from app.state import get_store
    from loaders.errors import QkvscopeError

    store = get_store()
    if not store.path.exists():
        return []
    try:
        return store.checkpoints()
    except QkvscopeError as exc:
        st.caption(f"Stored checkpoints unavailable: {exc}")
        return []


def _inspect_upload(upload) -> dict | None:
    """Geometry of an uploaded checkpoint, when the loaders offer ``inspect_checkpoint``."""
    try:
        from loaders.checkpoints import inspect_checkpoint
    except ImportError:
        return None
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(upload.name).name
        path.write_bytes(upload.getvalue())
        return inspect_checkpoint(str(path))


def _geometry_inputs(state: dict) -> Geometry:
    labels = {"preset": "Preset", "checkpoint": "Checkpoint", "typed": "Typed in"}
    source = st.radio("Model geometry from", SOURCES, index=SOURCES.index(_q_choice("src", list(SOURCES), "preset")),
                      format_func=labels.get, horizontal=True, key="kv_src")
    state["src"] = source
    if source == "preset":
        names = list(PRESETS)
        name = st.selectbox("Preset", names, index=names.index(_q_choice("preset", names, "llama-3-8b")),
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
            from loaders.errors import QkvscopeError

            try:
                info = _inspect_upload(upload)
            except QkvscopeError as exc:  # the file's problem, named; the page goes on
                st.error(str(exc), icon=":material/error:")
                info = {}
            if info is None:
                st.info("Reading an uploaded checkpoint needs `loaders.checkpoints.inspect_checkpoint`, "
                        "which this installation lacks; ingest it with `python -m app ingest PATH` instead.")
            elif info:
                return geometry_from_info(info, name=upload.name)
        if not rows:
            st.info("No stored checkpoints: ingest one with `python -m app ingest PATH`, or choose a preset.")
            state["src"] = "preset"
            return PRESETS["llama-3-8b"]
        ids = [int(r["id"]) for r in rows]
        wanted = _q_int("ckpt", ids[0])
        if wanted not in ids:
            _bad_params.append(f"ckpt={wanted} (no stored checkpoint has this id)")
            wanted = ids[0]
        by_id = {int(r["id"]): r for r in rows}
        chosen = st.selectbox("Stored checkpoint", ids, index=ids.index(wanted), key="kv_ckpt",
                              format_func=lambda i: f"#{i} {by_id[i]['path']} ({by_id[i]['variant']})")
        state["ckpt"] = chosen
        return geometry_from_info(by_id[chosen], name=f"#{chosen} {by_id[chosen]['path']}")
    c = st.columns(6)
    layers = c[0].number_input("Layers", 1, 1000, _q_int("layers", 32, 1, 1000), key="kv_layers")
    heads = c[1].number_input("Heads", 1, 1024, _q_int("heads", 32, 1, 1024), key="kv_heads")
    native_kv = c[2].number_input("KV heads", 1, 1024, _q_int("nkv", 8, 1, 1024), key="kv_nkv")
    d_head = c[3].number_input("d_head", 1, 4096, _q_int("dhead", 128, 1, 4096), key="kv_dhead")
    d_model = c[4].number_input("d_model", 1, 65536, _q_int("dmodel", 4096, 1, 65536), key="kv_dmodel")
    vocab = c[5].number_input("Vocabulary", 0, 10_000_000, _q_int("vocab", 0), key="kv_vocab")
    state.update(layers=layers, heads=heads, nkv=native_kv, dhead=d_head, dmodel=d_model, vocab=vocab)
    return Geometry(name="typed", n_layers=int(layers), n_heads=int(heads), n_kv_heads=int(native_kv),
                    d_model=int(d_model), d_head=int(d_head), vocab=int(vocab),
                    source="typed in (MLP 4 x d_model, two matrices, no biases)")


def _attention_inputs(state: dict, geometry: Geometry) -> Attention:
    c = st.columns(3)
    variant = c[0].selectbox("Variant", VARIANTS, format_func=VARIANT_LABELS.get, key="kv_variant",
                             index=VARIANTS.index(_q_choice("variant", list(VARIANTS), geometry.variant)))
    divisors = [k for k in range(1, geometry.n_heads + 1) if geometry.n_heads % k == 0]
    kv_default = _q_int("kvh", geometry.n_kv_heads)
    if kv_default not in divisors:
        _bad_params.append(f"kvh={kv_default} (must divide n_heads={geometry.n_heads})")
        kv_default = geometry.n_kv_heads
    kv = c[1].selectbox("KV heads", divisors, index=divisors.index(kv_default), key="kv_kvh",
                        format_func=lambda k: "MHA" if k == geometry.n_heads else "MQA (1)" if k == 1
                        else f"GQA, {k} KV heads")
    with c[2].expander("Compare: MLA, cross-layer sharing, window"):
        mla = st.number_input("MLA latent dim (0: off)", 0, 65536, _q_int("mla", 0, 0, 65536), key="kv_mla")
        rope = st.number_input("MLA rotary key dim", 0, 4096, _q_int("rope", 64, 0, 4096), key="kv_rope")
        lpc = st.number_input("Layers per shared cache (1: off)", 1, 64, _q_int("lpc", 1, 1, 64), key="kv_lpc")
        window = st.number_input("Sliding window, tokens (0: none)", 0, 10_000_000,
                                 _q_int("window", geometry.sliding_window or 0), key="kv_window")
    state.update(variant=variant, kvh=kv, mla=mla or None, rope=rope if mla else None,
                 lpc=lpc if lpc > 1 else None,
                 window=window if window != (geometry.sliding_window or 0) else None)
    return Attention(variant=variant, n_kv_heads=int(kv), mla_latent=int(mla) or None,
                     mla_rope=int(rope) if mla else 0,
                     layers_per_cache=int(lpc),
                     window=None if window == (geometry.sliding_window or 0) else int(window))


def _serving_inputs(state: dict) -> tuple[Serving, object]:
    c = st.columns(6)
    dtypes = list(DTYPE_BITS)
    kv_dtype = c[0].selectbox("KV dtype", dtypes, index=dtypes.index(_q_choice("kvdtype", dtypes, "bf16")),
                              key="kv_kvdtype")
    w_dtype = c[1].selectbox("Weight dtype", dtypes, index=dtypes.index(_q_choice("wdtype", dtypes, "bf16")),
                             key="kv_wdtype")
    context = c[2].number_input("Context (tokens per user)", 1, 10_000_000, _q_int("ctx", 4096, 1), key="kv_ctx")
    users = c[3].number_input("Concurrent users (0: fill a GPU)", 0, 10_000_000, _q_int("users", 0),
                              key="kv_users")
    prompt = c[4].number_input("Prompt tokens (0: cost at full context)", 0, 10_000_000,
                               _q_int("prompt", 0), key="kv_prompt")
    output = c[5].number_input("Output tokens", 0, 10_000_000, _q_int("output", 0), key="kv_output")

    c = st.columns(4)
    names = list(CATALOGUE)
    gpu_name = c[0].selectbox("GPU", names, index=names.index(_q_choice("gpu", names, "h100-sxm")),
                              format_func=lambda n: CATALOGUE[n].label, key="kv_gpu")
    base = CATALOGUE[gpu_name]
    tp = c[1].number_input("GPUs per model copy (tensor parallel)", 1, 64, _q_int("tp", 1, 1, 64), key="kv_tp")
    price = c[2].number_input("Price, USD per GPU-hour", 0.0, 1000.0, _q_float("price", base.price_per_hour, 0.0, 1000.0),
                              key=f"kv_price_{gpu_name}", format="%.3f")
    group = c[3].number_input("int8/int4 group size", 1, 4096, _q_int("group", 64, 1, 4096), key="kv_group")
    with st.expander("GPU figures and efficiency factors (every one editable)"):
        c = st.columns(4)
        mem = c[0].number_input("Memory, GB (1e9 B)", 0.0, 10_000.0, _q_float("mem", base.memory_bytes / GB, 0.0, 10_000.0),
                                key=f"kv_mem_{gpu_name}")
        bw = c[1].number_input("Bandwidth, TB/s", 0.001, 1000.0, _q_float("bw", base.bandwidth_bytes_s / TB_S, 0.001, 1000.0),
                               key=f"kv_bw_{gpu_name}", format="%.3f")
        tflops = c[2].number_input("Dense bf16, TFLOPS", 0.001, 100_000.0,
                                   _q_float("tflops", base.bf16_flops / TFLOPS, 0.001), key=f"kv_tflops_{gpu_name}")
        reserve = c[3].number_input("Reserve, GB", 0.0, 1000.0, _q_float("reserve", 2.0, 0.0, 1000.0), key="kv_reserve")
        c = st.columns(3)
        util = c[0].slider("Usable memory fraction", 0.05, 1.0, _q_float("util", 0.9, 0.05, 1.0), 0.01, key="kv_util")
        eff_bw = c[1].slider("Bandwidth efficiency", 0.05, 1.0, _q_float("effbw", 0.8, 0.05, 1.0), 0.01, key="kv_effbw")
        eff_c = c[2].slider("Compute efficiency", 0.01, 1.0, _q_float("effc", 0.5, 0.01, 1.0), 0.01, key="kv_effc")
        st.markdown("\n".join(f"* **{k}**: {v}" for k, v in base.sources.items()))
    gpu = base.with_overrides(memory_bytes=mem * GB, bandwidth_bytes_s=bw * TB_S, bf16_flops=tflops * TFLOPS,
                              price_per_hour=price)
    split = prompt > 0 and output > 0
    serving = Serving(context=int(context), users=int(users) or None,
                      prompt_len=int(prompt) if split else None, output_len=int(output) if split else None,
                      kv_dtype=kv_dtype, weight_dtype=w_dtype, kv_group_size=int(group),
                      mem_utilisation=float(util), reserve_bytes=reserve * GB,
                      bandwidth_efficiency=float(eff_bw), compute_efficiency=float(eff_c),
                      gpus_per_replica=int(tp))
    state.update(kvdtype=kv_dtype, wdtype=w_dtype, ctx=context, users=users or None,
                 prompt=prompt or None, output=output or None, gpu=gpu_name, tp=tp if tp > 1 else None,
                 price=price if price != base.price_per_hour else None, group=group if group != 64 else None,
                 mem=mem if mem != base.memory_bytes / GB else None,
                 bw=bw if bw != base.bandwidth_bytes_s / TB_S else None,
                 tflops=tflops if tflops != base.bf16_flops / TFLOPS else None,
                 reserve=reserve if reserve != 2.0 else None, util=util if util != 0.9 else None,
                 effbw=eff_bw if eff_bw != 0.8 else None, effc=eff_c if eff_c != 0.5 else None)
    return serving, gpu


def _configs(geometry: Geometry, chosen: Attention) -> list[Attention]:
    """The baseline, every variant and K=V with GQA/MQA at the chosen window, plus
    the chosen configuration itself when it adds MLA or cross-layer sharing."""
    configs = [dataclasses.replace(c, window=chosen.window)
               for c in standard_configs(geometry, chosen.n_kv_heads)]
    if chosen not in configs:
        configs.append(chosen)
    base = baseline_attention(geometry)
    return configs if base in configs else [base] + configs


def _metrics(result, base) -> None:
    saved = savings(result, base)

    def pct(key):  # shown as a change: -50% is a saving
        v = saved[key]
        return None if not v else f"{-v:+.1%}"

    def ratio(key):
        v = saved[key]
        return None if v is None or v == 1 else f"{v:.2f}x"

    c = st.columns(5)
    c[0].metric("KV per token", f"{result.bytes_per_token / 1024:,.2f} KiB", pct("saving_bytes_per_token"),
                delta_color="inverse")
    c[1].metric("KV per user", f"{result.bytes_per_user / GIB:,.3f} GiB", pct("saving_bytes_per_user"),
                delta_color="inverse", help=f"{result.bytes_per_user / GB:,.3f} GB (1e9 B)")
    c[2].metric("Users per GPU", f"{result.users_per_gpu:,}", ratio("ratio_users_per_gpu"))
    c[3].metric("Decode tokens/s", f"{result.tokens_per_s:,.0f}", ratio("ratio_tokens_per_s"),
                help=f"{result.bound}-bound" if result.bound else "nothing fits")
    usd = result.usd_per_million_tokens
    c[4].metric("USD per 1M output tokens", "n/a" if usd is None else f"{usd:,.4f}",
                pct("saving_usd_per_million_tokens"), delta_color="inverse")
    st.caption(f"Deltas against the baseline ({base.label}). Parameters {result.params_total:,} "
               f"(attention {result.attention_share:.1%}), weights {result.weights_bytes / GB:,.2f} GB = "
               f"{result.weights_bytes / GIB:,.2f} GiB. "
               + (f"Decode is **{result.bound}-bound** at batch {result.batch}." if result.bound else
                  "**The weights (plus reserve) do not fit, or no user's cache fits beside them.**"))


def render() -> None:
    _bad_params.clear()
    st.title(TITLE)
    st.caption("For your model: what a projection-sharing variant buys in cache memory, concurrent users "
               "and dollars. Units: GB = 1e9 bytes, GiB = 2^30 bytes, KiB = 1024 bytes.")
    state: dict = {}
    geometry = _geometry_inputs(state)
    st.caption(f"**{geometry.name}**: {geometry.n_layers} layers, d_model {geometry.d_model}, "
               f"{geometry.n_heads} heads ({geometry.n_kv_heads} KV), d_head {geometry.d_head}, "
               f"own variant {geometry.variant}")
    attention = _attention_inputs(state, geometry)
    serving, gpu = _serving_inputs(state)
    set_query_params(**state)
    if _bad_params:
        st.warning("Ignored in the link: " + "; ".join(_bad_params), icon=":material/link_off:")

    try:
        result = estimate(geometry, attention, serving, gpu)
        base = estimate(geometry, baseline_attention(geometry), serving, gpu)
    except AnalysisError as exc:
        st.error(str(exc), icon=":material/error:")
        return
    _metrics(result, base)

    configs = _configs(geometry, attention)
    table = compare(geometry, configs, serving, gpu)
    st.subheader("Variants side by side")
    shown = table.assign(
        weights_GB=table["weights_bytes"] / GB, KiB_per_token=table["bytes_per_token"] / 1024,
        GiB_per_user=table["bytes_per_user"] / GIB, tokens_per_s=table["tokens_per_s"].round(0),
        cache_saving=table["saving_bytes_per_token"], cost_saving=table["saving_usd_per_million_tokens"])
    cols = ["label", "params_total", "attention_share", "weights_GB", "KiB_per_token", "GiB_per_user",
            "users_per_gpu", "tokens_per_s", "bound", "usd_per_million_tokens", "cache_saving", "cost_saving"]
    st.dataframe(shown[cols], hide_index=True, width="stretch", column_config={
        "label": "configuration", "params_total": st.column_config.NumberColumn("parameters", format="localized"),
        "attention_share": st.column_config.NumberColumn("attention share", format="percent"),
        "weights_GB": st.column_config.NumberColumn("weights, GB", format="%.2f"),
        "KiB_per_token": st.column_config.NumberColumn("KV KiB/token", format="%.2f"),
        "GiB_per_user": st.column_config.NumberColumn("KV GiB/user", format="%.3f"),
        "users_per_gpu": st.column_config.NumberColumn("users/GPU", format="localized"),
        "tokens_per_s": st.column_config.NumberColumn("tokens/s", format="localized"),
        "usd_per_million_tokens": st.column_config.NumberColumn("USD/1M tokens", format="%.4f"),
        "cache_saving": st.column_config.NumberColumn("cache saving", format="percent"),
        "cost_saving": st.column_config.NumberColumn("cost saving", format="percent"),
    })
    st.download_button("Download CSV", table.to_csv(index=False).encode(), file_name=f"kv-cost-{geometry.name}.csv",
                       mime="text/csv", icon=":material/download:", key="kv_csv")

    st.subheader("Against context and users")
    top = max(serving.resolved_context(), 1024)
    contexts = sorted({int(top * f) for f in (1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1, 2, 4)} - {0})
    sweep = sweep_context(geometry, configs, serving, gpu, contexts)
    sweep["KV GiB per user"] = sweep["bytes_per_user"] / GIB
    c = st.columns(2)
    c[0].plotly_chart(px.line(sweep, x="context", y="KV GiB per user", color="label", markers=True, log_x=True,
                              title="Cache per user (GiB) against context"), key="kv_plot_cache")
    c[1].plotly_chart(px.line(sweep, x="context", y="users_per_gpu", color="label", markers=True, log_x=True,
                              log_y=False, title="Users per GPU against context"), key="kv_plot_users")
    cap = max(result.users_per_gpu, base.users_per_gpu, 8)
    users = sorted({max(1, int(cap * f)) for f in (1 / 64, 1 / 16, 1 / 4, 1 / 2, 1, 2, 4)})
    by_users = sweep_users(geometry, configs, serving, gpu, users)
    st.plotly_chart(px.line(by_users.dropna(subset=["usd_per_million_tokens"]), x="users",
                            y="usd_per_million_tokens", color="label", markers=True, log_x=True, log_y=True,
                            hover_data=["gpus", "bound"],
                            title="USD per 1M output tokens against concurrent users"), key="kv_plot_cost")

    st.subheader("The working, with your numbers")
    st.dataframe(pd.DataFrame([{"step": s.name, "formula": s.formula, "with numbers": s.filled}
                               for s in result.steps]), hide_index=True, width="stretch")
    st.caption("Decode reads every weight once per step (input embedding tables excepted) and every cached "
               "token of every user in the batch; the slower of that memory time and the compute time sets "
               "the step (a roofline). K=V variants cache one tensor per layer instead of two.")
