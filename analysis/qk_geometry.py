"""Symmetry and directionality of the bilinear form ``M = W_Q W_K^T``.

Attention logits are ``x_i M x_j^T`` (times the attention scale), with
``M = Q K^T`` a ``d_model x d_model`` matrix that is never formed here.

* **Symmetry score** (Saponati et al. 2025, arXiv 2502.10927, Def. 3.1):
  ``s = ||(M + M^T)/2||_F^2 / ||M||_F^2 = (1 + tr(M^2) / ||M||_F^2) / 2``
  with ``tr(M^2) = tr((K^T Q)^2)`` and ``||M||_F^2 = tr((Q^T Q)(K^T K))``, all
  ``d_head x d_head`` products. 1: symmetric (Q = K); ~0.5 random; 0: antisymmetric.
* **Per layer**, ``M = sum_h Q_h K_{g(h)}^T`` (g: the head's kv head). Grouping
  the query heads that share a kv head, ``M = Qs Ks^T`` with
  ``Qs = [sum_{h in group j} Q_h]_j`` and ``Ks = [K_j]_j``, both
  ``d_model x (n_kv_heads * d_head)``; the same identities apply.
* **Precision**: every product here is float64 (the weights converted
  exactly), so the scores equal a float64 ``M`` formed explicitly to ~1e-12
  even on heads with condition number 1e6; the products are thin
  (``d_model x d_head`` inputs, ``d_head``-sided outputs), so float64 costs
  little.
* **Directionality score** (same paper; as the authors compute it in
  ``matteosaponati/attention-geometry``, ``utils/scores.py``,
  ``directionality_score``): with ``r_i = ||M[i, :]||_2`` (row norms: residual
  directions read by the query) and ``c_j = ||M[:, j]||_2`` (column norms:
  directions read by the key), thresholds ``t_r = mean(r) + gamma * std(r)``
  and ``t_c`` likewise (gamma = 2, std with Bessel's correction), the excesses
  ``e_r = sum_{r_i > t_r} (r_i - t_r)`` and ``e_c = sum_{c_j > t_c} (c_j - t_c)``,
  and ``d = (e_c - e_r) / (e_c + e_r)`` in [-1, 1]; 0 when no row or column
  exceeds its threshold. Positive: a few key-side directions dominate (the
  paper's "column dominance", typical of decoders). Per layer only (``M``
  summed over heads, as the authors' ``W_q W_k^T`` of the whole layer). Row
  norms are ``diag(Qs (Ks^T Ks) Qs^T)``, column norms ``diag(Ks (Qs^T Qs) Ks^T)``:
  ``d_model`` values from thin products. (For GQA this uses the attention's
  own ``M``, each query head with its kv head; the authors' grouped-attention
  branch reshapes W_K differently.)
* **Cost, per layer**: the thin pieces cost ``5 d_model (n_kv d_head)^2``
  float64 multiply-adds (``layer_form`` and the two scores), ``O(d_model^3)``
  for a full multi-head layer (``n_kv d_head = d_model``: five ``d x d`` float64
  products, 13 of the 17 CPU seconds of a Llama-2-7B layer before). Where
  ``d_model < DENSE_BELOW * n_kv * d_head``, ``dense_layer_scores`` forms ``M``
  itself instead, once (``d_model^2 n_kv d_head``, in float32; on oneDNN with
  bfloat16 inputs when the weights are exactly bfloat16 values, as a bf16
  checkpoint's are: the same products at 3x float32's speed with AMX) and reads
  both scores off it in one pass over row tiles (no transposed or float64 copy of ``M``:
  0.5 s of a 7B layer's 1.4 s before). Precision of that path: float32 accumulation, so each
  entry of ``M`` carries a relative error ``~sqrt(n_kv d_head) * eps32`` of its
  terms' magnitude and the scores agree with float64 to ~1e-6 (measured
  5e-7 on ``M``'s largest entries at d_model 4096); ``tests/analysis/test_precision.py``
  holds the layer analysis to 1e-3 at condition numbers up to 1e6. The functions
  ``symmetry_layer`` and ``directionality_layer`` stay float64 throughout.
* **Logit symmetry** (activations): the symmetry score of a head's ``T x T``
  pre-softmax logit matrix on sample tokens, before the causal mask.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from functools import lru_cache
from typing import NamedTuple

import torch

from analysis._linalg import CHUNK, f64_chunks, gram, stack_heads, sum_groups

#: ``dense_layer_scores`` is the cheaper way to the layer's scores when
#: ``d_model < DENSE_BELOW * n_kv_heads * d_head`` (float64 thin products, 5 of
#: ``d (n_kv e)^2``, against one float32 ``d^2 (n_kv e)`` product at 2-6x float64's rate).
DENSE_BELOW = 8


def _f64(t: torch.Tensor) -> torch.Tensor:
    """Exact float64 copy of ``t``, keeping its stride order (heads stored transposed stay so)."""
    return t.detach().to(torch.float64)


def _stack64(a: torch.Tensor) -> torch.Tensor:
    """``[heads, rows, d_head] -> [rows, heads*d_head]`` (head-major columns), float64;
    ``analysis._linalg.stack_heads`` in float64."""
    heads, rows, d_head = a.shape
    return _f64(a).mT.reshape(heads * d_head, rows).mT       # [heads*d_head, rows] -> [rows, heads*d_head]


def query_products(q: torch.Tensor, k: torch.Tensor, kv_of: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Q_h^T Q_h, K_{kv_of[h]}^T Q_h)`` per query head, both ``[n_heads, d_head, d_head]``
    float64, each head's Q and K converted to float64 once (a few kv groups at a time, at
    most ``_linalg.CHUNK`` elements of Q: the products share the copies).

    ``q: [n_heads, d_model, d_head]``, ``k: [n_kv_heads, d_model, d_head]``, ``kv_of``
    sorted (``kv_index``: query heads grouped by kv head); any other map gathers the keys.
    """
    with torch.inference_mode():
        n_heads, d_model, d_head = q.shape
        n_kv = k.shape[0]
        r = n_heads // n_kv
        if r * n_kv != n_heads or not bool((kv_of == torch.arange(n_heads, device=kv_of.device) // r).all()):
            q64, k64 = _f64(q), _f64(k)
            return gram(q64), k64[kv_of].mT @ q64
        per = max(1, CHUNK // max(1, r * d_model * d_head))             # kv groups per chunk
        gq, c = [], []
        for q64, k64 in zip(f64_chunks(q, per * r), f64_chunks(k, per)):   # [p*r, d, e], [p, d, e]
            gq.append(q64.mT @ q64)
            qg = q64.reshape(k64.shape[0], r, d_model, d_head)           # query heads by kv group
            c.append((k64.mT.unsqueeze(1) @ qg).reshape(-1, d_head, d_head))   # K_g^T Q_h
        return torch.cat(gq), torch.cat(c)


def symmetry_per_head(q: torch.Tensor, k: torch.Tensor, kv_of: torch.Tensor, *,
                      gq: torch.Tensor | None = None, gk: torch.Tensor | None = None,
                      c: torch.Tensor | None = None) -> torch.Tensor:
    """Symmetry score of ``M_h = Q_h K_{kv_of[h]}^T`` per query head, ``[n_heads]`` float64.

    ``q: [n_heads, d_model, d_head]``, ``k: [n_kv_heads, d_model, d_head]``,
    ``kv_of: [n_heads]`` the kv head of each query head. ``gq``, ``gk``, ``c``: the Grams
    ``Q_h^T Q_h`` and ``K_g^T K_g`` and the products ``K_{kv_of[h]}^T Q_h`` if the caller
    has them in float64 (``query_products``; a float32 one is recomputed in float64: its
    round-off is what this avoids).
    """
    with torch.inference_mode():
        f64 = lambda t: t is not None and t.dtype == torch.float64   # noqa: E731
        if not (f64(gq) and f64(c)):
            gq, c = query_products(q, k, kv_of)
        # c: K^T Q, [n_heads, d_head, d_head]
        tr_m2 = (c * c.mT).sum((1, 2))                       # tr(C C)
        gk = (gk if f64(gk) else gram(k))[kv_of]
        norm2 = (gq * gk).sum((1, 2))                        # tr(Gq Gk), both symmetric
        return (1 + tr_m2 / norm2) / 2


def group_queries(q: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """Sum of the query heads sharing each kv head: ``[n_kv_heads, d_model, d_head]`` float64."""
    return sum_groups(_f64(q), n_kv_heads)


class LayerForm(NamedTuple):
    """The layer's ``M = Qs Ks^T`` in thin pieces (float64), shared by its scores."""

    qs: torch.Tensor      # [d_model, n_kv*d_head], grouped query heads side by side
    ks: torch.Tensor      # [d_model, n_kv*d_head], kv heads side by side
    gqs: torch.Tensor     # Qs^T Qs
    gks: torch.Tensor     # Ks^T Ks (also the Gram of the layer's stacked W_K)
    c: torch.Tensor       # Ks^T Qs


def layer_form(q: torch.Tensor, k: torch.Tensor) -> LayerForm:
    """``Qs, Ks: [d_model, n_kv_heads*d_head]`` (float64) with ``M = Qs Ks^T`` summed
    over heads, and their three small products."""
    with torch.inference_mode():
        n_kv, d_model, d_head = k.shape
        qs = _stack64(group_queries(q, n_kv))                # [d_model, n_kv*d_head]
        ks = _stack64(k)                                     # [d_model, n_kv*d_head]
        return LayerForm(qs, ks, gram(qs), gram(ks), ks.T @ qs)


def symmetry_layer(q: torch.Tensor, k: torch.Tensor, *, form: LayerForm | None = None) -> float:
    """Symmetry score of ``M = sum_h Q_h K_{g(h)}^T`` (float)."""
    with torch.inference_mode():
        f = layer_form(q, k) if form is None else form
        c, gqs, gks = f.c.double(), f.gqs.double(), f.gks.double()   # [n_kv*d_head]^2
        return float((1 + (c * c.T).sum() / (gqs * gks).sum()) / 2)


def _exact_bf16(t: torch.Tensor) -> bool:
    """Whether every entry of float32 ``t`` is a bfloat16 value (a bf16 checkpoint's weights
    are): the low 16 bits of each float32 are zero. Read in place when ``t`` or ``t^T`` is
    contiguous (``stack_heads``' layout): the low halves are the even int16 words
    (little-endian), one pass with no temporary."""
    base = t if t.is_contiguous() else (t.mT if t.mT.is_contiguous() else t.contiguous())
    halves = base.view(torch.int16)
    low = halves[..., 0::2] if _LITTLE else halves[..., 1::2]
    return not bool(low.any())


_LITTLE = sys.byteorder == "little"
#: Rows of ``M`` per tile in ``dense_layer_scores``' one pass (a ``d_model x 128`` transposed
#: tile fits in L2 at d_model 4096).
_TILE = 128


@contextmanager
def _bf16_inputs(on: bool):
    """While ``on``: float32 matrix products on oneDNN read their inputs as bfloat16
    (``torch.backends.mkldnn.matmul.fp32_precision = "bf16"``; AMX or AVX512-BF16)
    and accumulate in float32. Exact for inputs that are bfloat16 values."""
    flag = getattr(torch.backends.mkldnn, "matmul", None)
    if not on or flag is None or not hasattr(flag, "fp32_precision"):
        yield
        return
    before = flag.fp32_precision
    flag.fp32_precision = "bf16"
    try:
        yield
    finally:
        flag.fp32_precision = before


def dense_layer_scores(q: torch.Tensor, k: torch.Tensor, *, gamma: float = 2.0) -> tuple[float, float]:
    """``(symmetry_layer, directionality_layer)`` from ``M = Qs Ks^T`` formed explicitly
    (``[d_model, d_model]`` float32; see the module docstring's cost and precision notes).

    ``q: [n_heads, d_model, d_head]``, ``k: [n_kv_heads, d_model, d_head]``. Symmetry
    ``(1 + sum(M * M^T) / sum(M^2)) / 2`` and the row and column norms of ``M``
    for the directionality, every sum in float64.
    """
    with torch.inference_mode():
        n_kv = k.shape[0]
        q32 = q.float() if q.shape[0] == n_kv else sum_groups(q.float(), n_kv)    # [n_kv, d_model, d_head]
        qs = stack_heads(q32)                                # [d_model, n_kv*d_head]; BLAS reads either layout
        ks = stack_heads(k.float())                          # [d_model, n_kv*d_head]
        fast = qs.device.type == "cpu" and _exact_bf16(qs) and _exact_bf16(ks)
        with _bf16_inputs(fast):
            m = qs @ ks.mT                                   # M, [d_model, d_model] float32, row-major
        del qs, ks
        # one pass over row tiles: squares for the row and column norms, and M[I, :] * (M[:, I])^T
        # for tr(M^2), all summed in float64 (no transposed copy of M, no float64 copy)
        n = m.shape[0]
        rows2 = torch.empty(n, dtype=torch.float64, device=m.device)      # ||M[i, :]||^2
        cols2 = torch.zeros(n, dtype=torch.float64, device=m.device)      # ||M[:, j]||^2
        tr_m2 = torch.zeros((), dtype=torch.float64, device=m.device)     # sum_ij M_ij M_ji
        for i in range(0, n, _TILE):
            tile = m[i:i + _TILE]                            # [t, d_model]
            sq = tile * tile
            rows2[i:i + _TILE] = sq.sum(1, dtype=torch.float64)
            cols2 += sq.sum(0, dtype=torch.float64)
            tr_m2 += torch.sum(tile * m[:, i:i + _TILE].mT, dtype=torch.float64)
        del m
        sym = float((1 + tr_m2 / rows2.sum()) / 2)
        return sym, float(directionality_from_norms(rows2.sqrt(), cols2.sqrt(), gamma))


def outlier_excess(norms: torch.Tensor, gamma: float = 2.0) -> torch.Tensor:
    """``sum_{x_i > t} (x_i - t)`` with ``t = mean(x) + gamma * std(x)`` (Bessel's
    correction): how far the outliers of ``norms: [..., n]`` exceed the threshold, ``[...]``."""
    t = norms.mean(-1, keepdim=True) + gamma * norms.std(-1, keepdim=True)
    return (norms - t).clamp_min(0).sum(-1)


def directionality_from_norms(rows: torch.Tensor, cols: torch.Tensor, gamma: float = 2.0) -> torch.Tensor:
    """``(e_c - e_r) / (e_c + e_r)`` from the row norms ``rows: [..., n]`` and column norms
    ``cols: [..., m]`` of ``M`` (``outlier_excess`` of each); 0 where no norm exceeds its threshold."""
    e_r, e_c = outlier_excess(rows, gamma), outlier_excess(cols, gamma)
    den = e_r + e_c
    return torch.where(den > 0, (e_c - e_r) / torch.where(den > 0, den, torch.ones_like(den)),
                       torch.zeros_like(den))


def directionality_layer(q: torch.Tensor, k: torch.Tensor, *, gamma: float = 2.0,
                         form: LayerForm | None = None) -> float:
    """Directionality score ``(e_c - e_r) / (e_c + e_r)`` of the layer's ``M``
    (the authors' definition: outlier excesses over ``mean + gamma * std``)."""
    with torch.inference_mode():
        f = layer_form(q, k) if form is None else form
        qs, ks, gqs, gks = f.qs.double(), f.ks.double(), f.gqs.double(), f.gks.double()
        rows = ((qs @ gks) * qs).sum(1).clamp_min(0).sqrt()   # ||M[i, :]||, [d_model]
        cols = ((ks @ gqs) * ks).sum(1).clamp_min(0).sqrt()   # ||M[:, j]||, [d_model]
        return float(directionality_from_norms(rows, cols, gamma))


#: Normals per batch of ``query_free_directionality_null`` (about 0.1 s of one CPU core): a batch is
#: ``NULL_NORMALS / (d_model n_kv d_head)`` draws, at least 64, at most 4,096.
NULL_NORMALS = 1 << 23


@lru_cache(maxsize=256)
def query_free_directionality_null(n_heads: int, n_kv_heads: int, d_model: int, d_head: int, seed: int,
                                   batch: int) -> torch.Tensor:
    """Directionality scores of random query-free layers (float64, ``NULL_NORMALS`` normals' worth),
    the ``batch``-th batch of the stream seeded by ``seed`` (deterministic; cached, so the metric on the
    paper's scale reads the same draws).

    A query-free layer (``Q_h`` the identity slice ``E_h``, ``n_heads d_head = d_model``) has
    ``M = Qs Ks^T`` whose rows ``h d_head + c`` are column ``c`` of ``K_{g(h)}``: its row norms are
    the ``n_kv d_head`` column norms of the stacked ``Ks: [d_model, n_kv d_head]``, each repeated
    ``r = n_heads / n_kv_heads`` times, and its column ``j`` has norm ``sqrt(r) ||Ks[j, :]||``. A
    draw is therefore one Gaussian ``d_model x n_kv d_head`` matrix and its two norm vectors
    (``d_model n_kv d_head`` normals, no ``d_model^2`` product and no other metric), the score
    exactly as ``directionality_layer`` computes it on such a layer (``tests/analysis/test_chance.py``
    checks the two agree on the same K). The scale of K cancels (the score is scale-free)."""
    r, n = n_heads // n_kv_heads, n_kv_heads * d_head
    gen = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + batch)
    size = min(4096, max(64, NULL_NORMALS // (n * d_model)))
    per = max(1, min(size, (1 << 21) // (n * d_model)))               # ~8 MB of float32 normals at a time
    out = []
    with torch.inference_mode():
        for start in range(0, size, per):
            out.append(query_free_directionality(torch.randn(min(per, size - start), n, d_model, generator=gen),
                                                 r))
    return torch.cat(out)


def query_free_directionality(kt: torch.Tensor, r: int) -> torch.Tensor:
    """Directionality of query-free layers from their stacked keys alone: ``kt: [..., n_kv d_head,
    d_model]`` (the rows of the key projection's ``nn.Linear`` weight, kv head by kv head), ``r`` query
    heads per kv head; ``[...]`` float64 (``query_free_directionality_null``'s derivation). Sums of
    squares in float32 (<= 2^16 terms: ~1e-7 relative), the rest in float64."""
    w = kt.float()
    w = w * w
    rows = w.sum(-1).double().sqrt().repeat_interleave(r, dim=-1)      # [..., d_model] = [..., r n_kv d_head]
    cols = (r * w.sum(-2).double()).sqrt()                             # [..., d_model]
    return directionality_from_norms(rows, cols)


def matrix_symmetry(m: torch.Tensor) -> torch.Tensor:
    """Symmetry score of square stacks ``[..., n, n]`` (e.g. logits), float64 ``[...]``."""
    with torch.inference_mode():
        m64 = m.double()
        return (1 + (m64 * m64.mT).sum((-2, -1)) / m64.square().sum((-2, -1))) / 2
