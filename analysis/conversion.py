"""Post-hoc sharing: convert one trained attention layer to a tied or shared form.

Every function takes a canonical layer (``loaders.canonical.AttentionWeights``: ``W_Q
[n_heads, d_model, d_head]``, ``W_K``/``W_V`` ``[n_kv_heads, d_model, d_head]``, ``W_O
[n_heads, d_head, d_model]``, biases or None) and returns a NEW layer (``dataclasses.replace``;
the caller's tensors are never written). Arithmetic is float64, results in the layer's dtype.
Query head ``h`` reads kv head ``h // (n_heads // n_kv_heads)``. Row vectors: ``k = x W_K + b_K``.

``stats`` is what the activation-aware methods fit on: the layer's captured input ``x``
(after the layer's norm) summarised as ``InputStats`` (the uncentred second moment
``E[x^T x]``, the mean ``E[x]``, the token count). Biases are fitted with the input augmented
by a constant 1 (``x~ = [x, 1]``, ``E[x~^T x~] = [[E x^T x, E x^T], [E x, 1]]``).

Targets and methods (formulas; sources):

``k_eq_v`` (one cached tensor per layer; paper B arXiv 2606.04032, its ``distillation_llm.py``
does the first three as post-hoc surgery):
  * ``keep_k``: W_V := W_K.  ``keep_v``: W_K := W_V.  ``avg``: both := (W_K + W_V) / 2.
  * ``lstsq`` (default): W_V := W_K and, for each query head h of kv head g,
    W_O[h] := T_g W_O[h] with T_g = argmin_T E||x~ W~_K T - x~ W~_V||^2 + lam ||T - I||^2
    = (W~_K^T S W~_K + lam I)^-1 (W~_K^T S W~_V + lam I), S = E[x~^T x~],
    lam = RIDGE * tr(W~_K^T S W~_K) / d_head. The ridge pulls T towards the identity (keep_k),
    not towards 0: a layer with K = V gets T = I exactly, and since T = I is a candidate, the
    fit error on the captured inputs is never larger than ``keep_k``'s.
    Values enter the output only through ``softmax(.) V W_O`` and the softmax weights sum to one,
    so ``V T W_O`` with V := K is exactly a model that caches K once and re-maps it in W_O; the
    minimiser of the error in V-space is also the minimiser in output space for any W_O of full
    row rank (the normal equations K^T (K T - V) W_O W_O^T = 0). It is the activation K=V
    sharing fit (DESIGN.md) made into a conversion.
``q_eq_k`` (symmetric logits):
  * ``keep_q``: W_K[g] := mean of W_Q over g's query heads.  ``keep_k``: W_Q[h] := W_K[g].
    ``avg``: both := (mean_g W_Q + W_K) / 2.
  * ``psd``: head logits are x_i M x_j^T with M = W_Q W_K^T (summed over g's query heads for
    GQA); a tied W gives the logit map W W^T, which is symmetric positive semi-definite of rank
    <= d_head. The closest such map in Frobenius norm to M is the PSD rank-d_head truncation of
    the symmetric part (M + M^T)/2 (the antisymmetric part is orthogonal to every symmetric
    map; on the PSD cone keep the d_head largest positive eigenvalues, Higham 1988). It lives
    in the span of U = [W_Q[h]..., W_K[g]]: with U = Q_U R_U (QR), (M+M^T)/2 = Q_U C Q_U^T,
    C = R_U J R_U^T, so the eigen-decomposition is of C (size (group+1) d_head, never
    d_model^2) and W = Q_U V_+ diag(sqrt(lambda_+)).
``q_eq_k_eq_v``: ``A+B``: ``q_eq_k`` by A, then ``k_eq_v`` by B on the result (default ``psd+lstsq``).
``gqa`` (``n_kv_heads -> G``) and ``mqa`` (G = 1):
  * ``mean``: K and V mean-pooled within each group of n_kv_heads / G heads (Ainslie et al.,
    arXiv 2305.13245, section 2.1). The groups are contiguous runs of heads unless a ``grouping``
    is given (``analysis.head_grouping``: e.g. the free grouping of least mean-pool residual),
    which ``regroup`` makes contiguous first by permuting the heads (an exact change).
  * ``aligned``: before pooling, each head j of a group is rotated onto the group's first head
    by orthogonal Procrustes on the captured input (R_j = U V^T from the SVD of
    W_K[j]^T S W_K[ref]), W_K[j] := W_K[j] R_j and the query heads that read j get W_Q[h] R_j
    (q.k unchanged); the same for V with W_O[h] := R_j^T W_O[h] (Jin et al., arXiv 2412.20677).
    With rotary positions an orthogonal map of the key does not commute with the rotation, so
    keys are not rotated (``rotary=True``: R_j = I for K; values are).
``wq_identity`` (no W_Q: head h's query is the slice ``x[:, h d_head:(h+1) d_head]`` of the layer's
  normalised input; the query-free paper, Karbevski & Mijoski, arXiv 2510.23912), method ``basis``.
  It is a change of basis of the whole residual stream, ``x~ = x M`` (``query_basis``), with each
  layer's query factor folded into its keys (``fold_query``); ``experiments.whatif`` applies it to a
  model. Norm gains ``g`` are folded into the matrices that read the norm first (``diag(g) W``).
  With the stacked query ``A = [W_Q[0] | ... | W_Q[H-1]]`` of each layer (gains folded) and
  ``R = M^-1 A`` the factor left in a layer:
  * no norm: ``M`` = the mean of the layers' ``A`` (any invertible ``M`` passes through the
    residual stream: writers ``W M``, readers ``M^-1 W``). Exact (Theorem 4.1 and section 4.4 of
    the paper: one layer, or a layer-shared W_Q) when every ``A`` equals ``M`` up to a
    block-diagonal factor.
  * RMSNorm: only an orthogonal ``M`` commutes with the norm (``rms(x U) = rms(x)``), so ``M`` is
    the orthogonal polar factor of ``sum_l s_l A_l / ||A_l||_F`` (the orthogonal ``U`` closest to all
    layers' ``A``: Procrustes; the signs ``s_l = +-1`` align every layer with one reference layer,
    since a sign moves into the key), as SliceGPT (Ashkboos et al., arXiv 2401.15024) and QuaRot
    (arXiv 2404.00456) move rotations through the stream after folding the gains.
  * LayerNorm: the writers are first centred (``W (I - 1 1^T / d)``: the stream is then mean-zero
    and LayerNorm's centring a no-op, SliceGPT section 3.2), and ``U`` is that polar factor
    restricted to map ``1`` to ``+-1`` (the sign of ``1^T target 1``; the polar factor on the
    complement of ``1``), so the rotated stream stays mean-zero and LayerNorm still only rescales it.
  In every case head h's diagonal block ``B_h = R[h, h]`` (``d_head x d_head``) moves into the key
  (``W_K' = W_K B^T``, exact: ``(z B) k^T = z (k B^T)^T``), averaged over the query heads of a kv
  head; with rotary positions only its part that commutes with the rotation (a scaled rotation
  ``a I + b J`` per frequency pair) moves. What is dropped is ``R`` outside those blocks (and, for
  GQA, each head's difference from its group's block): ``fold_query`` reports
  ``off_block = ||R - blockdiag(B)||_F / ||R||_F`` (0: exact) and ``polar_remainder`` of ``R``
  (its distance from a scaled identity). A query bias ``b_Q`` (plus the norm bias through W_Q)
  becomes the new norm's bias ``b' = beta B^-1`` where the norm has a bias (LayerNorm with
  biases), and is dropped (reported) where it has none.
``latent`` (R numbers cached per token and layer, MHA2MLA-style, Ji et al. arXiv 2502.14837):
  the joint rank-R activation-aware SVD of C = [W_K | W_V] (``d_model x 2 n_kv_heads d_head``):
  with S = E[x^T x] = Q L Q^T, A = L^1/2 Q^T, [A C]_R = U_R s_R V_R^T, the down-projection
  W_down = A^+ U_R s_R (``d_model x R``) and up-projection V_R^T; W_K, W_V are replaced by the
  composed low-rank maps W_down V_R^T (the function of the latent model). Positions: the latent
  is cached before any rotation; keys are up-projected and rotated on read (the absorbed
  decoding trick of DeepSeek-V2 then does not apply to the rotary part; MHA2MLA keeps a few
  rotary dimensions uncompressed to get it back, which this conversion does not do).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from analysis.conversion_targets import DEFAULT_METHOD, METHODS

#: Relative ridge of the least-squares fits (times the mean eigenvalue of the normal matrix).
RIDGE = 1e-6


class ConversionError(ValueError):
    """A conversion that does not apply to this layer (geometry, method)."""


@dataclass(frozen=True)
class InputStats:
    """A layer's captured input: ``gram = E[x^T x]`` ``[d_model, d_model]``, ``mean = E[x]``
    ``[d_model]`` (float64) over ``n`` tokens."""

    gram: torch.Tensor
    mean: torch.Tensor
    n: int

    def augmented(self) -> torch.Tensor:
        """``E[x~^T x~]`` of ``x~ = [x, 1]``: ``[d_model + 1, d_model + 1]``."""
        d = self.gram.shape[0]
        s = torch.empty(d + 1, d + 1, dtype=torch.float64)
        s[:d, :d] = self.gram
        s[:d, d] = self.mean
        s[d, :d] = self.mean
        s[d, d] = 1.0
        return s


def input_stats(x: torch.Tensor) -> InputStats:
    """``InputStats`` of captured inputs ``x`` ``[..., d_model]``."""
    x = x.reshape(-1, x.shape[-1]).double()
    n = x.shape[0]
    return InputStats(x.T @ x / n, x.mean(0), n)


def _d(t):
    return None if t is None else t.double()


def _aug(w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``[heads, d_model, d_head]`` and bias ``[heads, d_head]`` -> ``[heads, d_model + 1, d_head]``."""
    b = torch.zeros(w.shape[0], w.shape[2], dtype=w.dtype) if b is None else b
    return torch.cat([w, b[:, None, :]], dim=1)


def _back(layer, **new):
    """``layer`` with ``new`` tensors cast to its dtype (None stays None)."""
    dt = layer.W_K.dtype
    return replace(layer, **{k: (None if v is None else v.to(dt).contiguous()) for k, v in new.items()})


def _group(layer) -> int:
    h, g = layer.W_O.shape[0], layer.W_K.shape[0]
    if h % g:
        raise ConversionError(f"layer {layer.layer}: {h} query heads are not a multiple of {g} kv heads")
    return h // g


def _need(stats, what):
    if stats is None:
        raise ConversionError(f"{what} fits on the layer's captured input: pass stats")
    return stats


# -- K = V -------------------------------------------------------------------------------
def share_map(layer, stats: InputStats, ridge: float = RIDGE) -> torch.Tensor:
    """``T [n_kv_heads, d_head, d_head]``: the ridge least-squares map from K to V on ``stats``
    (module docstring, ``lstsq``), float64."""
    s = stats.augmented()
    k, v = _aug(_d(layer.W_K), _d(layer.b_K)), _aug(_d(layer.W_V), _d(layer.b_V))   # [g, d+1, dh]
    a = k.transpose(1, 2) @ s @ k                                                # [g, dh, dh]
    b = k.transpose(1, 2) @ s @ v
    dh = a.shape[-1]
    lam = ridge * a.diagonal(dim1=1, dim2=2).sum(-1) / dh                        # [g]
    eye = torch.eye(dh, dtype=torch.float64)
    return torch.linalg.solve(a + lam[:, None, None] * eye, b + lam[:, None, None] * eye)


def k_eq_v(layer, method: str = "lstsq", stats: InputStats | None = None):
    """The layer with one tensor for K and V (module docstring: ``keep_k``, ``keep_v``, ``avg``, ``lstsq``)."""
    wk, wv, bk, bv = _d(layer.W_K), _d(layer.W_V), _d(layer.b_K), _d(layer.b_V)
    wo = _d(layer.W_O)
    if method == "keep_k":
        w, b = wk, bk
    elif method == "keep_v":
        w, b = wv, bv
    elif method == "avg":
        w = (wk + wv) / 2
        b = None if bk is None and bv is None else ((bk if bk is not None else 0) + (bv if bv is not None else 0)) / 2
    elif method == "lstsq":
        t = share_map(layer, _need(stats, "lstsq"))                               # [g, dh, dh]
        w, b = wk, bk
        wo = t.repeat_interleave(_group(layer), dim=0) @ wo                        # [h, dh, d]
    else:
        raise ConversionError(f"k_eq_v: unknown method {method!r}: expected one of {', '.join(METHODS['k_eq_v'])}")
    q_tied = layer.W_Q is not None and layer.W_Q.shape[0] == layer.W_O.shape[0] and torch.equal(
        layer.W_Q, layer.W_K.repeat_interleave(_group(layer), dim=0))
    out = dict(W_K=w, W_V=w, b_K=b, b_V=b, W_O=wo)
    if q_tied and method == "keep_v":                 # a Q=K layer stays Q=K with K := V
        out.update(W_Q=w.repeat_interleave(_group(layer), dim=0), b_Q=None if b is None else b.repeat_interleave(_group(layer), dim=0))
    return _back(layer, **out)


# -- Q = K -------------------------------------------------------------------------------
def _group_mean(w: torch.Tensor, per: int) -> torch.Tensor:
    """``[h, ...] -> [h / per, ...]``: the mean of each run of ``per`` heads."""
    return w.reshape(w.shape[0] // per, per, *w.shape[1:]).mean(1)


def psd_share(wq: torch.Tensor, wk: torch.Tensor) -> torch.Tensor:
    """One kv head's tied W ``[d_model, d_head]`` with ``W W^T`` the best PSD rank-d_head
    approximation of the symmetric part of ``sum_h W_Q[h] W_K^T`` (``wq`` ``[per, d_model, d_head]``,
    ``wk`` ``[d_model, d_head]``), computed in their span (module docstring, ``psd``)."""
    per, d, dh = wq.shape
    u = torch.cat([*wq, wk], dim=1)                                               # [d, (per+1) dh]
    qu, r = torch.linalg.qr(u)                                                    # [d, m], [m, (per+1) dh]
    m = u.shape[1]
    j = torch.zeros(m, m, dtype=torch.float64)                                    # U J U^T = sum_h (Q_h K^T + K Q_h^T)/2
    for h in range(per):
        j[h * dh:(h + 1) * dh, per * dh:] = 0.5 * torch.eye(dh, dtype=torch.float64)
    j = j + j.T
    c = r @ j @ r.T
    lam, vec = torch.linalg.eigh((c + c.T) / 2)                                   # ascending
    lam, vec = lam.flip(0)[:dh].clamp(min=0), vec.flip(1)[:, :dh]
    return qu @ vec * lam.sqrt()                                                  # [d, dh]


def q_eq_k(layer, method: str = "psd", stats: InputStats | None = None):
    """The layer with W_Q := W_K (expanded over each kv head's query heads), by ``method``."""
    if layer.W_Q is None:
        raise ConversionError(f"layer {layer.layer}: the query is the identity slice, there is no W_Q to tie")
    per = _group(layer)
    wq, wk, bq, bk = _d(layer.W_Q), _d(layer.W_K), _d(layer.b_Q), _d(layer.b_K)
    bq_g = None if bq is None else _group_mean(bq, per)
    if method == "keep_k":
        w, b = wk, bk
    elif method == "keep_q":
        w, b = _group_mean(wq, per), bq_g
    elif method == "avg":
        w = (_group_mean(wq, per) + wk) / 2
        b = None if bq is None and bk is None else ((bq_g if bq_g is not None else 0) + (bk if bk is not None else 0)) / 2
    elif method == "psd":
        w = torch.stack([psd_share(wq[g * per:(g + 1) * per], wk[g]) for g in range(wk.shape[0])])
        b = bk
    else:
        raise ConversionError(f"q_eq_k: unknown method {method!r}: expected one of {', '.join(METHODS['q_eq_k'])}")
    kv_tied = torch.equal(layer.W_K, layer.W_V)
    out = dict(W_Q=w.repeat_interleave(per, dim=0), b_Q=None if b is None else b.repeat_interleave(per, dim=0),
               W_K=w, b_K=b)
    if kv_tied:                                        # a K=V layer keeps V = K
        out.update(W_V=w, b_V=b)
    return _back(layer, **out)


def q_eq_k_eq_v(layer, method: str = "psd+lstsq", stats: InputStats | None = None):
    """``q_eq_k`` by the method before ``+``, then ``k_eq_v`` (``keep_k`` keeps the tie) by the one after."""
    if method not in METHODS["q_eq_k_eq_v"]:
        raise ConversionError(f"q_eq_k_eq_v: unknown method {method!r}: expected A+B with A one of "
                              f"{', '.join(METHODS['q_eq_k'])} and B one of {', '.join(METHODS['k_eq_v'])}")
    qk, kv = method.split("+")
    step = q_eq_k(layer, qk, stats)
    if kv in ("keep_v", "avg"):   # the value side moves K: keep Q tied to the new K
        step = k_eq_v(step, kv, stats)
        per = _group(step)
        return _back(step, W_Q=step.W_K.repeat_interleave(per, dim=0),
                     b_Q=None if step.b_K is None else step.b_K.repeat_interleave(per, dim=0))
    return k_eq_v(step, kv, stats)


# -- GQA / MQA ---------------------------------------------------------------------------
def procrustes(a: torch.Tensor, b: torch.Tensor, s: torch.Tensor | None) -> torch.Tensor:
    """Orthogonal ``R`` ``[d_head, d_head]`` minimising ``E||x a R - x b||^2`` (``s = E[x^T x]``,
    None: the weights alone): ``R = U V^T`` of ``svd(a^T s b)`` (Schoenemann 1966)."""
    m = a.T @ (s @ b if s is not None else b)
    u, _, vt = torch.linalg.svd(m)
    return u @ vt


def regroup(layer, grouping):
    """``layer`` with its kv heads in the order of ``grouping`` (groups of kv head indices, each
    head once), each kv head's query heads, their ``W_O`` rows and per-head biases and norm gains
    moved with it: the same function (the output sums over heads), with ``grouping``'s groups
    contiguous, so ``gqa`` pools exactly them."""
    nkv, per = layer.W_K.shape[0], _group(layer)
    order = [int(h) for g in grouping for h in g]
    if sorted(order) != list(range(nkv)) or len({len(g) for g in grouping}) != 1:
        raise ConversionError(f"layer {layer.layer}: grouping {[list(g) for g in grouping]} is not a partition of "
                              f"its {nkv} kv heads into groups of one size")
    q_order = [j * per + t for j in order for t in range(per)]

    def take(t, idx):
        return None if t is None else t[idx]

    return replace(layer, W_Q=take(layer.W_Q, q_order), b_Q=take(layer.b_Q, q_order), W_O=layer.W_O[q_order],
                   W_K=layer.W_K[order], W_V=layer.W_V[order], b_K=take(layer.b_K, order),
                   b_V=take(layer.b_V, order),
                   q_norm=_heads_of(layer.q_norm, q_order), k_norm=_heads_of(layer.k_norm, order))


def _heads_of(gain, idx):
    """A per-head norm gain ``[heads, d_head]`` in the order ``idx``; a shared one (or None) as it is."""
    return gain if gain is None or gain.dim() < 2 else gain[idx]


def gqa(layer, groups: int, method: str = "mean", stats: InputStats | None = None, *, rotary: bool = False,
        grouping=None):
    """The layer with ``groups`` kv heads (module docstring: ``mean``, ``aligned``). ``grouping``:
    which kv heads pool together (``groups`` groups of kv head indices, e.g.
    ``analysis.head_grouping.best_grouping(...).groups``); None: contiguous runs of
    ``n_kv_heads / groups`` heads. With a grouping the layer is first ``regroup``ed, so its query
    heads come out in the order of the groups (the same function)."""
    nkv = layer.W_K.shape[0]
    if groups < 1 or nkv % groups:
        raise ConversionError(f"layer {layer.layer}: {nkv} kv heads cannot be pooled into {groups} groups "
                              f"(expected a divisor of {nkv})")
    if grouping is not None:
        if len(grouping) != groups:
            raise ConversionError(f"layer {layer.layer}: grouping has {len(grouping)} groups, expected {groups}")
        layer = regroup(layer, grouping)
    if method not in METHODS["gqa"]:
        raise ConversionError(f"gqa: unknown method {method!r}: expected one of {', '.join(METHODS['gqa'])}")
    per, qper = nkv // groups, _group(layer)
    wq, wk, wv, wo = _d(layer.W_Q), _d(layer.W_K).clone(), _d(layer.W_V).clone(), _d(layer.W_O).clone()
    bk, bv = _d(layer.b_K), _d(layer.b_V)
    q_tied = wq is not None and torch.equal(layer.W_Q, layer.W_K.repeat_interleave(qper, dim=0))
    kv_tied = torch.equal(layer.W_K, layer.W_V)
    wq = None if wq is None else wq.clone()
    if method == "aligned":
        s = _need(stats, "gqa aligned").gram
        for g in range(groups):
            ref = g * per
            for j in range(ref + 1, ref + per):
                heads = slice(j * qper, (j + 1) * qper)                           # query heads reading j
                rv = procrustes(wv[j], wv[ref], s)
                rk = rv if kv_tied else (torch.eye(wk.shape[2], dtype=torch.float64) if rotary
                                         else procrustes(wk[j], wk[ref], s))
                if kv_tied and rotary:
                    rk = rv = torch.eye(wk.shape[2], dtype=torch.float64)
                wk[j] = wk[j] @ rk
                wv[j] = wv[j] @ rv
                bk = None if bk is None else torch.cat([bk[:j], (bk[j] @ rk)[None], bk[j + 1:]])
                bv = None if bv is None else torch.cat([bv[:j], (bv[j] @ rv)[None], bv[j + 1:]])
                if wq is not None:
                    wq[heads] = wq[heads] @ rk
                wo[heads] = rv.T @ wo[heads]
    k, v = _group_mean(wk, per), _group_mean(wv, per)
    out = dict(W_K=k, W_V=v, W_O=wo, b_K=None if bk is None else _group_mean(bk, per),
               b_V=None if bv is None else _group_mean(bv, per), W_Q=wq)
    if q_tied:   # a Q=K layer stays Q=K: each query head reads its pooled key
        out["W_Q"] = k.repeat_interleave(nkv // groups * qper, dim=0)
    return _back(layer, **out)


# -- latent ------------------------------------------------------------------------------
def latent(layer, rank: int, stats: InputStats):
    """``(layer with rank-``rank`` composed W_K and W_V, W_down [d_model, rank], W_up [rank, 2 nkv dh])``
    (module docstring, ``latent``)."""
    g, d, dh = layer.W_K.shape
    if not 1 <= rank <= 2 * g * dh:
        raise ConversionError(f"layer {layer.layer}: latent rank {rank} outside 1..{2 * g * dh} (2 n_kv_heads d_head)")
    c = torch.cat([_d(layer.W_K).permute(1, 0, 2).reshape(d, g * dh),
                   _d(layer.W_V).permute(1, 0, 2).reshape(d, g * dh)], dim=1)      # [d, 2 g dh]
    lam, q = torch.linalg.eigh(_need(stats, "latent").gram)
    lam = lam.clamp(min=lam.max() * 1e-12)
    a = lam.sqrt()[:, None] * q.T                                                 # S = A^T A
    u, s, vt = torch.linalg.svd(a @ c, full_matrices=False)
    down = (q / lam.sqrt()) @ (u[:, :rank] * s[:rank])                            # A^-1 U_R s_R: [d, R]
    up = vt[:rank]                                                                # [R, 2 g dh]
    comp = down @ up
    wk = comp[:, :g * dh].reshape(d, g, dh).permute(1, 0, 2)
    wv = comp[:, g * dh:].reshape(d, g, dh).permute(1, 0, 2)
    return _back(layer, W_K=wk, W_V=wv), down, up


# -- W_Q = I ----------------------------------------------------------------------------
def absorb_query(layer):
    """``(layer', A)``: the layer with ``W_Q = None`` that computes on ``x~ = x A + b_Q`` what
    ``layer`` computes on ``x`` (the query-free paper's change of basis, arXiv 2510.23912,
    ``analysis.query_absorb``): ``A = [W_Q[0] | ... | W_Q[H-1]]`` (``d_model x n_heads d_head``,
    square and invertible), head h's query the slice ``x~[:, h d_head:(h+1) d_head]``,
    ``W_K' = A^-1 W_K``, ``b_K' = b_K - b_Q A^-1 W_K`` and the same for V; W_O is unchanged.
    Exact for the layer; a whole model needs ``x~`` as every such layer's input, which a model
    without norms gets by a change of basis of the residual stream (one ``A`` for all layers),
    and a model with norms only for the orthogonal part of ``A`` (``polar_remainder``)."""
    a = stacked_query(layer)                                                       # [d, H dh]
    bq = None if layer.b_Q is None else _d(layer.b_Q).reshape(-1)                  # [H dh]

    def through(w, b):                                                            # [g, d, dh]
        w2 = torch.linalg.solve(a, _d(w))                                         # A^-1 W per head
        if bq is None:
            return w2, b
        shift = bq @ w2                                                           # [g, dh]
        return w2, (-shift if b is None else _d(b) - shift)

    wk, bk = through(layer.W_K, layer.b_K)
    wv, bv = through(layer.W_V, layer.b_V)
    return _back(layer, W_Q=None, b_Q=None, W_K=wk, b_K=bk, W_V=wv, b_V=bv), a.to(layer.W_K.dtype)


def polar_remainder(a: torch.Tensor) -> float:
    """How far a change of basis ``A`` is from one that norms commute with: ``A = U P`` (polar
    decomposition, U orthogonal, P symmetric positive definite); U moves through RMSNorm and
    LayerNorm once their gains are folded (SliceGPT, arXiv 2401.15024; QuaRot, arXiv 2404.00456),
    P does not. Returns ``||P / c - I||_F / sqrt(n)`` with ``c = tr(P) / n``: 0 for a scaled
    orthogonal ``A``."""
    u, s, vt = torch.linalg.svd(a.double())
    p = vt.T @ torch.diag(s) @ vt
    n = p.shape[0]
    return float(torch.linalg.matrix_norm(p / (torch.trace(p) / n) - torch.eye(n, dtype=torch.float64)) / n ** 0.5)


def polar(a: torch.Tensor) -> torch.Tensor:
    """The orthogonal factor ``U`` of ``a = U P`` (``U V^T`` of the SVD ``a = U S V^T``)."""
    u, _, vt = torch.linalg.svd(a)
    return u @ vt


def stacked_query(layer) -> torch.Tensor:
    """``A = [W_Q[0] | ... | W_Q[H-1]]`` ``[d_model, H d_head]`` float64; square or ConversionError."""
    if layer.W_Q is None:
        raise ConversionError(f"layer {layer.layer}: the query is the identity slice already")
    h, d, dh = layer.W_Q.shape
    if h * dh != d:
        raise ConversionError(f"layer {layer.layer}: n_heads * d_head = {h * dh} is not d_model = {d}: "
                              "the stacked W_Q is not square")
    return _d(layer.W_Q).permute(1, 0, 2).reshape(d, h * dh)


def query_basis(stacks: list[torch.Tensor], norm: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(M, M^-1)`` of the residual stream for ``wq_identity`` (module docstring), from each layer's
    stacked query with its norm gain folded (``diag(g) A``, float64); ``norm``: ``none``,
    ``rmsnorm`` or ``layernorm``."""
    if norm == "none":
        m = torch.stack(stacks).mean(0)
        return m, torch.linalg.inv(m)
    unit = [a / torch.linalg.matrix_norm(a) for a in stacks]
    # A and -A differ by a sign that the key takes (B = -I): align the signs before the sum
    ref = max(range(len(unit)), key=lambda i: float(unit[i].diagonal().abs().sum()))
    target = sum(a if float((a * unit[ref]).sum()) >= 0 else -a for a in unit)
    if norm == "rmsnorm":
        u = polar(target)
        return u, u.T
    if norm != "layernorm":
        raise ConversionError(f"wq_identity: unknown norm {norm!r}: expected none, rmsnorm or layernorm")
    d = target.shape[0]
    ones = torch.full((d, 1), d ** -0.5, dtype=torch.float64)
    basis = torch.linalg.qr(torch.cat([ones, torch.eye(d, dtype=torch.float64)[:, : d - 1]], 1))[0]
    n = basis[:, 1:]                                                              # [d, d-1]: 1^perp
    sign = -1.0 if float(ones.T @ target @ ones) < 0 else 1.0
    u = sign * ones @ ones.T + n @ polar(n.T @ target @ n) @ n.T                  # U 1 = +-1
    return u, u.T


def _commuting_part(b: torch.Tensor) -> torch.Tensor:
    """The part of ``b`` ``[..., dh, dh]`` that commutes with every rotary rotation: per pair
    ``(2i, 2i+1)`` the 2x2 block ``a I + c J`` closest to b's (zero off the pair blocks)."""
    out = torch.zeros_like(b)
    for i in range(0, b.shape[-1], 2):
        blk = b[..., i:i + 2, i:i + 2]
        a = (blk[..., 0, 0] + blk[..., 1, 1]) / 2
        c = (blk[..., 1, 0] - blk[..., 0, 1]) / 2
        out[..., i, i], out[..., i + 1, i + 1], out[..., i + 1, i], out[..., i, i + 1] = a, a, c, -c
    return out


@dataclass(frozen=True)
class QueryFold:
    """One layer of a ``wq_identity`` conversion (``fold_query``): ``exact`` the layer in the new basis
    with its W_Q (the same function), ``free`` the layer with W_Q = I, ``norm_bias`` the new norm's
    bias ``b'`` (None: no bias, or no norm bias needed), ``off_block``/``remainder`` how much of
    ``R`` is dropped / ``polar_remainder(R)``, ``dropped_bias`` ``||beta||`` where it cannot move."""

    exact: object
    free: object
    norm_bias: torch.Tensor | None
    off_block: float
    remainder: float
    dropped_bias: float


def fold_query(layer, minv: torch.Tensor, writer: torch.Tensor, gain: torch.Tensor | None,
               bias: torch.Tensor | None, *, norm_bias: bool, rotary: bool = False) -> QueryFold:
    """``layer`` (read by a norm of ``gain``/``bias``, None: none) moved to the residual basis ``M``
    (``minv = M^-1``; ``writer``: the map of what the layer writes, ``M`` or ``(I - 1 1^T/d) M``) and
    converted to ``wq_identity`` (module docstring); ``norm_bias``: whether the new norm can carry a
    bias."""
    a = stacked_query(layer)
    h, d, dh = layer.W_Q.shape
    per = _group(layer)
    g = torch.ones(d, dtype=torch.float64) if gain is None else _d(gain)
    read = minv @ torch.diag(g)                                                   # x diag(g) W = z M^-1 diag(g) W
    r = read @ a                                                                  # [d, H dh]
    blocks = torch.stack([r[i * dh:(i + 1) * dh, i * dh:(i + 1) * dh] for i in range(h)])   # [H, dh, dh]
    if rotary:
        blocks = _commuting_part(blocks)
    bg = _group_mean(blocks, per)                                                 # [G, dh, dh]
    kept = torch.block_diag(*bg.repeat_interleave(per, 0))
    off = float(torch.linalg.matrix_norm(r - kept) / torch.linalg.matrix_norm(r))
    beta = torch.zeros(h * dh, dtype=torch.float64)
    if bias is not None:
        beta = beta + _d(bias) @ a
    if layer.b_Q is not None:
        beta = beta + _d(layer.b_Q).reshape(-1)
    nb, dropped = None, 0.0
    if norm_bias:
        binv = torch.linalg.inv(bg).repeat_interleave(per, 0)                     # [H, dh, dh]
        nb = torch.cat([beta[i * dh:(i + 1) * dh] @ binv[i] for i in range(h)])    # [d]
    else:
        dropped = float(beta.norm())

    def moved(w, b):                                                              # a reader of the norm
        w2 = read @ _d(w)                                                         # [g, d, dh]
        b2 = torch.zeros(w.shape[0], dh, dtype=torch.float64) if b is None else _d(b)
        if bias is not None:
            b2 = b2 + _d(bias) @ _d(w)
        if nb is not None:
            b2 = b2 - nb @ w2
        return w2, (None if b is None and bias is None and nb is None else b2)

    wq, bq = moved(layer.W_Q, layer.b_Q)
    wk, bk = moved(layer.W_K, layer.b_K)
    wv, bv = moved(layer.W_V, layer.b_V)
    wo = _d(layer.W_O) @ writer
    bo = None if layer.b_O is None else _d(layer.b_O) @ writer
    exact = _back(layer, W_Q=wq, b_Q=bq, W_K=wk, b_K=bk, W_V=wv, b_V=bv, W_O=wo, b_O=bo)
    bt = bg.transpose(1, 2)
    free = _back(layer, W_Q=None, b_Q=None, W_K=wk @ bt, b_K=None if bk is None else (bk[:, None, :] @ bt)[:, 0],
                 W_V=wv, b_V=bv, W_O=wo, b_O=bo)
    return QueryFold(exact, free, nb, off, polar_remainder(r), dropped)


def convert(layer, target: str, method: str | None = None, stats: InputStats | None = None, *,
            groups: int | None = None, rank: int | None = None, rotary: bool = False, grouping=None):
    """One layer converted to ``target`` (``analysis.conversion_targets.TARGETS``) by ``method``
    (None: the default); ``grouping``: ``gqa``'s groups of kv heads (None: contiguous)."""
    method = method or DEFAULT_METHOD[target]
    if method not in METHODS[target]:
        raise ConversionError(f"{target}: unknown method {method!r}: expected one of {', '.join(METHODS[target])}")
    if target == "k_eq_v":
        return k_eq_v(layer, method, stats)
    if target == "q_eq_k":
        return q_eq_k(layer, method, stats)
    if target == "q_eq_k_eq_v":
        return q_eq_k_eq_v(layer, method, stats)
    if target == "wq_identity":
        raise ConversionError("wq_identity changes the basis of the whole residual stream: "
                              "experiments.whatif.query_free converts a model, not one layer")
    if target in ("gqa", "mqa"):
        return gqa(layer, 1 if target == "mqa" else int(groups), method, stats, rotary=rotary,
                   grouping=None if target == "mqa" else grouping)
    return latent(layer, int(rank), _need(stats, "latent"))[0]
