"""All weight-level metrics of one attention layer, as a tidy frame.

``weight_metrics(layer, meta)`` takes any object with the canonical per-layer
tensors (``layer``, ``W_Q`` (or None), ``W_K``, ``W_V``, ``W_O``, ``b_Q``,
``b_K``; shapes in ``loaders/canonical.py``) and any object with the geometry
fields (``n_heads``, ``n_kv_heads``, ``d_model``, ``d_head``, ``norm``,
``variant``; optionally ``query_module``: a query that is not a linear map of x,
whose W_Q metrics are then absent with a note naming it), e.g. ``loaders.canonical.AttentionWeights`` and ``ModelMeta``;
``analysis`` does not import ``loaders``, the two meet structurally.

It returns ``(frame, notes)``: ``frame`` has the columns ``layer, head,
head_label, metric, value, layer2, head2`` (``head`` None for whole-layer values; kv-head
metrics are labelled ``L{l}KV{g}``; ``head2`` set on the rows of a head pair, labelled
``L{l}H{h}-H{h2}``) and ``degenerate`` (the value is fixed by a
rank-deficient ``W_K[g]`` or a singular stacked W_Q, ``analysis.degenerate``), ``notes`` maps each metric that does not
exist for this model to the reason. Each metric is a registered ``compute``
(``analysis.registry``): the built-in families declare theirs in ``analysis/metrics/``
(formulas in ``kv_similarity``, ``qk_geometry``, ``qk_parts``, ``spectra``, ``query_absorb``), a plugin
its own; all read the layer's one ``analysis.products.LayerProducts``.

Per layer this costs a handful of batched ``[heads, d_head, d_head]`` Gram
products (float64, from the float32 weights), each formed once and shared by
the metrics that need it, three
batched float64 eigen-decompositions of ``[n_heads, d_head, d_head]`` stacks
(W_Q, W_O, ``M_h``), small ones for the kv heads and the stacked K and V, a
Cholesky, an ``eigvalsh`` and an ``svdvals`` of ``2 d_head`` square matrices per
query head (the symmetric and skew parts of ``M_h``, ``qk_parts``), and
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
import pandas as pd
import torch

from analysis import registry
from analysis.degenerate import add_note
from analysis.errors import AnalysisError
from analysis.layer import AttentionWeights, Geometry
from analysis.registry import COLUMNS, PAIR_COLUMNS, Absent, Values, check_plugins

#: The canonical layer (``analysis.layer``) and the geometry a layer's metrics read.
LayerLike = AttentionWeights
MetaLike = Geometry


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

    def pairs(self, metric: str, values: torch.Tensor, *, kv: bool = False) -> None:
        """``values`` ``[n, n]`` over the layer's (kv) heads as rows ``(layer, head, head2)``, ``head2 !=
        head``: a head with itself is no pair (its value is fixed, and would widen the null band)."""
        tag = "KV" if kv else "H"
        for h, row in enumerate(values.tolist()):
            for h2, v in enumerate(row):
                if h2 == h:
                    continue
                self.rows.append((self.layer, h, f"L{self.layer}{tag}{h}-{tag}{h2}", metric, float(v), None, h2))

    def frame(self) -> pd.DataFrame:
        df = pd.DataFrame([r if len(r) == 7 else (*r, None, None) for r in self.rows],
                          columns=COLUMNS + PAIR_COLUMNS)
        for col in ("head", *PAIR_COLUMNS):
            df[col] = df[col].astype("Int64")
        df["degenerate"] = [(m, None if pd.isna(h) else int(h)) in self.degenerate
                            for m, h in zip(df["metric"], df["head"])]
        return df


def weight_metrics(layer: LayerLike, meta: MetaLike, *, device: str | torch.device | None = None,
                   skip: Collection[str] = (), whole: bool = True,
                   heads: bool = True) -> tuple[pd.DataFrame, dict[str, str]]:
    """Every weight-level metric of ``layer`` (see module docstring): each registered metric's
    ``compute`` (``analysis.registry``; the built-in families of ``analysis.metrics`` and plugins
    alike) on the layer's one ``analysis.products.LayerProducts``, in registration order.

    ``skip``: metrics whose values are not wanted (``analysis.chance`` passes those it has enough
    draws of): they give no rows, and the products only they read are not formed. ``whole``: False
    leaves out every per-layer value (``head`` None) that a metric computes only where it is wanted,
    ``heads``: False likewise the per-head values (``analysis.products``).
    """
    from analysis.products import LayerProducts   # here: products imports the registry, which imports this

    check_geometry(layer, meta)
    dev = torch.device(device or default_device())
    skip = frozenset(skip)
    # a layer_pair metric reads every layer at once: the model-level pass computes it, not this one
    todo = [p for p in registry.computed("weights") if p.metric.axis != "layer_pair"]
    unknown = sorted(skip - {p.metric.name for p in registry.computed("weights")})
    if unknown:
        raise AnalysisError(f"weight_metrics: cannot skip {unknown}: not registered weight metrics")
    check_plugins()
    p = LayerProducts(layer, meta, dev, whole=whole, heads=heads)
    out = _Rows(layer.layer)
    notes: dict[str, str] = {}
    with torch.inference_mode():
        for entry in todo:
            m = entry.metric
            if m.name in skip:
                continue
            try:
                got = entry.compute(p, meta, dev)
            except Absent as why:
                notes[m.name] = str(why)
                continue
            _add_values(out, m, got, meta)
    out.degenerate |= p.degenerate
    for name, text in p.notes.items():
        add_note(notes, name, text)
    return out.frame(), notes


def _values(metric: str, got, count: int, what: str) -> torch.Tensor:
    """``got`` (a tensor, a sequence or a number) as ``count`` float64 values on the CPU."""
    vals = torch.as_tensor(got, dtype=torch.float64).detach().cpu().reshape(-1)
    if vals.numel() != count:
        raise AnalysisError(f"metric {metric!r}: compute returned {vals.numel()} values, expected {count} "
                            f"({what})")
    return vals


def _add_values(out: _Rows, m, got, meta: MetaLike) -> None:
    """A ``compute``'s return as rows by the metric's axis (``registry.Plugin``)."""
    if m.axis in ("head_pair", "kv_head_pair"):
        kv = m.axis == "kv_head_pair"
        n = meta.n_kv_heads if kv else meta.n_heads
        vals = _values(m.name, got, n * n, f"an [{n}, {n}] matrix over the layer's {'kv ' if kv else ''}heads")
        out.pairs(m.name, vals.reshape(n, n), kv=kv)
        return
    if isinstance(got, Values):
        per_head, whole = got
    else:
        per_head, whole = (got if m.axis == "head+layer" else
                           (None, got) if m.axis == "layer" else (got, None))
    if per_head is not None:
        kv = m.axis == "kv_head"
        count, what = (meta.n_kv_heads, "one per kv head") if kv else (meta.n_heads, "one per head")
        out.heads(m.name, _values(m.name, per_head, count, what), kv=kv)
    if whole is not None:
        out.whole(m.name, float(_values(m.name, whole, 1, "one for the layer")[0]))
