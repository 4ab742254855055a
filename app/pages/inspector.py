"""Checkpoint inspector: geometry, metric heatmaps, spectra, attention maps, reports, downloads.

A checkpoint comes from the database, an upload (one file, the files of a
Hugging Face folder, or a zip) or a path on the server (for files over the
upload limit). Analysis runs once with a progress bar and is stored
(``app.jobs.analyze``), so a second visit reads the stored results.

Inspecting is not ingesting: an upload or a server path is read into a scratch store of the
browser session (``_scratch``, a DuckDB file in a temporary folder that no other page reads),
so nothing changes on the other pages until the user presses **Add to database**, which stores
it in the user's database, into a project the user names (an upload is first copied beside the
database, under ``uploads/``, so the stored path outlives the upload). A server path already
stored opens from the database.

Every value is shown against its chance level (heatmaps diverge from it, tables put it
beside the value; activation metrics with their tokens and 95% interval), metrics with too
few sample tokens are faded/greyed with the reason, and a checkpoint whose tensors are tied
differently from what its layout says (``analysis.tied``) is flagged: with the ties the stored
weights analysis read in its one pass over the layers, so the file is not read again for them.

Checkpoints are picked by run and step with a search box (``app.pickers``); attention maps
show every head of a layer as small multiples on one colour scale with one enlarged,
max-pooled past 48/128 tokens (``app.attention_view``).

Uploads: Streamlit keeps uploaded files in memory; they are written to a
temporary folder (``app.pickers.upload_folder``, whose path keeps the uploaded names:
the page and its messages show those, never the folder), ingested and analysed there. The folder lives as long as
the uploader holds those files (spectra and attention maps read the weights
from it) and is deleted when the upload is removed or replaced, or when the
browser session ends.

No checkpoint file is parsed in this server process: ingest
(``loaders.sandbox.ingest_checkpoint``), analysis (``app.jobs.analyze``) and
the spectra, attention maps and, for an analysis stored without ties, the tie check
(``app.inspect_child``) run in a child
process under ``QKVSCOPE_PARSE_MEMORY_MB`` and a time limit; a file that fails
there (a bomb, a file broken or replaced since it was stored) is one line on the
page and the server keeps serving.
"""
from __future__ import annotations

import io
import shutil
import tempfile
from pathlib import Path, PurePath
from typing import BinaryIO

import numpy as np
import pandas as pd
import streamlit as st

from analysis.errors import AnalysisError
from analysis.registry import BY_NAME, METRIC_VERSION, head_metrics, names
from analysis.tie_names import disagreement
from analysis.variants import informative_metric
from app import attention_view, charts, figures, head_maps, layer_maps, pickers, tables
from app.attempts import attempt, file_stamp, show_failure
from app.plain import md
from app.state import (data_version, get_store, in_projects, project_filter, query_param, store_at, set_query_params,
                       checkpoint_choices, checkpoints_frame as _checkpoints, analysis_results as _results,
                       current_notes, url_choice, url_ignored, url_int, url_notes, cached_read)
from experiments.sample_text import MAX_TOKENS, SAMPLE_TEXT
from loaders import curves
from loaders.errors import FileError, QkvscopeError
from loaders.projects import default_project
from loaders.results import stored_ties
from loaders.store import Store

TITLE = "Checkpoint inspector"
ICON = ":material/grid_on:"
ORDER = 40
URL_PATH = "inspector"

SOURCES = {"stored": "Stored", "upload": "Upload", "path": "Server path"}
UPLOAD_TYPES = ["safetensors", "json", "bin", "pt", "pth", "ckpt", "zip", "model", "txt"]
#: Per-head metrics for the heatmap, in registry order.
ABSORB = names(family="query_absorb")   # wq_condition, wq_basis_orth_defect, wq_absorb_error
#: The K/V fit table: the registry's per-head K/V similarity metrics (weights, then activations).
KV_FIT = names(family="kv_similarity")


# -- cached reads -----------------------------------------------------------------



# Spectra, ties and attention maps read the stored file again: each runs in a child process
# (app.inspect_child, through the sandbox's pool: app.sandbox_jobs) under the memory and time
# limits, never in this server. A failure raises FileError("PATH: what"); Streamlit caches no
# exception, so the sections call these through app.attempts.attempt, which remembers the
# failure for the session (until Try again, or the file changes) instead of reading the file
# again, up to its time limit, at every click.

@st.cache_data(show_spinner=False, max_entries=32)
def _spectra(path: str, stamp: str, layer: int, head: int) -> pd.DataFrame:
    """Singular values of W_Q[h], W_K[g], W_V[g], W_O[h] of one layer (g: h's kv head),
    from ``app.inspect_child.spectra`` in the reading child."""
    from app.sandbox_jobs import call  # here: only when a checkpoint is read

    rows = call("spectra", path, pooled=True, layer=int(layer), head=int(head))
    return pd.DataFrame(rows, columns=["projection", "index", "sigma"])


@st.cache_resource(show_spinner=False, max_entries=2)
def _attention(path: str, stamp: str, text: str, max_tokens: int) -> tuple[list[str], np.ndarray | None, str | None]:
    """Tokens and attention maps ``[n_layers, n_heads, T, T]`` on ``text`` (at most ``max_tokens``
    tokens), or the reason there are none. The forward pass runs in the reading child
    (``app.inspect_child.attention``, time limit ``QKVSCOPE_ANALYSIS_TIMEOUT_S``), which writes
    the maps as an ``.npy`` into a private temporary folder that is read here with
    ``allow_pickle=False`` and removed. A resource cache: the maps (64 MB per 16 heads at
    2,048 tokens) are read where they are, never copied per rerun; callers do not write into them."""
    from app.inspect_child import read_maps
    from app.sandbox_jobs import call  # here: only when a checkpoint is read

    folder = tempfile.mkdtemp(prefix="qkvscope-attention-")       # mode 0700: this user's only
    try:
        got = call("attention", path, pooled=True, timeout="QKVSCOPE_ANALYSIS_TIMEOUT_S",
                   text=text, max_tokens=int(max_tokens), out=folder)
        if got["file"] is None:
            return got["tokens"], None, got["reason"]
        return got["tokens"], read_maps(Path(folder), got), None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@st.cache_data(show_spinner=False, max_entries=16)
def _ties(path: str, stamp: str) -> list[dict]:
    """Per layer, which projections are equal to float tolerance, reading one layer at a time in
    the reading child (``app.jobs.read_ties``, the reader ``info`` and ``analyze`` share)."""
    from app.sandbox_jobs import call  # here: only when a checkpoint is read

    return call("ties", path, pooled=True, timeout="QKVSCOPE_ANALYSIS_TIMEOUT_S")


# -- getting a checkpoint --------------------------------------------------------------

def upload_names(files: list[tuple[str, object]]) -> list[str]:
    """The uploaded files' names reduced to their last component (so an upload cannot write
    outside its folder); a name that is empty, ``.`` or ``..``, longer than the server's file
    system takes (``pickers.NAME_MAX`` bytes), or two files of one name, are errors."""
    if not files:
        raise QkvscopeError("no files uploaded")
    names = [PurePath(name.replace("\\", "/")).name for name, _ in files]
    bad = [n for n in names if n in ("", ".", "..")]
    if bad:
        raise FileError(files[0][0], "uploaded file has no usable name")
    long = next((n for n in names if len(n.encode()) > pickers.NAME_MAX), None)
    if long is not None:
        raise QkvscopeError(f"uploaded file name {long[:40]!r}... is {len(long.encode())} bytes long; the "
                            f"server's file system takes at most {pickers.NAME_MAX}: rename the file")
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise QkvscopeError(f"uploaded files share names: {', '.join(dup)}; upload each file once")
    return names


#: Bytes copied at a time from an upload to its file.
_CHUNK = 1 << 20


def save_uploads(files: list[tuple[str, BinaryIO]], dest: Path) -> Path:
    """Write uploaded files (name, readable binary file: Streamlit's ``UploadedFile``) into
    ``dest`` in chunks of ``_CHUNK`` bytes, never a second copy of a file in memory; return
    what to ingest.

    One file: that file (a zip is read as a zip). Several files: ``dest`` as a
    folder (the files of a Hugging Face checkpoint: config.json beside the
    weights). Names are reduced to their last component (``upload_names``).
    ``app.pickers.upload_folder`` makes a ``dest`` whose path keeps the names.
    """
    names = upload_names(files)
    for name, (_, data) in zip(names, files):
        data.seek(0)
        with open(dest / name, "wb") as out:
            shutil.copyfileobj(data, out, _CHUNK)
    return dest / names[0] if len(names) == 1 else dest


def held_upload(files: list[tuple[str, BinaryIO]]) -> tuple[tempfile.TemporaryDirectory, Path]:
    """(holder, what to ingest): ``files`` written into a new upload folder
    (``pickers.upload_folder``); on any error the folder is removed and a disk that
    is full or refuses the write is one line."""
    holder, dest = pickers.upload_folder(upload_names(files))
    try:
        return holder, save_uploads(files, dest)
    except OSError as exc:
        holder.cleanup()
        raise QkvscopeError(f"the upload could not be written on the server: {exc.strerror or exc}") from None
    except BaseException:
        holder.cleanup()
        raise


def _release_upload() -> None:
    held = st.session_state.pop("insp_upload_dir", None)
    st.session_state.pop("insp_upload_sig", None)
    if held is not None:
        held.cleanup()


def _scratch():
    """The session's scratch store (created on first use, deleted with the session): where an
    inspected upload or server path and its analysis live until added to the database."""
    held = st.session_state.get("insp_scratch")
    if held is None:
        held = tempfile.TemporaryDirectory(prefix="qkvscope-scratch-")
        st.session_state["insp_scratch"] = held
    return Store(Path(held.name) / "scratch.duckdb", busy_timeout=10.0)


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
    holder, target = held_upload([(f.name, f) for f in files])     # streamed: no getvalue() copy
    st.session_state["insp_upload_dir"] = holder
    try:
        ckpt_id = _ingest(store, target)
    except QkvscopeError as exc:  # the message names the upload, not the server's temporary folder
        raise QkvscopeError(pickers.user_message(str(exc))) from exc
    st.session_state["insp_upload_sig"] = sig
    st.session_state["insp_upload_id"] = ckpt_id
    st.session_state["insp_upload_target"] = str(target)
    return ckpt_id


def _ingest(store, target: Path) -> int:
    # Read in a child process under a memory and a time limit (loaders/sandbox.py):
    # a bomb ends that process with one line; this server and its other sessions go on.
    from app.sandbox_jobs import pooled
    from loaders.sandbox import ingest_checkpoint

    with st.spinner(f"Reading {target.name}..."), pooled() as box:
        report = ingest_checkpoint(store, target, reader=box)
    if report.checkpoint_id is None:
        raise QkvscopeError(f"{target}: not a checkpoint qkvscope can read ({report.reason or report.status})")
    return int(report.checkpoint_id)


def _from_path(store):
    with st.form("insp_path_form", border=False):
        path = st.text_input("Path on the server", value=query_param("path", ""), key="insp_path",
                             placeholder="/data/models/gpt2  or  runs/x/final.safetensors")
        opened = st.form_submit_button("Open", icon=":material/folder_open:")
    path = path.strip()
    if not path or not (opened or query_param("path")):
        return store, None
    target = Path(path).expanduser()
    stored = _stored_id(store, target)
    if stored is not None:          # already in the database: it opens from there
        return store, stored
    scratch = _scratch()
    if not opened:
        # A link alone never reads a file on the server: one already read in this session opens
        # from the scratch store; anything else waits for a click on Open.
        inspected = _stored_id(scratch, target)
        if inspected is None:
            st.info(f"Path from the link: {md(target)}. Press **Open** to read it on the server.")
            return scratch, None
        _add_to_database(store, target, upload=False)
        return scratch, inspected
    if not target.exists():
        st.error(f"{md(target)}: no such file or folder on the server. Give the path of a checkpoint file, "
                 "a Hugging Face folder or a zip.")
        return scratch, None
    set_query_params(path=str(target))
    ckpt_id = _ingest(scratch, target)
    _add_to_database(store, target, upload=False)
    return scratch, ckpt_id


def _stored_id(store, target: Path) -> int | None:
    """The id of the stored checkpoint read from ``target`` (as given or resolved), else None."""
    names = {str(target)}
    try:
        names.add(str(target.resolve()))
    except (OSError, RuntimeError):
        pass
    ids = [int(c["id"]) for c in store.checkpoints() if c["path"] in names]
    return ids[-1] if ids else None


def _pick_checkpoint(store, ckpts: pd.DataFrame):
    """``(store, id)`` of the checkpoint to show: from the database, or from the session's scratch
    store for an upload or a server path not stored yet; ``(store, None)`` for none."""
    src_url = url_choice("src", list(SOURCES), "stored")
    url_notes()
    src = st.segmented_control("Checkpoint from", list(SOURCES), format_func=SOURCES.get, key="insp_src",
                               default=src_url) or "stored"
    set_query_params(src=None if src == "stored" else src)
    if src == "upload":
        scratch = _scratch()
        ckpt_id = _from_upload(scratch)
        if ckpt_id is not None:
            _add_to_database(store, Path(st.session_state["insp_upload_target"]), upload=True)
        return scratch, ckpt_id
    if src == "path":
        return _from_path(store)
    if ckpts.empty:
        st.info("No checkpoints stored yet. Upload one above, give a server path, or ingest from a shell: "
                f"`python -m app ingest PATH --db {store.path}`.", icon=":material/inbox:")
        return store, None
    url_id = url_int("ckpt", None)
    if url_id is not None and url_id not in set(ckpts["id"].astype(int)):
        url_ignored("ckpt", url_id, "no such checkpoint stored in the chosen projects")
        url_id = None
    url_notes()
    return store, pickers.checkpoint_picker("Checkpoint", ckpts, key="insp_ckpt",
                                            default=url_id if url_id is not None
                                            else pickers.baseline_checkpoint(ckpts))


def _add_to_database(store, target: Path, *, upload: bool) -> None:
    """The **Add to database** form of an inspected upload or server path: stores it into the
    user's database, into the project named (``loaders.projects``); an upload is copied first to
    ``uploads/`` beside the database, since its temporary folder goes with the session."""
    with st.form("insp_add", border=True):
        st.caption("Inspected only: this checkpoint is not in your database, and no other page counts it.")
        c1, c2 = st.columns([3, 1], vertical_alignment="bottom")
        project = c1.text_input("Project", value="uploads" if upload else default_project(target),
                                key="insp_add_project", help="the project it belongs to in the database")
        added = c2.form_submit_button("Add to database", icon=":material/library_add:")
    if not added:
        return
    from loaders.sandbox import ingest_paths   # each file read in a child process

    if upload:
        root = store.path.parent / "uploads"
        root.mkdir(parents=True, exist_ok=True)
        keep = Path(tempfile.mkdtemp(prefix="upload-", dir=root))
        dest = keep / target.name
        (shutil.copytree if target.is_dir() else shutil.copy2)(target, dest)
        target = dest
    report = ingest_paths(store, [target], project=project.strip() or None)
    ids = [f.checkpoint_id for f in report.files if f.checkpoint_id is not None]
    errors = [f.reason for f in report.files if f.status == "error"]
    if errors:
        st.error(md(pickers.user_message("; ".join(str(e) for e in errors))), icon=":material/error:")
    elif ids:
        st.success(f"Stored in the database as checkpoint #{ids[0]}, project {md(repr(project.strip()))}.",
                   icon=":material/check:")


# -- sections -------------------------------------------------------------------------------

def _geometry(row: pd.Series):
    """The checkpoint's shape and parameter split; returns the place under its first line where
    ``_tied_check`` says, once the analysis is stored, whether the tensors' ties disagree."""
    c = st.columns(6)
    c[0].metric("Architecture", str(row["architecture"]))
    c[1].metric("Variant", str(row["variant"]))
    c[2].metric("Layers", int(row["n_layers"]))
    c[3].metric("Heads (KV)", f"{int(row['n_heads'])} ({int(row['n_kv_heads'])})")
    c[4].metric("d_model / d_head", f"{int(row['d_model'])} / {int(row['d_head'])}")
    c[5].metric("KV bytes/token", f"{int(row['kv_bytes_per_token']):,}")
    slot = st.container()
    left, right = st.columns([1, 1])
    figures.show(charts.param_split_figure(row.to_dict()), key="insp_params", where=left)
    right.dataframe(pd.DataFrame({"field": ["norm", "positions", "dtype", "parameters", "attention parameters",
                                            "NaN/Inf in attention", "path"],
                                  "value": [str(row["norm"]), str(row["positions"]), str(row["dtype"]),
                                            f"{int(row['params_total']):,}", f"{int(row['params_attention']):,}",
                                            str(int(row["nonfinite"])), pickers.display_path(row["path"])]}),
                    hide_index=True, width="stretch")
    return slot


def tie_message(variant: str, ties: list[dict]) -> str | None:
    """What to say when the layout's ``variant`` and the tensors' ties (``analysis.tied``)
    disagree (``analysis.tie_names.disagreement``, the wording ``info`` and ``analyze`` print);
    None when they agree."""
    said = disagreement(variant, ties)
    if said is None:
        return None
    return (said[0].upper() + said[1:] + ". The metrics are computed from the tensors as stored: read the K=V "
            "and Q=K fits with the ties in mind.")


@cached_read(max_entries=32)
def _stored_ties(store, checkpoint_id: int) -> list[dict] | None:
    return stored_ties(store, checkpoint_id, METRIC_VERSION)


def _tied_check(slot, row: pd.Series, store, ckpt_id: int) -> None:
    """In ``slot``, whether the tensors are tied otherwise than the layout says (``tie_message``):
    from the ties the stored weights analysis read with its metrics (``app.jobs.weight_frame``),
    so opening a checkpoint reads its file once, not again for this; only an analysis stored
    without them makes the reading child read the file (``_ties``)."""
    ties = _stored_ties(str(store.path), data_version(store), ckpt_id)
    if ties is None:
        path = str(row["path"])
        if not Path(path).exists():
            return
        stamp = file_stamp(path)
        ties, failure = attempt("ties", (path, stamp), lambda: _ties(path, stamp))
        if failure:                                    # the file broke or changed since it was stored
            show_failure("ties", failure, slot)
            return
    message = tie_message(str(row["variant"]), ties)
    if message:
        slot.warning(message, icon=":material/link:")


def _analyse(store, ckpt_id: int, activations: bool) -> dict[str, str]:
    """Notes of the stored analysis; runs it first (progress bar) when it is not stored yet or is
    stale (``app.state.current_notes``: the rule ``analyze`` applies)."""
    kinds = ("weights", "activations") if activations else ("weights",)
    notes = current_notes(str(store.path), data_version(store), ckpt_id, kinds)
    if notes is not None:
        return notes
    # here, once an analysis has to run: app.jobs imports torch (1.2 s), which a stored
    # checkpoint's page never needs (its spectra and maps are read in the reading child)
    from app.jobs import analyze
    bar = st.progress(0.0, text="Analysing...")

    def progress(done: int, total: int, what: str) -> None:
        bar.progress(min(1.0, done / total) if total else 1.0, text=what)

    try:
        jobs = analyze(store, ckpt_id, activations=activations, progress=progress)
    finally:
        bar.empty()
    notes = {}
    for job in jobs:
        notes.update(job.notes)
    fresh = [j for j in jobs if not j.cached]
    if fresh:
        st.toast(f"Analysed in {sum(j.seconds for j in fresh):.1f} s and stored.", icon=":material/check:")
    return notes


def chance_definition(metric: str) -> str:
    """How ``metric``'s chance level is defined: its registry row's ``chance_help``."""
    return BY_NAME[metric].chance_help if metric in BY_NAME else "not defined"


@st.fragment
def _heatmap(results: pd.DataFrame, notes: dict[str, str], variant: str) -> None:
    """The metric picker and its heatmap: a fragment, so a new metric reruns only this part.
    ``variant``: the checkpoint's, so the picker opens on a metric its tie does not fix."""
    stored = set(results["metric"].unique())          # once: in the comprehension it was built per metric
    available = [m for m in head_metrics() if m in stored]
    if not available:
        st.caption("No per-head metrics stored for this checkpoint.")
        return
    # default: a metric the checkpoint's tie does not fix (kv_cka of a K=V model is 1 by construction)
    default = informative_metric(available, [variant])
    m_url = url_choice("metric", available, default, why="not stored for this checkpoint")
    url_notes()
    metric = st.selectbox("Metric", available, index=available.index(m_url),
                          key="insp_metric", help="; ".join(f"{m}: {BY_NAME[m].help}" for m in available[:3]))
    set_query_params(metric=metric)
    info = BY_NAME[metric]
    st.caption(f"**{metric}** ({'per KV head' if info.axis == 'kv_head' else 'per head'}): {info.help}")
    rows = results[(results["metric"] == metric) & results["head"].notna()]   # what the heatmap shows
    st.caption(f"**{charts.chance_label(rows)}**: {chance_definition(metric)}. "
               + ("Colours diverge from it: white at chance, red above, blue below."
                  if rows["chance"].notna().any() else "No chance level is stored for these values."))
    muted = tables.muted_metrics(notes).get(metric)
    if muted:
        st.warning(f"{metric} rests on too few tokens: {muted}", icon=":material/warning:")
    figures.show(charts.heatmap_figure(results, metric, muted=muted and tables.short_reason(muted)), key="insp_heatmap")
    if info.axis == "head+layer":
        figures.show(charts.layer_figure(results, metric), key="insp_layer")


def _reports(results: pd.DataFrame, notes: dict[str, str], row: pd.Series) -> None:
    st.subheader("Query absorbability")
    st.caption("Whether W_Q can be folded into the residual stream (query-free attention, arXiv 2510.23912). "
               f"This model's normalisation: **{row['norm']}**.")
    table = tables.layer_table(results, ABSORB)
    if len(table):
        st.dataframe(table, hide_index=True, width="stretch", key="insp_absorb",
                     column_config={c: st.column_config.NumberColumn(format="%.4g", help=chance_definition(
                         c.removesuffix(" chance")) if c.endswith(" chance") else BY_NAME[c].help)
                         for c in table.columns if c != "layer"})
    for m in ABSORB:
        if m in notes:
            st.caption(f"{m}: {md(notes[m])}")
    st.subheader("K=V sharing fit")
    st.caption("How much tying K and V loses (projection sharing, Q-K=V); R^2 = 1 - min_T ||V - K T||^2 / ||V||^2.")
    kv = results[results["metric"].isin(KV_FIT) & results["head"].notna()]
    if len(kv):
        st.dataframe(tables.head_summary(results, KV_FIT, notes), hide_index=True, width="stretch",
                     key="insp_kvfit", column_config={
                         "heads above chance": st.column_config.TextColumn(
                             help="heads whose value (weights) or whole 95% interval (activations) lies "
                                  "outside the null band at a 5% false discovery rate, of the heads tested; "
                                  "degenerate heads (fixed by construction) are not counted"),
                         "95% CI (mean of heads' bounds)": st.column_config.TextColumn(
                             help="jackknife t interval over token windows, per head; here the mean of the heads' bounds"),
                         "note": st.column_config.TextColumn(width="large")})
        r2 = kv[kv["metric"] == "kv_share_r2"]
        r2 = r2[~charts.flags_of(r2)[0]]             # degenerate heads (fixed by construction) count nowhere
        if len(r2):
            st.caption(f"Weights: mean R^2 {r2['value'].mean():.3f} over {len(r2)} KV heads "
                       f"(min {r2['value'].min():.3f}; {charts.chance_label(r2)}).")
        with st.expander("Every head"):
            st.dataframe(tables.head_rows(results, KV_FIT, notes), hide_index=True, width="stretch",
                         key="insp_kvheads")
    muted = tables.muted_metrics(notes)
    for m in KV_FIT:
        if m in notes and m not in muted:
            st.caption(f"{m}: {md(notes[m])}")
    if any(m in muted for m in KV_FIT):
        st.caption("Greyed rows rest on too few tokens: "
                   + "; ".join(f"{m}: {muted[m]}" for m in KV_FIT if m in muted))


def _spectra_section(row: pd.Series) -> None:
    st.subheader("Singular-value spectra")
    path = str(row["path"])
    if not Path(path).exists():
        st.caption(f"The weights are no longer at {md(pickers.display_path(path))} (an upload that was released, or a moved file): "
                   "open it again from a server path or an upload to see spectra and attention maps.")
        return
    c1, c2, c3 = st.columns([1, 1, 1])
    layer = c1.number_input("Layer", 0, int(row["n_layers"]) - 1, url_int("layer", 0, 0, int(row["n_layers"]) - 1),
                            key="insp_layer_n")
    head = c2.number_input("Head", 0, int(row["n_heads"]) - 1, url_int("head", 0, 0, int(row["n_heads"]) - 1),
                           key="insp_head_n")
    url_notes()
    log_y = c3.toggle("log y", value=query_param("slog", "1") == "1", key="insp_slog")
    set_query_params(layer=int(layer), head=int(head), slog=None if log_y else "0")
    stamp = file_stamp(path)
    spectra, failure = attempt("spectra", (path, stamp, int(layer), int(head)),
                               lambda: _spectra(path, stamp, int(layer), int(head)))
    if failure:
        show_failure("spectra", failure)
        return
    figures.show(charts.spectra_figure(spectra, log_y=log_y), key="insp_spectra")


def default_text(text: str, limit: int = 160) -> str:
    """The first whole sentences of ``text`` within ``limit`` characters, else its whole words
    within it: a sample text that never stops mid-word."""
    if len(text) <= limit:
        return text
    cut = text[:limit + 1]
    end = max(cut.rfind(". "), cut.rfind("; "), cut.rfind("? "), cut.rfind("! "))
    if end > 0:
        return cut[:end + 1]
    space = cut.rfind(" ")
    return cut[:space] if space > 0 else text[:limit]


def _attention_section(row: pd.Series) -> None:
    if not Path(str(row["path"])).exists():
        return
    st.subheader("Attention maps")
    sample = default_text(SAMPLE_TEXT)
    text = st.text_area("Sample text", value=query_param("text", sample), key="insp_text", height=80,
                        help="The model's tokenizer splits it; at most the number of tokens below is used.")
    c1, c2 = st.columns([1, 3])
    n_max = c1.number_input("Tokens (at most)", 8, 4096, url_int("tokens", MAX_TOKENS, 8, 4096), step=64,
                            key="insp_tokens", help="Capped by the model's context. Past 48 tokens (grid) "
                            "or 128 (enlarged head) each cell is the maximum of a block of tokens.")
    url_notes()
    set_query_params(text=None if text == sample else text, tokens=None if n_max == MAX_TOKENS else int(n_max))
    path = str(row["path"])
    stamp = file_stamp(path)
    got, failure = attempt("attention", (path, stamp, text, int(n_max)),
                           lambda: _attention(path, stamp, text, int(n_max)), errors=(QkvscopeError, ValueError))
    if failure:
        show_failure("attention", failure)
        return
    tokens, maps, reason = got
    if maps is None:
        st.caption(f"No attention maps: {pickers.user_message(reason)}")
        return
    n_layers, n_heads = maps.shape[0], maps.shape[1]
    layer = min(int(st.session_state.get("insp_layer_n", 0)), n_layers - 1)
    head_default = url_int("ahead", min(int(st.session_state.get("insp_head_n", 0)), n_heads - 1), 0, n_heads - 1)
    url_notes()
    heads = list(range(n_heads))
    head = c2.segmented_control("Enlarge head", heads, default=head_default, format_func=lambda h: f"H{h}",
                                key="insp_attn_head") if n_heads <= 16 else \
        c2.selectbox("Enlarge head", heads, index=head_default, format_func=lambda h: f"H{h}", key="insp_attn_head")
    head = head_default if head is None else int(head)
    set_query_params(ahead=head)
    layer_maps = maps[layer]   # [n_heads, T, T]
    st.caption(f"Layer {layer} (the spectra's layer above), {len(tokens)} tokens: all {n_heads} heads on one "
               "colour scale, 0 to the layer's largest weight; the enlarged head is outlined in red.")
    figures.show(attention_view.grid_figure(layer_maps, tokens, layer=layer, selected=head),
                    key="insp_attention_grid")
    figures.show(attention_view.head_figure(layer_maps[head], tokens, title=f"L{layer}H{head}",
                                               zmax=attention_view.shared_max(layer_maps)), key="insp_attention")


def download_frame(results: pd.DataFrame, notes: dict[str, str]) -> pd.DataFrame:
    """The stored results as downloaded: every column (value, chance, chance_low, chance_high, n_tokens,
    ci_low, ci_high, above_chance, degenerate) and ``note``, the analysis note of the row's metric
    ("" when none)."""
    return results.assign(note=results["metric"].map(lambda m: notes.get(m, "")).astype(str))


def _downloads(results: pd.DataFrame, notes: dict[str, str], ckpt_id: int) -> None:
    results = download_frame(results, notes)
    c1, c2, _ = st.columns([1, 1, 3])
    c1.download_button("Results CSV", tables.csv_bytes(results), file_name=f"checkpoint-{ckpt_id}.csv",
                       mime="text/csv", icon=":material/download:", key="insp_csv")
    buf = io.BytesIO()
    results.to_parquet(buf, index=False)
    c2.download_button("Results Parquet", buf.getvalue(), file_name=f"checkpoint-{ckpt_id}.parquet",
                       mime="application/vnd.apache.parquet", icon=":material/download:", key="insp_parquet")


@st.fragment
def _weights_views(row: pd.Series) -> None:
    """Spectra and attention maps, which read the weights: one fragment (the attention grid shows
    the spectra's layer), so their controls rerun only this part."""
    _spectra_section(row)
    _attention_section(row)


def render() -> None:
    store = get_store()
    st.title("Checkpoint inspector")
    version = data_version(store)
    main = store
    store, ckpt_id = _pick_checkpoint(store, in_projects(checkpoint_choices(str(store.path), version),
                                                         project_filter(store, version)))
    if ckpt_id is None:
        return
    if store is main:               # a scratch id means nothing in the database: not in the link
        set_query_params(ckpt=ckpt_id)
    version = data_version(store)
    ckpts = _checkpoints(str(store.path), version)
    match = ckpts[ckpts["id"] == ckpt_id]
    if match.empty:
        st.error(f"No checkpoint with id {ckpt_id} in {store.path}.")
        return
    row = match.iloc[0]
    ties_slot = _geometry(row)
    activations = st.toggle("Include activation metrics (forward passes over a text sample)",
                            value=query_param("act") == "1", key="insp_act")
    set_query_params(act="1" if activations else None)
    notes, failure = attempt("analysis", (str(store.path), ckpt_id, activations, file_stamp(str(row["path"]))),
                             lambda: _analyse(store, ckpt_id, activations), errors=(QkvscopeError, AnalysisError))
    if failure:                     # a bomb, a time-out, a file broken since it was stored
        show_failure("analysis", failure)
        return
    _tied_check(ties_slot, row, store, ckpt_id)
    results = _results(str(store.path), data_version(store), ckpt_id)
    st.subheader("Metrics per layer and head")
    _heatmap(results, notes, str(row["variant"]))
    layer_maps.section(results, ckpt_id if store is main else None, int(row["n_layers"]))
    _reports(results, notes, row)
    _weights_views(row)
    head_maps.section(results, row)
    st.subheader("Download")
    _downloads(results, notes, ckpt_id)
