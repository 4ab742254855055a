"""All weight-level metrics of one attention layer, as a tidy frame.

``weight_metrics(layer, meta)`` takes any object with the canonical per-layer
tensors (``layer``, ``W_Q`` (or None), ``W_K``, ``W_V``, ``W_O``, ``b_Q``,
``b_K``; shapes in ``loaders/canonical.py``) and any object with the geometry
fields (``n_heads``, ``n_kv_heads``, ``d_model``, ``d_head``, ``norm``,
``variant``), e.g. ``loaders.canonical.AttentionWeights`` and ``ModelMeta``;
``analysis`` does not import ``loaders``, the two meet structurally.

It returns ``(frame, notes)``: ``frame`` has the columns ``layer, head,
head_label, metric, value`` (``head`` None for whole-layer values; kv-head
metrics are labelled ``L{l}KV{g}``), ``notes`` maps each metric that does not
exist for this model to the reason. Formulas live in the family modules
(``kv_similarity``, ``qk_geometry``, ``spectra``, ``query_absorb``).

Per layer this costs a handful of batched ``[heads, d_head, d_head]`` Gram
products and float64 eigen-decompositions, plus one ``svdvals`` of the stacked
``W_Q`` for the query-absorbability metrics.
"""
from __future__ import annotations

from typing import Protocol

import pandas as pd
import torch

from analysis import kv_similarity, qk_geometry, query_absorb, spectra
from analysis._linalg import as_float32, identity_queries, kv_index
from analysis.errors import AnalysisError
from analysis.registry import COLUMNS


class LayerLike(Protocol):
    layer: int
    W_Q: torch.Tensor | None
    W_K: torch.Tensor
    W_V: torch.Tensor
    W_O: torch.Tensor
    b_Q: torch.Tensor | None
    b_K: torch.Tensor | None


class MetaLike(Protocol):
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    norm: str
    variant: str


def default_device() -> str:
    """``cuda`` when available, else ``cpu``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_geometry(layer: LayerLike, meta: MetaLike) -> None:
    """Raise ``AnalysisError`` unless the layer's shapes match the metadata."""
    h, g, d, e = meta.n_heads, meta.n_kv_heads, meta.d_model, meta.d_head
    if g <= 0 or h % g:
        raise AnalysisError(f"layer {layer.layer}: n_heads {h} is not a multiple of n_kv_heads {g}")
    expect = {"W_K": (g, d, e), "W_V": (g, d, e), "W_O": (h, e, d)}
    if layer.W_Q is not None:
        expect["W_Q"] = (h, d, e)
    for name, shape in expect.items():
        found = tuple(getattr(layer, name).shape)
        if found != shape:
            raise AnalysisError(
                f"layer {layer.layer}: expected {name} of shape {list(shape)} "
                f"(from n_heads={h}, n_kv_heads={g}, d_model={d}, d_head={e}), found {list(found)}")


class _Rows:
    """Collects tidy rows for one layer."""

    def __init__(self, layer: int):
        self.layer = layer
        self.rows: list[tuple] = []

    def heads(self, metric: str, values: torch.Tensor, *, kv: bool = False) -> None:
        tag = "KV" if kv else "H"
        for h, v in enumerate(values.tolist()):
            self.rows.append((self.layer, h, f"L{self.layer}{tag}{h}", metric, float(v)))

    def whole(self, metric: str, value: float) -> None:
        self.rows.append((self.layer, None, f"L{self.layer}", metric, float(value)))

    def frame(self) -> pd.DataFrame:
        df = pd.DataFrame(self.rows, columns=COLUMNS)
        df["head"] = df["head"].astype("Int64")
        return df


def weight_metrics(layer: LayerLike, meta: MetaLike, *,
                   device: str | torch.device | None = None) -> tuple[pd.DataFrame, dict[str, str]]:
    """Every weight-level metric of ``layer`` (see module docstring)."""
    check_geometry(layer, meta)
    dev = torch.device(device or default_device())
    h, g, d, e = meta.n_heads, meta.n_kv_heads, meta.d_model, meta.d_head
    out = _Rows(layer.layer)
    notes: dict[str, str] = {}
    with torch.inference_mode():
        k = as_float32(layer.W_K, dev)                       # [g, d, e]
        v = as_float32(layer.W_V, dev)                       # [g, d, e]
        o = as_float32(layer.W_O, dev)                       # [h, e, d]
        kv_of = kv_index(h, g, dev)

        out.heads("kv_cosine_flat", kv_similarity.cosine_flat(k, v), kv=True)
        out.heads("kv_cka", kv_similarity.linear_cka(k, v), kv=True)
        out.heads("kv_share_r2", kv_similarity.share_r2(k, v), kv=True)

        identity = layer.W_Q is None
        if identity and h * e != d:
            q = None
            reason = (f"W_Q is absent but n_heads*d_head ({h * e}) != d_model ({d}), "
                      "so the query is not an identity slice of x")
            for m in ("qk_symmetry", "qk_directionality", "erank_qk", "stable_rank_qk",
                      "energy_rank90_qk", "energy_rank99_qk"):
                notes[m] = reason
        else:
            q = identity_queries(h, d, e, dev) if identity else as_float32(layer.W_Q, dev)

        if q is not None:
            out.heads("qk_symmetry", qk_geometry.symmetry_per_head(q, k, kv_of))
            out.whole("qk_symmetry", qk_geometry.symmetry_layer(q, k))
            out.whole("qk_directionality", qk_geometry.directionality_layer(q, k))
            for stat, vals in spectra.qk_stats(q, k, kv_of).items():
                out.heads(f"{stat}_qk", vals)

        if identity:
            reason = "W_Q is the identity slice (query-free model): there is no query projection"
            for m in ("erank_q", "stable_rank_q", "energy_rank90_q", "energy_rank99_q",
                      "wq_condition", "wq_basis_orth_defect", "wq_absorb_error"):
                notes[m] = reason
        else:
            for stat, vals in spectra.tall_stats(q).items():
                out.heads(f"{stat}_q", vals)
        for p, t, kv in (("k", k, True), ("v", v, True)):
            for stat, vals in spectra.tall_stats(t).items():
                out.heads(f"{stat}_{p}", vals, kv=kv)
        for stat, vals in spectra.wide_stats(o).items():
            out.heads(f"{stat}_o", vals)

        for p, t in (("q", None if identity else q), ("k", k), ("v", v), ("o", o)):
            if t is not None:
                out.whole(f"norm_{p}", float(torch.linalg.vector_norm(t)))
        if identity:
            notes["norm_q"] = "W_Q is the identity slice (query-free model): there is no query projection"
        else:
            cond, defect = query_absorb.condition_and_defect(q)
            out.whole("wq_condition", cond)
            square = h * e == d
            if meta.norm == "none":
                notes["wq_basis_orth_defect"] = (
                    "no normalisation: any invertible change of basis is absorbable, see wq_absorb_error")
                if square:
                    b_q = as_float32(layer.b_Q, dev) if layer.b_Q is not None else None
                    b_k = as_float32(layer.b_K, dev) if layer.b_K is not None else None
                    out.whole("wq_absorb_error", query_absorb.absorb_error(q, k, b_q, b_k))
                else:
                    notes["wq_absorb_error"] = (
                        f"stacked W_Q is {d} x {h * e}, not square: no identity-query conversion")
            else:
                notes["wq_absorb_error"] = (
                    f"model uses {meta.norm}: the conversion is not exact through the norm, "
                    "see wq_basis_orth_defect")
                if square:
                    out.whole("wq_basis_orth_defect", defect)
                else:
                    notes["wq_basis_orth_defect"] = (
                        f"stacked W_Q is {d} x {h * e}, not square: no identity-query conversion")
    return out.frame(), notes
