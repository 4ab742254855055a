"""Activation-level metrics of one layer, accumulated over batches of token windows.

``ActivationAccumulator(layer, meta, logits=...)`` takes the canonical weights
of one layer (``W_Q`` or None, ``W_K``, ``W_V``: ``[heads, d_model, d_head]``,
biases ``b_Q``, ``b_K``, ``b_V`` or None) and its geometry; ``add(x)`` is
called once per batch with the attention module's input ``x: [B, T, d_model]``
(B windows of T tokens, already normalised where the model normalises). Per
window it forms, per kv head ``g`` and query head ``h`` (GQA: ``g(h) = h //
(n_heads / n_kv_heads)``),

    K = x W_K[g] + b_K[g],  V = x W_V[g] + b_V[g],  Q = x W_Q[h] + b_Q[h]

(``Q_h = x[:, h*d_head:(h+1)*d_head]`` when ``W_Q`` is None), and keeps only
float64 sufficient statistics: the token count ``n``, ``sum_t k``, ``sum_t v``,
``K^T K``, ``V^T V``, ``K^T V`` (``d_head x d_head``), and for the logits
``L_h = Q_h K_{g(h)}^T`` (``T x T``, pre-softmax, unscaled, before the causal
mask; tokens see only their own window) ``tr(L_h L_h) = sum(C_h * C_h^T)`` with
``C_h = K_g^T Q_h`` and ``||L_h||_F^2 = sum((Q_h^T Q_h) * (K_g^T K_g))``, and
the same two sums of the layer's ``L = sum_h L_h`` (formed per window). Neither
``x`` nor the caches are kept. ``result()`` computes, from the sums over all
windows:

* ``kv_cosine_act`` = ``tr(K^T V) / sqrt(tr(K^T K) tr(V^T V))`` (flat cosine of
  the caches, not centred);
* ``kv_cka_act`` = ``||Kc^T Vc||_F^2 / (||Kc^T Kc||_F ||Vc^T Vc||_F)`` with the
  tokens of all windows centred, ``Kc^T Vc = K^T V - (sum k)(sum v)^T / n``
  (linear CKA, Kornblith et al. 2019);
* ``kv_share_r2_act`` = ``||P_K V||_F^2 / ||V||_F^2 = tr(V^T K (K^T K)^{-1} K^T V)
  / tr(V^T V)``: ``1 - min_T ||V - K T||^2 / ||V||^2``, the K=V sharing fit
  (not centred). ``(K^T K)^{-1}`` by a Cholesky factorisation of the
  unit-diagonal ``D K^T K D``; a Gram that is singular to float64 (fewer
  tokens than ``d_head``, dead columns) falls back to its pseudo-inverse,
  dropping eigenvalues below ``d_head * eps64 * lambda_max``;
* ``erank_kcache``, ``erank_vcache``: effective rank (Roy & Vetterli 2007) of
  the ``[n, d_head]`` caches, ``sigma_i^2 = eig(K^T K)`` (not centred);
* ``logit_symmetry`` = ``(1 + sum_w tr(L_w L_w) / sum_w ||L_w||_F^2) / 2``
  (Saponati et al. 2025's symmetry score over the windows' logit matrices),
  per head and of the logits summed over heads (head None);
* each activation metric a plugin registered (``analysis.registry.register``):
  its ``compute(stats, d_head)`` on the same sums, keys ``n``, ``sk``, ``sv``
  (``[..., g, e]``), ``kk``, ``vv``, ``kv`` (``[..., g, e, e]``) and, where the
  logits are captured, ``lsym``, ``lsq`` (``[..., h]``), ``lsym_layer``,
  ``lsq_layer`` (``[...]``); so its chance level (rule ``random_projection``,
  or NaN for ``none``) and its interval come as the built-in metrics' do
  (the interval unclipped).

Every row also carries:

* ``chance``: the same metric of the same ``x`` projected through random
  Gaussian matrices of the head's shapes (``R_K``, ``R_V`` independent
  ``[n_kv_heads, d_model, d_head]``, ``R_Q`` ``[n_heads, d_model, d_head]``,
  no biases; seeded), median over ``n_random`` draws and over heads (per-layer
  rows: over draws). It keeps the input's anisotropy and the token count: a
  value at chance says nothing about the trained projections.
* ``n_tokens``: the tokens behind the value (all windows).
* ``ci_low``, ``ci_high``: 95% bootstrap over windows: windows resampled with
  replacement ``n_boot`` times (seeded), each metric recomputed from the
  resampled sums, the 2.5% and 97.5% percentiles shifted by the resamples'
  bias (their mean minus the value). A resample repeats windows, so it holds
  fewer distinct tokens, and the Gram-based metrics' small-sample bias
  (``kv_share_r2_act`` and ``kv_cka_act`` up, the eranks down) would otherwise
  put the plain percentile interval beside the value rather than around it.
  NaN, with a note, when there is a single window.

``kv_share_r2_act``, ``kv_cka_act``, ``erank_kcache`` and ``erank_vcache``
need more tokens than columns (at least ``8 x d_head``); with fewer the value
is stored and the notes say how it is biased.

Precision: the projections are float32 products of float32 ``x`` and weights
(float64 on a GPU that has TF32 matmuls switched on), every product and sum
after them float64; float64 projections would double the cost of ``add()`` on
a CPU for no measurable gain. Against a float64
reference (the same float32 ``x`` and weights, everything in float64, on the
concatenated caches) every value agrees to < 1e-3 relative on heads with
condition numbers up to 1e6 (tests/analysis/test_activations.py).
"""
from __future__ import annotations

import math

import pandas as pd
import torch

from analysis._linalg import as_float32, spectrum_stats, stack_heads
from analysis.errors import AnalysisError
from analysis.plugins import activation_values
from analysis.registry import BY_NAME, RESULT_COLUMNS
from analysis.weights import LayerLike, MetaLike, check_geometry, default_device

#: Tokens per column a metric needs before its sampling bias is small.
TOKENS_PER_COLUMN = 8
EPS64 = float(torch.finfo(torch.float64).eps)
#: How each metric is biased with fewer than TOKENS_PER_COLUMN x d_head tokens.
_FEW_TOKENS = {
    "kv_share_r2_act": "the value is biased toward 1 (a fit with nearly as many columns as samples)",
    "kv_cka_act": "the value is biased upward (linear CKA's small-sample floor rises as the columns "
                  "approach the samples)",
    "erank_kcache": "the value is biased low (the singular values of a nearly square sample spread out)",
    "erank_vcache": "the value is biased low (the singular values of a nearly square sample spread out)",
}
#: Where each metric lives (the shifted bootstrap interval is clipped to it; eranks: [1, d_head];
#: a plugin's metric: unbounded).
_RANGE = {"kv_cosine_act": (-1.0, 1.0), "kv_cka_act": (0.0, 1.0), "kv_share_r2_act": (0.0, 1.0),
          "logit_symmetry": (0.0, 1.0), "logit_symmetry_layer": (0.0, 1.0)}
_ERANKS = ("erank_kcache", "erank_vcache")
#: Bootstrap resamples per batch: bounds the resampled d_head x d_head stacks in memory.
_BOOT_BYTES = 2**27


class ActivationAccumulator:
    """Sufficient statistics of one layer's activation metrics over windows (module docstring)."""

    def __init__(self, layer: LayerLike, meta: MetaLike, *, logits: bool, logits_reason: str | None = None,
                 device: str | torch.device | None = None, seed: int = 0, n_random: int = 3):
        check_geometry(layer, meta)
        if n_random < 1:
            raise AnalysisError(f"layer {layer.layer}: n_random must be at least 1, found {n_random}")
        self.layer = layer.layer
        self.dev = torch.device(device or default_device())
        h, g, d, e = meta.n_heads, meta.n_kv_heads, meta.d_model, meta.d_head
        self.h, self.g, self.d, self.e = h, g, d, e
        self.rep = h // g                                  # query heads per kv head
        self.notes: dict[str, str] = {}
        identity = layer.W_Q is None
        self.logits = logits
        if not logits:
            self.notes["logit_symmetry"] = logits_reason or "pre-softmax logits were not captured"
        elif identity and h * e != d:
            self.logits = False
            self.notes["logit_symmetry"] = (f"W_Q is absent but n_heads*d_head ({h * e}) != d_model ({d}), "
                                            "so the query is not an identity slice of x")
        with torch.inference_mode():
            # the layer's projections side by side: [d_model, 2*g*e (+ h*e)], biases [2*g*e (+ h*e)]
            cols = [stack_heads(as_float32(layer.W_K, self.dev)), stack_heads(as_float32(layer.W_V, self.dev))]
            bias = [_flat_bias(getattr(layer, "b_K", None), g * e, self.dev),
                    _flat_bias(getattr(layer, "b_V", None), g * e, self.dev)]
            self.identity_q = self.logits and identity
            if self.logits and not identity:
                cols.append(stack_heads(as_float32(layer.W_Q, self.dev)))
                bias.append(_flat_bias(getattr(layer, "b_Q", None), h * e, self.dev))
            self.b_q_identity = (_flat_bias(getattr(layer, "b_Q", None), h * e, self.dev)
                                 if self.identity_q else None)
            self.w = torch.cat(cols, 1)                     # [d, 2ge (+ he)]
            self.b = torch.cat(bias)
            # random projections of the same shapes, N(0, 1/d_model); drawn on the CPU so that a
            # seed gives the same matrices on every device
            gen = torch.Generator().manual_seed(seed)
            width = 2 * g * e + (h * e if self.logits else 0)
            self.r = [(torch.randn(d, width, generator=gen) / math.sqrt(d)).to(self.dev)
                      for _ in range(n_random)]             # n_random x [d, width]
        self._windows: list[dict[str, torch.Tensor]] = []  # per add(): per-window sums [B, ...]
        self._chance: list[dict[str, torch.Tensor] | None] = [None] * n_random   # totals per draw
        self._n = 0

    @property
    def n_tokens(self) -> int:
        """Tokens added so far (all windows)."""
        return self._n

    def add(self, x: torch.Tensor) -> None:
        """Accumulate the statistics of ``x: [B, T, d_model]`` (B windows of T tokens)."""
        if x.dim() != 3 or x.shape[-1] != self.d or x.shape[1] == 0:
            raise AnalysisError(f"layer {self.layer}: expected the attention input as [windows, tokens, "
                                f"d_model={self.d}], found {list(x.shape)}")
        g, h, e = self.g, self.h, self.e
        with torch.inference_mode():
            x = as_float32(x, self.dev)
            B, T, d = x.shape
            xf = x.reshape(B * T, d)                                     # [B*T, d]
            p = _project(xf, self.w, self.b).view(B, T, -1)              # [B, T, 2ge (+ he)]
            k, v = p[..., :g * e], p[..., g * e:2 * g * e]
            q = None
            if self.identity_q:
                q = x[..., :h * e] + self.b_q_identity                   # identity slices, [B, T, he]
            elif self.logits:
                q = p[..., 2 * g * e:]
            self._windows.append(self._stats(k, v, q))
            del p, k, v, q
            for i, r in enumerate(self.r):
                pr = _project(xf, r, None).view(B, T, -1)                # [B, T, 2ge (+ he)]
                q = pr[..., 2 * g * e:] if self.logits else None
                st = {key: val.sum(0) for key, val in
                      self._stats(pr[..., :g * e], pr[..., g * e:2 * g * e], q).items()}
                prev = self._chance[i]
                self._chance[i] = st if prev is None else {key: prev[key] + st[key] for key in st}
                del pr
        self._n += B * T

    def _stats(self, k: torch.Tensor, v: torch.Tensor, q: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """Per-window float64 sums of ``k, v: [B, T, g*e]``, ``q: [B, T, h*e]`` (or None)."""
        B, T, _ = k.shape
        g, e, rep = self.g, self.e, self.rep
        # tokens last and contiguous: every product below is A B^T of two [.., e, T] stacks
        k64 = _tokens_last(k.view(B, T, g, e))                          # [B, g, e, T]
        v64 = _tokens_last(v.view(B, T, g, e))
        kk = k64 @ k64.mT                                                # K^T K: [B, g, e, e]
        st = {"n": torch.full((B,), float(T), dtype=torch.float64, device=k.device),
              "sk": k64.sum(-1), "sv": v64.sum(-1),                      # [B, g, e]
              "kk": kk, "vv": v64 @ v64.mT, "kv": k64 @ v64.mT}
        if q is not None:
            q64 = _tokens_last(q.view(B, T, g, rep * e))                # [B, g, rep*e, T]
            ct = (q64 @ k64.mT).view(B, g, rep, e, e)                    # C_h^T = Q_h^T K_g
            qh = q64.view(B, g, rep, e, T)
            gq = qh @ qh.mT                                              # Q_h^T Q_h: [B, g, rep, e, e]
            st["lsym"] = (ct * ct.mT).sum((-2, -1)).reshape(B, g * rep)  # tr(L_h L_h), [B, h]
            st["lsq"] = (gq * kk[:, :, None]).sum((-2, -1)).reshape(B, g * rep)   # ||L_h||_F^2
            # the layer's L = Qs Ks^T with Qs the query heads summed per kv head: [T, T] per window
            qs = q.view(B, T, g, rep, e).sum(3).reshape(B, T, g * e)    # [B, T, ge], float32
            lay_sym, lay_sq = [], []
            for b in range(B):                                           # one [T, T] matrix at a time
                lw = (qs[b] @ k[b].mT).double()                          # [T, T]
                lay_sym.append((lw * lw.mT).sum())
                lay_sq.append(lw.square().sum())
            st["lsym_layer"] = torch.stack(lay_sym)                      # [B]
            st["lsq_layer"] = torch.stack(lay_sq)
        return st

    def result(self, *, n_boot: int = 200, seed: int = 0) -> tuple[pd.DataFrame, dict[str, str]]:
        """Rows (``analysis.registry.RESULT_COLUMNS``) of every activation metric, and notes."""
        if not self._windows:
            raise AnalysisError(f"layer {self.layer}: no tokens were added (call add() first)")
        notes = dict(self.notes)
        with torch.inference_mode():
            per_win = {key: torch.cat([w[key] for w in self._windows]) for key in self._windows[0]}
            n_win = int(per_win["n"].shape[0])
            values = _metrics({key: val.sum(0) for key, val in per_win.items()}, self.e)
            draws = [_metrics(c, self.e) for c in self._chance]
            chance = {m: float(torch.stack([dr[m] for dr in draws]).flatten().nanquantile(0.5))
                      if _row_metric(m).chance != "none" else math.nan
                      for m in values}                       # median (the mean of the middle two)
            if n_win > 1:
                lo, hi = self._bootstrap(per_win, values, n_boot, seed)
            else:
                lo = hi = {m: torch.full_like(val, float("nan")) for m, val in values.items()}
        n = self._n
        if n < TOKENS_PER_COLUMN * self.e:
            for m, why in _FEW_TOKENS.items():
                _add_note(notes, m, f"{n} tokens < {TOKENS_PER_COLUMN} x d_head = {TOKENS_PER_COLUMN * self.e}: "
                                    f"{why}; read it against its chance level")
        if n_win == 1:
            # one note per registered metric (the per-layer logit row is logit_symmetry's)
            for m in dict.fromkeys("logit_symmetry" if m == "logit_symmetry_layer" else m for m in values):
                _add_note(notes, m, "one window: no bootstrap interval over windows (ci_low, ci_high empty)")
        rows = []
        for m, val in values.items():
            row = _row_metric(m)
            lab = "KV" if row.axis == "kv_head" else "H"
            heads = [None] if m == "logit_symmetry_layer" or row.axis == "layer" else range(val.numel())
            metric = row.name
            flat, flo, fhi = val.reshape(-1).tolist(), lo[m].reshape(-1).tolist(), hi[m].reshape(-1).tolist()
            for i, hd in enumerate(heads):
                label = f"L{self.layer}" if hd is None else f"L{self.layer}{lab}{hd}"
                rows.append((self.layer, hd, label, metric, flat[i], chance[m], n, flo[i], fhi[i]))
        df = pd.DataFrame(rows, columns=RESULT_COLUMNS)
        df["head"] = df["head"].astype("Int64")
        df["n_tokens"] = df["n_tokens"].astype("Int64")
        return df, notes

    def _bootstrap(self, per_win: dict[str, torch.Tensor], values: dict[str, torch.Tensor], n_boot: int,
                   seed: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """2.5% and 97.5% percentiles of every metric over ``n_boot`` resamples of the windows,
        shifted by the resamples' bias (their mean minus ``values``)."""
        n_win = int(per_win["n"].shape[0])
        gen = torch.Generator().manual_seed(seed)
        idx = torch.randint(0, n_win, (n_boot, n_win), generator=gen)            # windows drawn
        counts = torch.zeros(n_boot, n_win, dtype=torch.float64).scatter_add_(
            1, idx, torch.ones(n_boot, n_win, dtype=torch.float64)).to(self.dev)  # [n_boot, n_win]
        width = sum(val[0].numel() for val in per_win.values())                  # float64s per window
        chunk = max(1, _BOOT_BYTES // (8 * width * 4))                           # sums + work space
        reps: dict[str, list[torch.Tensor]] = {}
        for s in range(0, n_boot, chunk):
            c = counts[s:s + chunk]                                              # [b, n_win]
            sums = {key: (c @ val.reshape(n_win, -1)).view(c.shape[0], *val.shape[1:])
                    for key, val in per_win.items()}                             # resampled sums [b, ...]
            for m, val in _metrics(sums, self.e).items():
                reps.setdefault(m, []).append(val)
        lo, hi = {}, {}
        for m, parts in reps.items():
            r = torch.cat(parts)                                                 # [n_boot, ...]
            qs = torch.nanquantile(r, torch.tensor([0.025, 0.975], dtype=r.dtype, device=r.device), dim=0)
            # a resample repeats windows, so it has fewer distinct tokens and the Gram-based metrics'
            # small-sample bias grows: recentre the percentile interval by that bias (mean - value)
            shift = r.nanmean(0) - values[m]
            low, high = _RANGE.get(m) or ((1.0, float(self.e)) if m in _ERANKS else (-math.inf, math.inf))
            lo[m], hi[m] = (qs[0] - shift).clamp(low, high), (qs[1] - shift).clamp(low, high)
        return lo, hi


def _row_metric(m: str):
    """The registry row of a value of ``_metrics`` (the layer's logit symmetry is ``logit_symmetry``'s)."""
    return BY_NAME["logit_symmetry" if m == "logit_symmetry_layer" else m]


def _tokens_last(t: torch.Tensor) -> torch.Tensor:
    """``[B, T, a, b] -> [B, a, b, T]`` float64, contiguous, in one copy."""
    B, T, a, b = t.shape
    return torch.empty(B, a, b, T, dtype=torch.float64, device=t.device).copy_(t.permute(0, 2, 3, 1))


def _project(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``x w + b`` in float32; in float64 where CUDA matmuls may use TF32 (10 mantissa bits)."""
    if x.is_cuda and torch.backends.cuda.matmul.allow_tf32:
        out = x.double() @ w.double() + (0 if b is None else b.double())
        return out.float()
    return x @ w if b is None else torch.addmm(b, x, w)


def _flat_bias(b: torch.Tensor | None, width: int, dev: torch.device) -> torch.Tensor:
    """A head-major bias ``[heads, d_head] -> [heads*d_head]``, zeros when absent."""
    if b is None:
        return torch.zeros(width, dtype=torch.float32, device=dev)
    return as_float32(b, dev).reshape(width)


def _add_note(notes: dict[str, str], metric: str, msg: str) -> None:
    notes[metric] = f"{notes[metric]}; {msg}" if metric in notes else msg


def _metrics(st: dict[str, torch.Tensor], d_head: int) -> dict[str, torch.Tensor]:
    """Every metric from summed statistics with any leading batch dims ``[..., g, ...]``
    (module docstring); float64 ``[..., g]``, ``[..., h]`` and ``[...]`` (the layer's logits)."""
    kk, vv, kv, n = st["kk"], st["vv"], st["kv"], st["n"]
    tr = lambda a: torch.diagonal(a, dim1=-2, dim2=-1).sum(-1)           # noqa: E731
    out = {"kv_cosine_act": tr(kv) / (tr(kk) * tr(vv)).sqrt()}
    nn = n[..., None, None, None]                                        # [..., 1, 1, 1]
    sk, sv = st["sk"], st["sv"]
    kkc = kk - sk[..., :, None] * sk[..., None, :] / nn                  # centred Grams [..., g, e, e]
    vvc = vv - sv[..., :, None] * sv[..., None, :] / nn
    kvc = kv - sk[..., :, None] * sv[..., None, :] / nn
    fro = lambda a: a.square().sum((-2, -1))                             # noqa: E731
    out["kv_cka_act"] = fro(kvc) / (fro(kkc) * fro(vvc)).sqrt()
    out["kv_share_r2_act"] = _share_r2(kk, vv, kv, d_head)
    for name, gram in (("erank_kcache", kk), ("erank_vcache", vv)):
        out[name] = spectrum_stats(_gram_sv(gram))["erank"]
    if "lsym" in st:
        out["logit_symmetry"] = (1 + st["lsym"] / st["lsq"]) / 2
        out["logit_symmetry_layer"] = (1 + st["lsym_layer"] / st["lsq_layer"]) / 2
    out.update(activation_values(st, d_head))                            # registered plugins' metrics
    return out


def _gram_sv(gram: torch.Tensor) -> torch.Tensor:
    """Singular values (descending) of the matrix behind a float64 Gram ``[..., e, e]``;
    eigenvalues below ``e * eps64 * lambda_max`` (round-off) are 0."""
    lam = torch.linalg.eigvalsh((gram + gram.mT) / 2).flip(-1)           # [..., e], descending
    tol = gram.shape[-1] * EPS64 * lam[..., :1].clamp_min(0)
    return torch.where(lam > tol, lam, torch.zeros_like(lam)).sqrt()


def _share_r2(kk: torch.Tensor, vv: torch.Tensor, kv: torch.Tensor, d_head: int) -> torch.Tensor:
    """``tr(KV^T KK^{-1} KV) / tr(VV)`` per stack entry, float64 (module docstring)."""
    dg = torch.diagonal(kk, dim1=-2, dim2=-1)
    s = torch.where(dg > 0, dg.clamp_min(torch.finfo(torch.float64).tiny).rsqrt(), torch.zeros_like(dg))
    a = kk * s[..., :, None] * s[..., None, :]                           # D KK D, unit diagonal
    low, info = torch.linalg.cholesky_ex(a)
    piv = torch.diagonal(low, dim1=-2, dim2=-1)
    ok = (info == 0) & (piv.square().amin(-1) > d_head * EPS64) & torch.isfinite(piv).all(-1)
    y = torch.linalg.solve_triangular(torch.where(ok[..., None, None], low, torch.eye(
        kk.shape[-1], dtype=kk.dtype, device=kk.device)), kv * s[..., :, None], upper=False)
    explained = y.square().sum((-2, -1))                                 # ||L^-1 D K^T V||_F^2
    if not bool(ok.all()):                                               # singular: pseudo-inverse
        bad = ~ok
        lam, u = torch.linalg.eigh((kk[bad] + kk[bad].mT) / 2)           # ascending
        keep = lam > d_head * EPS64 * lam[..., -1:].clamp_min(0)
        inv = torch.where(keep, 1 / torch.where(keep, lam, torch.ones_like(lam)), torch.zeros_like(lam))
        explained[bad] = ((u.mT @ kv[bad]).square().sum(-1) * inv).sum(-1)
    return (explained / torch.diagonal(vv, dim1=-2, dim2=-1).sum(-1)).clamp(max=1.0)
