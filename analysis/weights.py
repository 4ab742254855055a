"""All weight-level metrics of one attention layer, as a tidy frame.

``weight_metrics(layer, meta)`` takes any object with the canonical per-layer
tensors (``layer``, ``W_Q`` (or None), ``W_K``, ``W_V``, ``W_O``, ``b_Q``,
``b_K``; shapes in ``loaders/canonical.py``) and any object with the geometry
fields (``n_heads``, ``n_kv_heads``, ``d_model``, ``d_head``, ``norm``,
``variant``; optionally ``query_module``: a query that is not a linear map of x,
whose W_Q metrics are then absent with a note naming it), e.g. ``loaders.canonical.AttentionWeights`` and ``ModelMeta``;
``analysis`` does not import ``loaders``, the two meet structurally.

It returns ``(frame, notes)``: ``frame`` has the columns ``layer, head,
head_label, metric, value`` (``head`` None for whole-layer values; kv-head
metrics are labelled ``L{l}KV{g}``) and ``degenerate`` (the value is fixed by a
rank-deficient ``W_K[g]`` or a singular stacked W_Q, ``analysis.degenerate``), ``notes`` maps each metric that does not
exist for this model to the reason. Formulas live in the family modules
(``kv_similarity``, ``qk_geometry``, ``spectra``, ``query_absorb``).

Per layer this costs a handful of batched ``[heads, d_head, d_head]`` Gram
products (float64, from the float32 weights), each formed once and shared by
the metrics that need it, three
batched float64 eigen-decompositions of ``[n_heads, d_head, d_head]`` stacks
(W_Q, W_O, ``M_h``), small ones for the kv heads and the stacked K and V, and
for the query-absorbability metrics one LU factorisation of the stacked
``d_model x d_model`` W_Q with Lanczos runs (``query_absorb``), the
``O(d_model^3)`` floor. The layer-level ``qk_symmetry`` and ``qk_directionality``
come from thin float64 pieces of ``M = W_Q W_K^T`` when the stacked kv heads are
narrow (``d_model >= qk_geometry.DENSE_BELOW * n_kv_heads * d_head``), else from ``M``
formed once in float32 (``qk_geometry.dense_layer_scores``: a full multi-head
layer's thin pieces are five ``d_model x d_model`` float64 products, 13 of the 17
CPU seconds of a Llama-2-7B layer before).

Precision: every Gram and cross product is accumulated in float64 from the
float32 weights and every decomposition is float64 (``_linalg``), so the
spectra, ``kv_share_r2`` and the norms equal a float64 reference computed from
the matrices themselves to ~1e-6 relative or better at condition numbers up
to 1e6 (the dense layer-level scores: float32 accumulation, ~1e-6); ``wq_condition`` and ``wq_basis_orth_defect`` come from a float32 LU,
``sigma_min`` refined to float64 accuracy when its condition estimate exceeds
``query_absorb.REDO_CONDITION`` (``query_absorb`` explains). ``tests/analysis/test_precision.py`` checks all of this.

Per-layer spectra (``head`` None) exist for W_K and W_V of grouped-query models
(their stacked matrix is at most half as wide as W_Q's); for W_Q, W_O and the
K and V of full multi-head models, the ``notes`` say why they are absent.
"""
from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

import pandas as pd
import torch

from analysis import kv_similarity, qk_geometry, query_absorb, spectra
from analysis._linalg import (as_float32, clean_eigh, gram, identity_queries, kv_index, psd_sqrt_from, row_gram,
                             spectrum_stats, stack_heads)
from analysis.degenerate import add_note, rank_deficient, stored_eps
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
        self.degenerate: set[tuple[str, int | None]] = set()   # (metric, head) fixed by construction

    def heads(self, metric: str, values: torch.Tensor, *, kv: bool = False) -> None:
        tag = "KV" if kv else "H"
        for h, v in enumerate(values.tolist()):
            self.rows.append((self.layer, h, f"L{self.layer}{tag}{h}", metric, float(v)))

    def whole(self, metric: str, value: float) -> None:
        self.rows.append((self.layer, None, f"L{self.layer}", metric, float(value)))

    def frame(self) -> pd.DataFrame:
        df = pd.DataFrame(self.rows, columns=COLUMNS)
        df["head"] = df["head"].astype("Int64")
        df["degenerate"] = [(m, None if pd.isna(h) else int(h)) in self.degenerate
                            for m, h in zip(df["metric"], df["head"])]
        return df


_QUERY_FREE = "W_Q is the identity slice (query-free model): there is no query projection"
_STATS = ("erank", "stable_rank", "energy_rank90", "energy_rank99")


def _nonlinear_note(meta: MetaLike) -> str | None:
    """The note of every W_Q metric of a model whose query is not a linear map of x
    (``meta.query_module``, the nonlinear queries of arXiv 2603.13381), else None."""
    module = getattr(meta, "query_module", None)
    return f"the query is not a linear map of x ({module}): there is no W_Q to measure" if module else None


def _layer_spectra_note(what: str, width: int, d_model: int) -> str:
    return (f"{what}: per head only; the per-layer value needs the full spectrum of the layer's stacked "
            f"{d_model} x {width} matrix, an O(d_model^3) eigen-decomposition per layer that the default "
            f"analysis leaves out")


#: The metrics ``skip`` can leave uncomputed, each group by the work it saves: the layer-level
#: ``M`` scores (``qk_symmetry``, per head too, and ``qk_directionality``) and the stacked-W_Q LU.
SKIPPABLE = frozenset({"qk_symmetry", "qk_directionality", "wq_condition", "wq_basis_orth_defect"})


def weight_metrics(layer: LayerLike, meta: MetaLike, *, device: str | torch.device | None = None,
                   skip: Collection[str] = ()) -> tuple[pd.DataFrame, dict[str, str]]:
    """Every weight-level metric of ``layer`` (see module docstring).

    ``skip``: metrics of ``SKIPPABLE`` whose values are not wanted (``analysis.chance`` passes
    those with a closed-form chance level on its random layers): their rows are still there,
    with value NaN, so the frame has the same ``(metric, head)`` keys; the work is left out
    only where every metric sharing it is skipped (the stacked-W_Q LU needs ``wq_condition``
    and ``wq_basis_orth_defect`` both skipped); ``qk_directionality`` leaves out the layer's ``M``
    (so the per-layer ``qk_symmetry`` is NaN too), and with ``qk_symmetry`` also the per-head one.
    """
    check_geometry(layer, meta)
    dev = torch.device(device or default_device())
    h, g, d, e = meta.n_heads, meta.n_kv_heads, meta.d_model, meta.d_head
    skip = frozenset(skip)
    unknown = sorted(skip - SKIPPABLE)
    if unknown:
        raise AnalysisError(f"weight_metrics: cannot skip {unknown}; skippable: {sorted(SKIPPABLE)}")
    skip_m = "qk_directionality" in skip                      # the layer's M left out
    skip_head_sym = {"qk_symmetry", "qk_directionality"} <= skip
    out = _Rows(layer.layer)
    notes: dict[str, str] = {}
    with torch.inference_mode():
        k = as_float32(layer.W_K, dev)                       # [g, d, e]
        v = as_float32(layer.W_V, dev)                       # [g, d, e]
        kv_of = kv_index(h, g, dev)
        kvp = kv_similarity.products(k, v)                   # K^T K, V^T V, K^T V: [g, e, e] float64
        eig_k = clean_eigh(kvp.kk)                           # float64 (lam ascending, U)
        # W_O[h] W_O[h]^T, [h, e, e] float64, converted a few heads at a time in the loader's layout
        go = row_gram(layer.W_O.detach().to(dev))

        # -- K/V similarity
        out.heads("kv_cosine_flat", kv_similarity.cosine_flat(k, v, prod=kvp), kv=True)
        out.heads("kv_cka", kv_similarity.linear_cka(k, v, prod=kvp), kv=True)
        out.heads("kv_share_r2", kv_similarity.share_r2(k, v, prod=kvp, eig_k=eig_k), kv=True)

        # -- a rank-deficient W_K[g] leaves the share fit underdetermined (analysis.degenerate)
        low_rank = rank_deficient(eig_k[0].clamp_min(0).sqrt(),
                                  stored_eps(getattr(meta, "dtype", None), layer.W_K.dtype))
        if bool(low_rank.any()):
            bad = [i for i, b in enumerate(low_rank.tolist()) if b]
            out.degenerate |= {("kv_share_r2", i) for i in bad}
            add_note(notes, "kv_share_r2", "degenerate where W_K[g] is rank-deficient at its stored precision "
                                           "(rows flagged): the fit of V on its columns is underdetermined")

        # -- Q/K geometry (identity slices for a query-free model)
        # a nonlinear query (meta.query_module) has no W_Q to measure, whatever W_Q holds
        nonlinear = _nonlinear_note(meta)
        identity = layer.W_Q is None and nonlinear is None
        no_q = identity or nonlinear is not None
        q = gq = form = None
        if nonlinear is not None or (identity and h * e != d):
            reason = nonlinear or (f"W_Q is absent but n_heads*d_head ({h * e}) != d_model ({d}), "
                                   "so the query is not an identity slice of x")
            for m in ("qk_symmetry", "qk_directionality", *(f"{s}_qk" for s in _STATS)):
                notes[m] = reason
        else:
            q = identity_queries(h, d, e, dev) if identity else as_float32(layer.W_Q, dev)   # [h, d, e]
            if skip_head_sym:
                gq, c_qk = gram(q), None                     # [h, e, e], float64
            else:                                            # Q_h^T Q_h and K^T Q_h: one float64 copy of Q
                gq, c_qk = qk_geometry.query_products(q, k, kv_of)
            eig_q = clean_eigh(gq)
            sk = psd_sqrt_from(eig_k)                        # (K^T K)^{1/2}, [g, e, e]
            if skip_head_sym:                                # rows kept, values not wanted
                out.heads("qk_symmetry", torch.full((h,), float("nan")))
            else:
                out.heads("qk_symmetry", qk_geometry.symmetry_per_head(q, k, kv_of, gq=gq, gk=kvp.kk, c=c_qk))
            if skip_m:
                sym = direction = float("nan")
            elif d < qk_geometry.DENSE_BELOW * g * e:        # wide kv stack: M itself, once
                sym, direction = qk_geometry.dense_layer_scores(q, k)
            else:                                            # narrow: the layer's M in thin pieces
                form = qk_geometry.layer_form(q, k)
                sym = qk_geometry.symmetry_layer(q, k, form=form)
                direction = qk_geometry.directionality_layer(q, k, form=form)
            out.whole("qk_symmetry", sym)
            out.whole("qk_directionality", direction)
            for stat, vals in spectra.qk_stats_from(eig_q, sk[kv_of]).items():
                out.heads(f"{stat}_qk", vals)

        # -- spectra per head, from the Grams' eigenvalues
        per_head = {"q": None if no_q else spectrum_stats(eig_q[0].sqrt()),
                    "k": spectrum_stats(eig_k[0].sqrt()), "v": spectra.gram_stats(kvp.vv),
                    "o": spectra.gram_stats(go)}
        for p, stats in per_head.items():
            for stat, vals in (stats or {}).items():
                out.heads(f"{stat}_{p}", vals, kv=p in ("k", "v"))
        # -- and per layer where the stacked matrix is narrow (grouped kv heads)
        if g < h:
            gks = form.gks if form is not None else gram(stack_heads(k))
            for p, g_stack in (("k", gks), ("v", gram(stack_heads(v)))):
                for stat, val in spectra.gram_stats(g_stack).items():
                    out.whole(f"{stat}_{p}", float(val))
        absent = [("o", "W_O", h * e)] + ([] if no_q else [("q", "W_Q", h * e)])
        absent += [] if g < h else [("k", "W_K", g * e), ("v", "W_V", g * e)]
        for p, what, width in absent:
            for s in _STATS:
                notes[f"{s}_{p}"] = _layer_spectra_note(what, width, d)

        # -- norms: ||A||_F^2 is the sum of the traces of the per-head Grams
        grams = {"q": None if no_q else gq, "k": kvp.kk, "v": kvp.vv, "o": go}
        norms = {p: float(torch.diagonal(t, dim1=1, dim2=2).double().sum()) ** 0.5
                 for p, t in grams.items() if t is not None}
        for p, val in norms.items():
            out.whole(f"norm_{p}", val)

        # -- query absorbability
        if no_q:
            for m in (*(f"{s}_q" for s in _STATS), "norm_q", "wq_condition", "wq_basis_orth_defect",
                      "wq_absorb_error"):
                notes[m] = nonlinear or _QUERY_FREE
        else:
            _absorbability(out, notes, layer, meta, q, k, fro2=norms["q"] ** 2,
                           skip_lu={"wq_condition", "wq_basis_orth_defect"} <= skip)
    # -- metrics that plugins registered (analysis.registry.register; QKVSCOPE_PLUGINS names their modules)
    from analysis.plugins import add_weight_metrics   # imported here: this block is the file's one tie to plugins

    add_weight_metrics(out, notes, layer, meta, dev)
    return out.frame(), notes


def _absorbability(out: _Rows, notes: dict[str, str], layer: LayerLike, meta: MetaLike,
                   q: torch.Tensor, k: torch.Tensor, *, fro2: float, skip_lu: bool = False) -> None:
    """``wq_condition`` and, by the model's normalisation, ``wq_basis_orth_defect`` or ``wq_absorb_error``
    (``skip_lu``: the first two NaN, their LU left out)."""
    h, d, e = meta.n_heads, meta.d_model, meta.d_head
    stacked = None if skip_lu else query_absorb.stacked_spectrum(q, fro2=fro2)
    out.whole("wq_condition", float("nan") if stacked is None else stacked.condition)
    if stacked is not None and stacked.sigma_min == 0:
        out.degenerate |= {("wq_condition", None), ("wq_basis_orth_defect", None)}
        for m in ("wq_condition", "wq_basis_orth_defect"):
            add_note(notes, m, "degenerate where the stacked W_Q is singular (rank < d_model; rows flagged), "
                               "e.g. query heads that repeat a block (Q = K with grouped kv heads): no finite "
                               "condition number, no change of basis")
    square = h * e == d
    if meta.norm == "none":
        notes["wq_basis_orth_defect"] = (
            "no normalisation: any invertible change of basis is absorbable, see wq_absorb_error")
        if square:
            b_q = as_float32(layer.b_Q, q.device) if layer.b_Q is not None else None
            b_k = as_float32(layer.b_K, q.device) if layer.b_K is not None else None
            out.whole("wq_absorb_error", query_absorb.absorb_error(q, k, b_q, b_k))
        else:
            notes["wq_absorb_error"] = f"stacked W_Q is {d} x {h * e}, not square: no identity-query conversion"
    else:
        notes["wq_absorb_error"] = (f"model uses {meta.norm}: the conversion is not exact through the norm, "
                                    "see wq_basis_orth_defect")
        if square:
            out.whole("wq_basis_orth_defect", float("nan") if stacked is None else stacked.orth_defect)
        else:
            notes["wq_basis_orth_defect"] = (
                f"stacked W_Q is {d} x {h * e}, not square: no identity-query conversion")
