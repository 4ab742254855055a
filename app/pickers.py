"""Naming and picking stored checkpoints, the same on every page.

A checkpoint is named by its run and step (``k_eq_v-mha-wd0.1 · step 4,000``), an
upload by the uploaded file's own name (``model.safetensors (uploaded)``), anything
else by its folder and file name; the id comes last, to tell twins apart::

    from app.pickers import checkpoint_picker, checkpoint_label
    choices = state.checkpoint_choices(str(store.path), state.data_version(store))
    ckpt_id = checkpoint_picker("Checkpoint", choices, key="insp_ckpt", default=url_id)

Uploads are written by ``upload_folder`` under a temporary folder whose name starts
with ``UPLOAD_PREFIX``; that folder's name never reaches the page: ``display_path`` and
``user_message`` replace it by what was uploaded, and byte counts in messages read as
"3.2 MB" (decimal units: 1 MB = 1e6 bytes, as ``DESIGN.md`` uses GB = 1e9).
"""
from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path, PurePath
from typing import Any, Mapping

import pandas as pd
import streamlit as st

from analysis.variants import VARIANTS

#: Prefix of the temporary folder an upload is written to (``upload_folder``).
UPLOAD_PREFIX = "qkvscope-upload-"
#: Suffixes of the files uploaded beside the weights (named after them in a folder name).
_SIDE_FILES = {".json", ".txt", ".model", ".py", ".md", ".yaml", ".yml"}
#: How many uploaded names a folder name lists before "+ N more".
_NAMED = 2
#: The longest file or folder name (bytes) the server's file systems take (Linux ``NAME_MAX``).
NAME_MAX = 255
#: A path (absolute or not) that runs through an upload's temporary folder, up to its end.
_UPLOAD_RX = re.compile(r"(?:[^\s'\"`(]*/)?" + re.escape(UPLOAD_PREFIX) + r"[A-Za-z0-9_]+(?P<rest>/[^\s'\"`:,)]*)?")
#: "12,345 bytes" / "12345 bytes" in a message.
_BYTES_RX = re.compile(r"\b(\d[\d,]*) bytes\b")
_UNITS = ["bytes", "kB", "MB", "GB", "TB", "PB"]


# -- names ------------------------------------------------------------------------------

def human_bytes(n: int | float) -> str:
    """``3_200_000`` -> ``"3.2 MB"``; decimal units, 3 significant figures (``"999 bytes"`` below 1 kB)."""
    n = float(n)
    if not math.isfinite(n):
        return str(n)
    if abs(n) < 1000:
        return f"{int(n)} bytes"
    power = min(int(math.log10(abs(n)) // 3), len(_UNITS) - 1)
    value = n / 1000 ** power
    text = f"{value:.3g}" if value < 100 else f"{value:.0f}"
    return f"{text} {_UNITS[power]}"


def upload_folder_name(names: list[str]) -> str:
    """The folder name that keeps what several uploaded files were called:
    ``model.safetensors + config.json`` (weights before configuration and tokenizer files, then by
    name; ``+ N more`` past two), cut to ``NAME_MAX`` bytes ending in ``...``."""
    names = sorted(names, key=lambda n: (PurePath(n).suffix.lower() in _SIDE_FILES, n))
    shown = " + ".join(names[:_NAMED])
    more = len(names) - _NAMED
    name = shown + (f" + {more} more" if more > 0 else "")
    if len(name.encode()) <= NAME_MAX:
        return name
    # two 205-character names make 413: cut to what the file system takes, at a whole character
    return name.encode()[:NAME_MAX - 3].decode("utf-8", "ignore") + "..."


def upload_folder(names: list[str]) -> tuple[tempfile.TemporaryDirectory, Path]:
    """A temporary folder for an upload of files called ``names`` (last components).

    Returns the holder (``cleanup()`` deletes everything) and the folder to write the
    files into: the holder itself for one file (its path ends in the file's own name),
    a subfolder named ``upload_folder_name(names)`` for several (a Hugging Face folder),
    so the stored path keeps what was uploaded.
    """
    holder = tempfile.TemporaryDirectory(prefix=UPLOAD_PREFIX)
    dest = Path(holder.name)
    if len(names) > 1:
        dest = dest / upload_folder_name(names)
        dest.mkdir()
    return holder, dest


def upload_name(path: str | Path) -> str | None:
    """What was uploaded, when ``path`` lies in an upload folder (``upload_folder``); else None.

    ``/tmp/qkvscope-upload-ab12/model.safetensors`` -> ``model.safetensors``; the bare folder
    of an upload made before names were kept -> ``"uploaded files"``."""
    parts = PurePath(str(path)).parts
    for i, part in enumerate(parts):
        if part.startswith(UPLOAD_PREFIX):
            rest = parts[i + 1:]
            return "/".join(rest) if rest else "uploaded files"
    return None


def display_path(path: str | Path) -> str:
    """A path as the user should read it: an upload's own name with ``(uploaded)``, else the path."""
    name = upload_name(path)
    return f"{name} (uploaded)" if name is not None else str(path)


def user_message(text: str) -> str:
    """``text`` with every upload's temporary folder replaced by what was uploaded and byte
    counts made readable: ``/tmp/qkvscope-upload-x1/m.pt: 12,345,678 bytes`` -> ``m.pt: 12.3 MB``."""
    def path(m: re.Match) -> str:
        rest = (m.group("rest") or "").strip("/")
        return rest or "the uploaded files"

    def size(m: re.Match) -> str:
        n = int(m.group(1).replace(",", ""))
        return human_bytes(n)

    return _BYTES_RX.sub(size, _UPLOAD_RX.sub(path, text))


def _get(row: Any, name: str) -> Any:
    value = row.get(name) if isinstance(row, Mapping) else getattr(row, name, None)
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return None
    return value


def source_name(path: str | Path) -> str:
    """A stored path's short name: an upload's own name, else ``folder/file`` (a folder: its name)."""
    name = upload_name(path)
    if name is not None:
        return f"{name} (uploaded)"
    p = PurePath(str(path))
    return f"{p.parent.name}/{p.name}" if p.suffix and p.parent.name else p.name


def checkpoint_label(row: Any) -> str:
    """A checkpoint's name in pickers and headings, from a ``checkpoint_choices`` row (a mapping
    or a named tuple with ``id, path, step, run``):

    * linked to a run: ``k_eq_v-mha-wd0.1 · step 4,000 (#7)``;
    * an upload: ``model.safetensors (uploaded) · step 12 (#8)``;
    * else: ``gpt2-tiny (#9)``, ``llama/model.safetensors (#10)``.
    """
    run, step, cid = _get(row, "run"), _get(row, "step"), _get(row, "id")
    head = str(run) if run is not None else source_name(_get(row, "path") or "")
    parts = [head]
    if step is not None:
        parts.append(f"step {int(step):,}")
    elif run is not None:
        parts.append(PurePath(str(_get(row, "path") or "")).name)
    return " · ".join(parts) + (f" (#{int(cid)})" if cid is not None else "")


def search_tokens(row: Any) -> tuple[str, set[str]]:
    """What a picker's search box matches against, lower case: the label (any part of it) and
    whole tokens: variant, architecture, run settings and geometry (``wd0.1``, ``L4``, ``H4``, ``KV1``)."""
    tokens = {_get(row, "variant"), _get(row, "run_variant"), _get(row, "architecture")}
    wd = _get(row, "weight_decay")
    if wd is not None:
        tokens |= {f"wd{float(wd):g}", f"wd={float(wd):g}"}
    seed = _get(row, "seed")
    if seed is not None:
        tokens.add(f"seed{int(seed)}")
    geometry = [("L", "n_layers"), ("H", "n_heads"), ("KV", "n_kv_heads"), ("d", "d_model")]
    tokens |= {f"{p}{int(v)}" for p, c in geometry if (v := _get(row, c)) is not None}
    label = f"{checkpoint_label(row)} {PurePath(str(_get(row, 'path') or '')).name}"
    return label.lower(), {str(t).lower() for t in tokens if t is not None}


def search(choices: pd.DataFrame, query: str) -> pd.DataFrame:
    """The rows of ``choices`` matching every word of ``query`` (case-insensitive): a word matches
    when it is part of the label (run name, step, file name) or one of ``search_tokens``' tokens
    whole (so ``qkv`` finds the qkv runs, not every ``qkvscope`` checkpoint)."""
    words = query.lower().split()
    if not words or choices.empty:
        return choices
    keep = []
    for r in choices.to_dict("records"):
        label, tokens = search_tokens(r)
        keep.append(all(w in label or w in tokens for w in words))
    return choices[keep]


# -- the picker --------------------------------------------------------------------------

def checkpoint_picker(label: str, choices: pd.DataFrame, *, key: str, default: int | None = None,
                      help: str | None = None, container=None) -> int | None:
    """A search box beside a select box of ``choices`` (``loaders.checkpoint_labels.checkpoint_choices``
    rows), each named by ``checkpoint_label``; returns the chosen id, None when there is none.

    ``default``: the id chosen first (from the URL), else the newest; a search that matches nothing
    says so and keeps every checkpoint on offer. Widget keys: ``key`` (the select box) and
    ``key + "_search"``.
    """
    if choices.empty:
        return None
    box = container if container is not None else st
    left, right = box.columns([1, 2])
    query = left.text_input(f"Search {label if len(label) <= 2 else label.lower()}", key=f"{key}_search", placeholder="run, variant, wd, step",
                            help="Every word must match: run name, variant, architecture, wd0.1, seed1, "
                                 "L4 (layers), H4 (heads), KV1 (KV heads).")
    shown = search(choices, query)
    if shown.empty:
        left.caption(f"No checkpoint matches {query.strip()!r}; all are listed.")
        shown = choices
    labels = {int(r["id"]): checkpoint_label(r) for r in shown.to_dict("records")}
    ids = list(labels)
    current = st.session_state.get(key)
    first = current if current in labels else default if default in labels else ids[-1]
    if current is not None and current not in labels:
        st.session_state.pop(key)   # the search hid it: select within what is shown
    return right.selectbox(label, ids, index=ids.index(first), format_func=labels.get, key=key, help=help)


def baseline_checkpoint(choices: pd.DataFrame) -> int | None:
    """The checkpoint a one-checkpoint view opens on: a Q-K-V baseline (``BASELINE``, by its run's or
    its own variant) of the most common geometry, MHA first, its latest step, else the newest
    checkpoint; None for none."""
    if choices.empty:
        return None
    variant = choices["run_variant"].where(choices["run_variant"].notna(), choices["variant"]) \
        if "run_variant" in choices.columns else choices["variant"]
    base = choices[variant == BASELINE]
    if base.empty:
        return int(choices["id"].iloc[-1])
    common = base.groupby(GEOMETRY, dropna=False).size().sort_values(ascending=False, kind="stable")
    key = common.index[0] if len(GEOMETRY) > 1 else (common.index[0],)
    same = base[(base[GEOMETRY].astype(str) == [str(k) for k in key]).all(axis=1)]
    same = same.assign(_gqa=same["n_kv_heads"] != same["n_heads"], _step=same["step"].fillna(-1))
    return int(same.sort_values(["_gqa", "_step", "id"], ascending=[True, False, False]).iloc[0]["id"])


# -- a pair worth comparing ------------------------------------------------------------

#: Columns two checkpoints must share to be compared head by head.
GEOMETRY = ["architecture", "n_layers", "n_heads", "n_kv_heads", "d_model", "d_head"]
#: Settings a default pair differs in, tried in this order (the first that gives a pair wins).
SETTINGS = ["variant", "weight_decay", "step", "seed", "lr"]
#: The baseline a variant is compared against, and the variant preferred beside it.
BASELINE, PREFERRED = "qkv", "k_eq_v"


def default_pair(choices: pd.DataFrame) -> tuple[int, int]:
    """Two checkpoints worth comparing head by head: the same ``GEOMETRY``, differing in exactly one
    of ``SETTINGS`` (variant first: the qkv baseline against k_eq_v, then any other variant, at the
    same weight decay, step, seed and lr; then two weight decays; then two steps of one setting...),
    the latest step first. Without such a pair: two checkpoints of one geometry, else the first
    and the last. ``choices``: ``loaders.checkpoint_labels.checkpoint_choices`` rows (at least one).
    """
    ids = [int(i) for i in choices["id"]]
    frame = choices.assign(id=choices["id"].astype(int))
    for setting in SETTINGS:
        same = GEOMETRY + [s for s in SETTINGS if s != setting]
        m = frame.merge(frame, on=same, suffixes=("_a", "_b"))   # pandas matches NaN keys to NaN
        a, b = m[f"{setting}_a"], m[f"{setting}_b"]
        m = m[a.notna() & b.notna() & (a != b)]
        if setting == "variant":
            m = m[m["variant_a"] == BASELINE]
            order = {v: i for i, v in enumerate([PREFERRED] + [v for v in VARIANTS if v != PREFERRED])}
            m = m.assign(rank=m["variant_b"].map(order).fillna(len(order)))
        else:
            m = m[m[f"{setting}_a"] < m[f"{setting}_b"]]
            m = m.assign(rank=0)
        if len(m):
            m = m.assign(latest=m["step"].fillna(-1) if "step" in same else m["step_b"].fillna(-1),
                         gqa=m["n_kv_heads"] != m["n_heads"])   # MHA pairs first
            best = m.sort_values(["rank", "gqa", "latest", "id_a", "id_b"],
                                 ascending=[True, True, False, True, True]).iloc[0]
            return int(best["id_a"]), int(best["id_b"])
    twins = frame[frame.duplicated(GEOMETRY, keep=False)]
    if len(twins) >= 2:
        first = twins.iloc[0]
        other = twins[(twins[GEOMETRY] == first[GEOMETRY]).all(axis=1)].iloc[-1]
        return int(first["id"]), int(other["id"])
    return ids[0], ids[-1]
