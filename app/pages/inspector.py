"""Checkpoint inspector: geometry, metric heatmaps, spectra, attention maps, reports, downloads.

A checkpoint comes from the database, an upload (one file, the files of a
Hugging Face folder, or a zip) or a path on the server (for files over the
upload limit). Analysis runs once with a progress bar and is stored
(``app.jobs.analyze``), so a second visit reads the stored results.

Uploads: Streamlit keeps uploaded files in memory; they are written to a
temporary folder, ingested and analysed there. The folder lives as long as
the uploader holds those files (spectra and attention maps read the weights
from it) and is deleted when the upload is removed or replaced, or when the
browser session ends.
"""
from __future__ import annotations

import io
import tempfile
from pathlib import Path, PurePath

import numpy as np
import pandas as pd
import streamlit as st

from analysis.registry import BY_NAME, METRIC_VERSION, METRICS
from app import charts
from app.state import (data_version, get_store, query_param, set_query_params,
                       checkpoints_frame as _checkpoints, analysis_results as _results)
from loaders import curves
from loaders.errors import FileError, QkvscopeError

TITLE = "Checkpoint inspector"
ICON = ":material/grid_on:"
ORDER = 40
URL_PATH = "inspector"

SOURCES = {"stored": "Stored", "upload": "Upload", "path": "Server path"}
UPLOAD_TYPES = ["safetensors", "json", "bin", "pt", "pth", "ckpt", "zip", "model", "txt"]
#: Per-head metrics for the heatmap, in registry order.
HEAD_METRICS = [m.name for m in METRICS if m.axis in ("head", "kv_head", "head+layer")]
ABSORB = ["wq_condition", "wq_basis_orth_defect", "wq_absorb_error"]
KV_FIT = ["kv_share_r2", "kv_cka", "kv_cosine_flat", "kv_share_r2_act", "kv_cka_act"]


# -- cached reads -----------------------------------------------------------------



@st.cache_data(show_spinner=False, max_entries=32)
def _spectra(path: str, stamp: str, layer: int, head: int) -> pd.DataFrame:
    """Singular values of W_Q[h], W_K[g], W_V[g], W_O[h] of one layer (g: h's kv head)."""
    import torch

    from analysis._linalg import singular_values
    from loaders.checkpoints import open_checkpoint

    rows = []
    with open_checkpoint(path) as ckpt:
        meta = ckpt.meta
        w = ckpt.layer(layer)
        g = head // (meta.n_heads // meta.n_kv_heads)
        mats = {"W_Q": None if w.W_Q is None else w.W_Q[head], "W_K": w.W_K[g], "W_V": w.W_V[g],
                "W_O": w.W_O[head].mT}  # W_O[h] is [d_head, d_model]; its transpose is tall
        with torch.inference_mode():
            for name, a in mats.items():
                if a is None:
                    continue
                sv = singular_values(a.float()).cpu().numpy()  # [d_head], descending
                rows += [(name, i, float(s)) for i, s in enumerate(sv)]
    return pd.DataFrame(rows, columns=["projection", "index", "sigma"])


@st.cache_data(show_spinner=False, max_entries=16)
def _attention(path: str, stamp: str, text: str) -> tuple[list[str], np.ndarray | None, str | None]:
    """Tokens and attention maps ``[n_layers, n_heads, T, T]`` on ``text``, or the reason there are none."""
    from app.jobs import NoForwardPass, capture_activations
    from loaders.checkpoints import open_checkpoint

    with open_checkpoint(path) as ckpt:
        try:
            cap = capture_activations(ckpt, text=text)
        except NoForwardPass as exc:
            return [], None, str(exc)
    if any(lc.attn is None for lc in cap.layers):
        return cap.tokens, None, cap.logits_reason or "the model returned no attention maps"
    return cap.tokens, np.stack([lc.attn.numpy() for lc in cap.layers]), None


# -- getting a checkpoint --------------------------------------------------------------

def save_uploads(files: list[tuple[str, bytes]], dest: Path) -> Path:
    """Write uploaded files into ``dest``; return what to ingest.

    One file: that file (a zip is read as a zip). Several files: ``dest`` as a
    folder (the files of a Hugging Face checkpoint: config.json beside the
    weights). Names are reduced to their last component, so an upload cannot
    write outside ``dest``.
    """
    if not files:
        raise QkvscopeError("no files uploaded")
    names = [PurePath(name.replace("\\", "/")).name for name, _ in files]
    bad = [n for n in names if n in ("", ".", "..")]
    if bad:
        raise FileError(files[0][0], "uploaded file has no usable name")
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise QkvscopeError(f"uploaded files share names: {', '.join(dup)}; upload each file once")
    for name, (_, data) in zip(names, files):
        (dest / name).write_bytes(data)
    return dest / names[0] if len(names) == 1 else dest


def _release_upload() -> None:
    held = st.session_state.pop("insp_upload_dir", None)
    st.session_state.pop("insp_upload_sig", None)
    if held is not None:
        held.cleanup()


def _from_upload(store) -> int | None:
    files = st.file_uploader("Checkpoint files", type=UPLOAD_TYPES, accept_multiple_files=True, key="insp_files",
                             help="A .safetensors / .pt / .bin file, the files of a Hugging Face folder "
                                  "(config.json and weights together), or a .zip of a folder.")
    if not files:
        _release_upload()
        st.caption("Files over the upload limit: use **Server path** instead.")
        return None
    sig = tuple((f.name, f.size, f.file_id) for f in files)
    if st.session_state.get("insp_upload_sig") == sig:
        return st.session_state.get("insp_upload_id")
    _release_upload()
    holder = tempfile.TemporaryDirectory(prefix="qkvscope-upload-")
    st.session_state["insp_upload_dir"] = holder
    target = save_uploads([(f.name, f.getvalue()) for f in files], Path(holder.name))
    ckpt_id = _ingest(store, target)
    st.session_state["insp_upload_sig"] = sig
    st.session_state["insp_upload_id"] = ckpt_id
    return ckpt_id


def _ingest(store, target: Path) -> int:
    from loaders.ingest import ingest_checkpoint

    with st.spinner(f"Reading {target.name}..."):
        report = ingest_checkpoint(store, target)
    if report.checkpoint_id is None:
        raise QkvscopeError(f"{target}: not a checkpoint qkvscope can read ({report.reason or report.status})")
    return int(report.checkpoint_id)


def _from_path(store) -> int | None:
    with st.form("insp_path_form", border=False):
        path = st.text_input("Path on the server", value=query_param("path", ""), key="insp_path",
                             placeholder="/data/models/gpt2  or  runs/x/final.safetensors")
        opened = st.form_submit_button("Open", icon=":material/folder_open:")
    path = path.strip()
    if not path or not (opened or query_param("path")):
        return None
    target = Path(path).expanduser()
    if not target.exists():
        st.error(f"{target}: no such file or folder on the server. Give the path of a checkpoint file, "
                 "a Hugging Face folder or a zip.")
        return None
    set_query_params(path=str(target))
    return _ingest(store, target)


def _pick_checkpoint(store, ckpts: pd.DataFrame) -> int | None:
    src_url = query_param("src", "stored")
    src = st.segmented_control("Checkpoint from", list(SOURCES), format_func=SOURCES.get, key="insp_src",
                               default=src_url if src_url in SOURCES else "stored") or "stored"
    set_query_params(src=None if src == "stored" else src)
    if src == "upload":
        return _from_upload(store)
    if src == "path":
        return _from_path(store)
    if ckpts.empty:
        st.info("No checkpoints stored yet. Upload one above, give a server path, or ingest from a shell: "
                f"`python -m app ingest PATH --db {store.path}`.", icon=":material/inbox:")
        return None
    labels = {int(r.id): f"#{r.id} {Path(str(r.path)).name} ({r.architecture}, {r.variant}"
              + (f", step {int(r.step)}" if pd.notna(r.step) else "") + ")" for r in ckpts.itertuples()}
    url_id = query_param("ckpt")
    ids = list(labels)
    default = int(url_id) if url_id and url_id.isdigit() and int(url_id) in labels else ids[-1]
    return st.selectbox("Checkpoint", ids, index=ids.index(default), format_func=labels.get, key="insp_ckpt")


# -- sections -------------------------------------------------------------------------------

def _url_int(name: str, hi: int) -> int:
    """An integer URL parameter clamped to [0, hi]; 0 when absent or not a number."""
    raw = query_param(name, "0") or "0"
    return min(max(int(raw), 0), hi) if raw.isdigit() else 0


def _file_stamp(path: str) -> str:
    """A cache key that changes when the file (or a folder's newest file) changes."""
    p = Path(path)
    files = [p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file())
    return ";".join(f"{q.name}:{q.stat().st_size}:{q.stat().st_mtime_ns}" for q in files)


def _geometry(row: pd.Series) -> None:
    c = st.columns(6)
    c[0].metric("Architecture", str(row["architecture"]))
    c[1].metric("Variant", str(row["variant"]))
    c[2].metric("Layers", int(row["n_layers"]))
    c[3].metric("Heads (KV)", f"{int(row['n_heads'])} ({int(row['n_kv_heads'])})")
    c[4].metric("d_model / d_head", f"{int(row['d_model'])} / {int(row['d_head'])}")
    c[5].metric("KV bytes/token", f"{int(row['kv_bytes_per_token']):,}")
    left, right = st.columns([1, 1])
    left.plotly_chart(charts.param_split_figure(row.to_dict()), width="stretch", key="insp_params")
    right.dataframe(pd.DataFrame({"field": ["norm", "positions", "dtype", "parameters", "attention parameters",
                                            "NaN/Inf in attention", "path"],
                                  "value": [str(row["norm"]), str(row["positions"]), str(row["dtype"]),
                                            f"{int(row['params_total']):,}", f"{int(row['params_attention']):,}",
                                            str(int(row["nonfinite"])), str(row["path"])]}),
                    hide_index=True, width="stretch")


@st.cache_data(show_spinner=False, max_entries=32)
def _stored_notes(db: str, version: tuple, checkpoint_id: int, kinds: tuple) -> dict[str, str] | None:
    return curves.stored_job_notes(get_store(), checkpoint_id, kinds, METRIC_VERSION)


def _analyse(store, ckpt_id: int, activations: bool) -> dict[str, str]:
    """Notes of the stored analysis; runs it first (progress bar) when it is not stored yet."""
    from app.jobs import analyze

    kinds = ("weights", "activations") if activations else ("weights",)
    notes = _stored_notes(str(store.path), data_version(store), ckpt_id, kinds)
    if notes is not None:
        return notes
    bar = st.progress(0.0, text="Analysing...")

    def progress(done: int, total: int, what: str) -> None:
        bar.progress(min(1.0, done / total) if total else 1.0, text=what)

    jobs = analyze(store, ckpt_id, activations=activations, progress=progress)
    bar.empty()
    notes = {}
    for job in jobs:
        notes.update(job.notes)
    fresh = [j for j in jobs if not j.cached]
    if fresh:
        st.toast(f"Analysed in {sum(j.seconds for j in fresh):.1f} s and stored.", icon=":material/check:")
    return notes


def _heatmap(results: pd.DataFrame) -> None:
    available = [m for m in HEAD_METRICS if m in set(results["metric"])]
    if not available:
        st.caption("No per-head metrics stored for this checkpoint.")
        return
    m_url = query_param("metric", "kv_cka")
    metric = st.selectbox("Metric", available, index=available.index(m_url) if m_url in available else 0,
                          key="insp_metric", help="; ".join(f"{m}: {BY_NAME[m].help}" for m in available[:3]))
    set_query_params(metric=metric)
    info = BY_NAME[metric]
    st.caption(f"**{metric}** ({'per KV head' if info.axis == 'kv_head' else 'per head'}): {info.help}")
    st.plotly_chart(charts.heatmap_figure(results, metric), width="stretch", key="insp_heatmap")
    if info.axis == "head+layer":
        st.plotly_chart(charts.layer_figure(results, metric), width="stretch", key="insp_layer")


def _reports(results: pd.DataFrame, notes: dict[str, str], row: pd.Series) -> None:
    st.subheader("Query absorbability")
    st.caption("Whether W_Q can be folded into the residual stream (query-free attention, arXiv 2510.23912). "
               f"This model's normalisation: **{row['norm']}**.")
    per_layer = results[results["metric"].isin(ABSORB) & results["head"].isna()]
    if len(per_layer):
        table = per_layer.pivot_table(index="layer", columns="metric", values="value", aggfunc="first")
        st.dataframe(table.reset_index(), hide_index=True, width="stretch", key="insp_absorb")
    for m in ABSORB:
        if m in notes:
            st.caption(f"{m}: {notes[m]}")
    st.subheader("K=V sharing fit")
    st.caption("How much tying K and V loses (projection sharing, Q-K=V); R^2 = 1 - min_T ||V - K T||^2 / ||V||^2.")
    kv = results[results["metric"].isin(KV_FIT) & results["head"].notna()]
    if len(kv):
        summary = (kv.groupby(["layer", "metric"])["value"].agg(["mean", "min", "max"]).reset_index()
                   .pivot_table(index="layer", columns="metric", values="mean"))
        st.dataframe(summary.reset_index(), hide_index=True, width="stretch", key="insp_kvfit")
        r2 = kv[kv["metric"] == "kv_share_r2"]["value"]
        if len(r2):
            st.caption(f"Weights: mean R^2 {r2.mean():.3f} over {len(r2)} KV heads (min {r2.min():.3f}).")
    for m in KV_FIT:
        if m in notes:
            st.caption(f"{m}: {notes[m]}")


def _spectra_section(row: pd.Series) -> None:
    st.subheader("Singular-value spectra")
    path = str(row["path"])
    if not Path(path).exists():
        st.caption(f"The weights are no longer at `{path}` (an upload that was released, or a moved file): "
                   "open it again from a server path or an upload to see spectra and attention maps.")
        return
    c1, c2, c3 = st.columns([1, 1, 1])
    layer = c1.number_input("Layer", 0, int(row["n_layers"]) - 1, _url_int("layer", int(row["n_layers"]) - 1),
                            key="insp_layer_n")
    head = c2.number_input("Head", 0, int(row["n_heads"]) - 1, _url_int("head", int(row["n_heads"]) - 1),
                           key="insp_head_n")
    log_y = c3.toggle("log y", value=query_param("slog", "1") == "1", key="insp_slog")
    set_query_params(layer=int(layer), head=int(head), slog=None if log_y else "0")
    spectra = _spectra(path, _file_stamp(path), int(layer), int(head))
    st.plotly_chart(charts.spectra_figure(spectra, log_y=log_y), width="stretch", key="insp_spectra")


def _attention_section(row: pd.Series) -> None:
    from app.jobs import SAMPLE_TEXT

    if not Path(str(row["path"])).exists():
        return
    st.subheader("Attention maps")
    text = st.text_area("Sample text", value=query_param("text", SAMPLE_TEXT[:160]), key="insp_text",
                        height=80, help="Up to 64 tokens are used.")
    set_query_params(text=None if text == SAMPLE_TEXT[:160] else text)
    tokens, maps, reason = _attention(str(row["path"]), _file_stamp(str(row["path"])), text)
    if maps is None:
        st.caption(f"No attention maps: {reason}")
        return
    layer = int(st.session_state.get("insp_layer_n", 0))
    head = int(st.session_state.get("insp_head_n", 0))
    st.plotly_chart(charts.attention_figure(maps[layer, head], tokens, title=f"L{layer}H{head}"),
                    width="stretch", key="insp_attention")


def _downloads(results: pd.DataFrame, ckpt_id: int) -> None:
    c1, c2, _ = st.columns([1, 1, 3])
    c1.download_button("Results CSV", results.to_csv(index=False).encode(), file_name=f"checkpoint-{ckpt_id}.csv",
                       mime="text/csv", icon=":material/download:", key="insp_csv")
    buf = io.BytesIO()
    results.to_parquet(buf, index=False)
    c2.download_button("Results Parquet", buf.getvalue(), file_name=f"checkpoint-{ckpt_id}.parquet",
                       mime="application/vnd.apache.parquet", icon=":material/download:", key="insp_parquet")


def render() -> None:
    store = get_store()
    st.title("Checkpoint inspector")
    version = data_version(store)
    ckpts = _checkpoints(str(store.path), version)
    ckpt_id = _pick_checkpoint(store, ckpts)
    if ckpt_id is None:
        return
    set_query_params(ckpt=ckpt_id)
    version = data_version(store)
    ckpts = _checkpoints(str(store.path), version)
    match = ckpts[ckpts["id"] == ckpt_id]
    if match.empty:
        st.error(f"No checkpoint with id {ckpt_id} in {store.path}.")
        return
    row = match.iloc[0]
    _geometry(row)
    activations = st.toggle("Include activation metrics (a forward pass on sample text)",
                            value=query_param("act") == "1", key="insp_act")
    set_query_params(act="1" if activations else None)
    notes = _analyse(store, ckpt_id, activations)
    results = _results(str(store.path), data_version(store), ckpt_id)
    st.subheader("Metrics per layer and head")
    _heatmap(results)
    _reports(results, notes, row)
    _spectra_section(row)
    _attention_section(row)
    st.subheader("Download")
    _downloads(results, ckpt_id)
