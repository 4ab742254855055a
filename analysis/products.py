"""The shared per-layer products every weight metric computes from, built-in and plugin alike.

``weight_metrics`` makes one ``LayerProducts`` per layer and hands it to every
registered metric's ``compute(layer, meta, device)`` as ``layer``. Each product
is formed the first time a metric reads it and kept for the others, so a layer
costs what its metrics read, once (``analysis/weights.py`` gives the costs):

* ``W_Q`` ... ``b_V``: the canonical tensors (``analysis.layer``) as float32 on
  ``device``; ``layer`` is the layer's index.
* ``q``: ``W_Q``, or the identity slices of a query-free model
  (``qk_missing`` says why there is no ``M`` to measure, None where there is);
  ``no_q``: the model has no W_Q of its own to measure (``q_missing`` the note).
* ``kv_of``: the kv head of each query head; ``kvp``: ``K^T K``, ``V^T V``,
  ``K^T V`` per kv head (float64, ``kv_similarity.KVProducts``); ``eig_k``: the
  clean eigen-decomposition of ``K^T K``; ``sk``: its square root.
* ``gq``: ``Q_h^T Q_h`` (float64), with ``c_qk`` = ``K_{g(h)}^T Q_h`` from the same
  float64 copy of Q when a metric reads both (``query_products``); ``eig_q``.
* ``go``: ``W_O[h] W_O[h]^T`` (float64).
* ``stacked_gram(p)``: the Gram of the layer's stacked W_K or W_V (float64; the layer's
  spectra and the cross-head blocks read it); ``head_pairs(p)``: ``W_p[i]^T W_p[j]`` for pairs of
  kv heads; ``frobenius(p)``: ``<W_p[i], W_p[j]>_F`` (``analysis.metrics.cross_head``).
* ``head_symmetry``, ``layer_scores`` (the layer's ``M`` symmetry and
  directionality), ``head_spectra(p)``, ``layer_spectra(p)``, ``qk_spectra``,
  ``qk_parts`` (the spectra of ``M_h``'s symmetric and skew parts), ``norm(p)``,
  ``stacked`` (the stacked W_Q's spectrum): the family results that several
  metrics read.

``whole``, ``heads``: whether per-layer and per-head values are wanted
(``analysis.chance``'s wide random layers want per-head values only, its later draws
of the model's shapes per-layer ones); a metric may return None for a value not wanted. ``notes`` and ``degenerate`` collect what a metric says beside
its values: ``add_note(notes, metric, text)`` and ``(metric, head)`` pairs of rows
fixed by construction (``analysis.degenerate``).
"""
from __future__ import annotations

from functools import cached_property

import torch

from analysis import kv_similarity, qk_geometry, qk_parts, query_absorb, spectra
from analysis._linalg import (as_float32, clean_eigh, f64_chunks, gram, identity_queries, kv_index, psd_sqrt_from,
                             row_gram, spectrum_stats, stack_heads)
from analysis.layer import AttentionWeights, Geometry
from analysis.registry import Absent

#: The canonical tensors a metric reads as float32 on the layer's device.
TENSORS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V")
#: The note of every W_Q metric of a query-free model.
QUERY_FREE = "W_Q is the identity slice (query-free model): there is no query projection"


class LayerProducts:
    """One layer's canonical tensors and the products formed from them (module docstring)."""

    def __init__(self, layer: AttentionWeights, meta: Geometry, device: torch.device, *, whole: bool = True,
                 heads: bool = True):
        self.layer = layer.layer
        self.source, self.meta, self.device, self.whole, self.heads = layer, meta, device, whole, heads
        self.notes: dict[str, str] = {}
        self.degenerate: set[tuple[str, int | None]] = set()
        self._tensors: dict[str, torch.Tensor | None] = {}

    def __getattr__(self, name: str):
        if name not in TENSORS:
            raise AttributeError(name)
        seen = self.__dict__["_tensors"]
        if name not in seen:
            t = getattr(self.__dict__["source"], name, None)
            seen[name] = None if t is None else as_float32(t, self.__dict__["device"])
        return seen[name]

    # -- the query
    @cached_property
    def nonlinear(self) -> str | None:
        """The note of a query that is not a linear map of x (``meta.query_module``), else None."""
        module = getattr(self.meta, "query_module", None)
        return f"the query is not a linear map of x ({module}): there is no W_Q to measure" if module else None

    @cached_property
    def identity(self) -> bool:
        """The query is the identity slice (no W_Q stored, and a linear query)."""
        return self.source.W_Q is None and self.nonlinear is None

    @property
    def no_q(self) -> bool:
        return self.identity or self.nonlinear is not None

    @property
    def q_missing(self) -> str:
        """The note of a W_Q metric where ``no_q``."""
        return self.nonlinear or QUERY_FREE

    @cached_property
    def qk_missing(self) -> str | None:
        """Why the layer has no ``M = W_Q W_K^T`` to measure, None where it has one."""
        m = self.meta
        if self.nonlinear is not None:
            return self.nonlinear
        if self.identity and m.n_heads * m.d_head != m.d_model:
            return (f"W_Q is absent but n_heads*d_head ({m.n_heads * m.d_head}) != d_model ({m.d_model}), "
                    "so the query is not an identity slice of x")
        return None

    def need_q(self) -> None:
        """Raise ``Absent`` for a metric of W_Q itself where the model has none."""
        if self.no_q:
            raise Absent(self.q_missing)

    def need_qk(self) -> None:
        """Raise ``Absent`` for a metric of ``M`` where the layer has none."""
        if self.qk_missing is not None:
            raise Absent(self.qk_missing)

    @cached_property
    def q(self) -> torch.Tensor:
        m = self.meta
        return (identity_queries(m.n_heads, m.d_model, m.d_head, self.device) if self.identity
                else self.W_Q)

    @cached_property
    def kv_of(self) -> torch.Tensor:
        return kv_index(self.meta.n_heads, self.meta.n_kv_heads, self.device)

    # -- Grams and cross products, float64
    @cached_property
    def kvp(self) -> kv_similarity.KVProducts:
        return kv_similarity.products(self.W_K, self.W_V)

    @cached_property
    def eig_k(self) -> tuple[torch.Tensor, torch.Tensor]:
        return clean_eigh(self.kvp.kk)

    @cached_property
    def sk(self) -> torch.Tensor:
        return psd_sqrt_from(self.eig_k)

    @cached_property
    def query_products(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(Q_h^T Q_h, K_{g(h)}^T Q_h)`` from one float64 copy of Q (``qk_geometry.query_products``)."""
        return qk_geometry.query_products(self.q, self.W_K, self.kv_of)

    @cached_property
    def gq(self) -> torch.Tensor:
        if "query_products" in self.__dict__:
            return self.query_products[0]
        return gram(self.q)

    @cached_property
    def eig_q(self) -> tuple[torch.Tensor, torch.Tensor]:
        return clean_eigh(self.gq)

    @cached_property
    def go(self) -> torch.Tensor:
        # converted a few heads at a time in the loader's layout
        return row_gram(self.source.W_O.detach().to(self.device))

    # -- family results several metrics read
    @cached_property
    def head_symmetry(self) -> torch.Tensor:
        """``qk_geometry.symmetry_per_head``, ``[n_heads]``."""
        gq, c = self.query_products
        self.__dict__.setdefault("gq", gq)
        return qk_geometry.symmetry_per_head(self.q, self.W_K, self.kv_of, gq=gq, gk=self.kvp.kk, c=c)

    @cached_property
    def form(self) -> qk_geometry.LayerForm:
        return qk_geometry.layer_form(self.q, self.W_K)

    @cached_property
    def layer_scores(self) -> tuple[float, float]:
        """``(symmetry, directionality)`` of the layer's ``M``: formed once when the kv stack is
        wide, else from its thin pieces (``weights`` module docstring)."""
        q, k, m = self.q, self.W_K, self.meta
        if m.d_model < qk_geometry.DENSE_BELOW * m.n_kv_heads * m.d_head:
            return qk_geometry.dense_layer_scores(q, k)
        return (qk_geometry.symmetry_layer(q, k, form=self.form),
                qk_geometry.directionality_layer(q, k, form=self.form))

    @cached_property
    def qk_spectra(self) -> dict[str, torch.Tensor]:
        return spectra.qk_stats_from(self.eig_q, self.sk[self.kv_of])

    @cached_property
    def qk_parts(self) -> qk_parts.Parts:
        """The spectra of ``M_h``'s symmetric and skew-symmetric parts per query head, in the head's
        subspace from the shared float64 products (``qk_parts.parts``)."""
        gq, c = self.query_products
        self.__dict__.setdefault("gq", gq)
        return qk_parts.parts(gq, self.kvp.kk[self.kv_of], c)

    def head_spectra(self, p: str) -> dict[str, torch.Tensor]:
        """The four rank summaries per head of ``W_{p}`` (``p`` in ``q k v o``)."""
        key = f"_spectra_{p}"
        if key not in self.__dict__:
            self.__dict__[key] = {"q": lambda: spectrum_stats(self.eig_q[0].sqrt()),
                                  "k": lambda: spectrum_stats(self.eig_k[0].sqrt()),
                                  "v": lambda: spectra.gram_stats(self.kvp.vv),
                                  "o": lambda: spectra.gram_stats(self.go)}[p]()
        return self.__dict__[key]

    def stacked_gram(self, p: str) -> torch.Tensor:
        """The Gram of the layer's stacked ``W_{p}`` (``p`` in ``k v``), float64
        ``[n_kv d_head, n_kv d_head]``: block ``(i, j)`` is ``W_p[i]^T W_p[j]``."""
        key = f"_stacked_gram_{p}"
        if key not in self.__dict__:
            if p == "k":
                self.__dict__[key] = self.form.gks.double() if "form" in self.__dict__ else gram(stack_heads(self.W_K))
            else:
                self.__dict__[key] = gram(stack_heads(self.W_V))
        return self.__dict__[key]

    def layer_spectra(self, p: str) -> dict[str, float]:
        """The four rank summaries of the layer's stacked ``W_{p}`` (``p`` in ``k v``), from its Gram."""
        key = f"_layer_spectra_{p}"
        if key not in self.__dict__:
            self.__dict__[key] = {s: float(v) for s, v in spectra.gram_stats(self.stacked_gram(p)).items()}
        return self.__dict__[key]

    def head_pairs(self, p: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(i, j, C)``: pairs of the layer's kv heads ``i < j`` and ``C = W_p[i]^T W_p[j]``
        ``[pairs, d_head, d_head]`` (float64; ``p`` in ``k v``). Every pair where per-layer values
        are wanted: the blocks of ``stacked_gram(p)`` where a metric formed it already (the
        layer's K/V spectra of a grouped-query layer), else only its upper blocks (half the cost:
        ``n^2 d_model d_head^2 / 2`` multiply-adds); where they are not
        (``analysis.chance``'s wide random layers) the disjoint pairs ``(2m, 2m+1)`` only, each
        product formed on its own: independent draws of a pair, at ``n/2`` products instead of
        ``n^2/2``."""
        key = f"_head_pairs_{p}"
        if key not in self.__dict__:
            w = self.W_K if p == "k" else self.W_V
            n, e = w.shape[0], w.shape[2]
            if self.whole:
                i, j = torch.triu_indices(n, n, 1, device=self.device)
                if f"_stacked_gram_{p}" in self.__dict__ or (p == "k" and "form" in self.__dict__):
                    c = self.stacked_gram(p).reshape(n, e, n, e).permute(0, 2, 1, 3)[i, j]
                else:                                    # the Gram's upper blocks only: half its cost
                    s = stack_heads(w).double()          # [d_model, n e]
                    c = torch.cat([(s[:, a * e:(a + 1) * e].mT @ s[:, (a + 1) * e:]).reshape(e, n - a - 1, e)
                                   .permute(1, 0, 2) for a in range(n - 1)]) if n > 1 else \
                        torch.zeros(0, e, e, dtype=torch.float64, device=self.device)
            else:
                i = torch.arange(0, n - 1, 2, device=self.device)
                j = i + 1
                c = torch.cat([a.mT @ b for a, b in zip(f64_chunks(w[i], 64), f64_chunks(w[j], 64))]) \
                    if len(i) else torch.zeros(0, e, e, dtype=torch.float64, device=self.device)
            self.__dict__[key] = (i, j, c)
        return self.__dict__[key]

    def frobenius(self, p: str) -> torch.Tensor:
        """``F_ij = <W_p[i], W_p[j]>_F`` over the layer's kv heads (``p`` in ``k v``), ``[n_kv, n_kv]``
        float64 (``analysis.head_grouping``)."""
        key = f"_frobenius_{p}"
        if key not in self.__dict__:
            w = self.W_K if p == "k" else self.W_V
            flat = w.reshape(w.shape[0], -1).double()
            self.__dict__[key] = flat @ flat.T
        return self.__dict__[key]

    def norm(self, p: str) -> float:
        """``||W_p||_F`` of the layer (all heads): the square root of the summed traces of its Grams."""
        g = {"q": lambda: self.gq, "k": lambda: self.kvp.kk, "v": lambda: self.kvp.vv, "o": lambda: self.go}[p]()
        return float(torch.diagonal(g, dim1=1, dim2=2).double().sum()) ** 0.5

    @cached_property
    def stacked(self) -> query_absorb.StackedSpectrum:
        """The stacked W_Q's spectrum (one LU, ``query_absorb.stacked_spectrum``)."""
        return query_absorb.stacked_spectrum(self.q, fro2=self.norm("q") ** 2)
