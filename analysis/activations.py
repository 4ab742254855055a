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
the same two sums of the layer's ``L = sum_h L_h = Qs K^T`` (``Qs``: the query
heads summed per kv head). Neither ``x`` nor the caches are kept.

How the sums are formed (the same sums either way, float64 round-off apart):

* windows at least as long as ``d_model`` (``T >= d``): ``add()`` keeps only each
  window's float64 Gram ``G_w = sum_t x_t x_t^T`` (``d x d``, no bigger than the
  window) and ``s_w = sum_t x_t``; every statistic above is a quadratic form of
  them, ``(X A + 1 a^T)^T (X B + 1 b^T) = A^T G_w B + (A^T s_w) b^T + a (s_w^T B)
  + T a b^T`` (``tr(L L) = sum(C * C^T)`` with ``C = K^T Qs``, ``||L||_F^2 =
  sum((K^T K) * (Qs^T Qs))`` over all kv heads), evaluated for batches of windows
  (at ``result()``, or once the held Grams pass ``_PENDING_BYTES``);
* shorter windows: ``x`` is projected (the real projections in one float32
  product, each draw's K and Q in another) and the sums formed from the
  projections, the layer's ``[T, T]`` logits as one batched product.

``result()`` computes, from the sums over all windows:

* ``kv_cosine_act`` = ``tr(K^T V) / sqrt(tr(K^T K) tr(V^T V))`` (flat cosine of
  the caches, not centred);
* ``kv_cka_act`` = linear CKA (Kornblith et al. 2019) of the caches with the
  tokens of all windows centred, ``Kc^T Vc = K^T V - (sum k)(sum v)^T / n``,
  each squared norm debiased (``_debiased_cka``): ``(||Kc^T Vc||_F^2 - tr(Kc^T Kc)
  tr(Vc^T Vc) / (n-1)) / sqrt((||Kc^T Kc||_F^2 - tr(Kc^T Kc)^2 / (n-1)) (...V...))``;
  the plain ratio is biased up by about ``tr tr / (n ||.||^2)`` (0.005 at d_head
  128 and 4,096 tokens, against an interval half as wide);
* ``kv_share_r2_act`` = the adjusted R^2 ``1 - (1 - R^2) n / (n - d_head)`` of
  ``R^2 = ||P_K V||_F^2 / ||V||_F^2 = tr(V^T K (K^T K)^{-1} K^T V) / tr(V^T V)``
  (``1 - min_T ||V - K T||^2 / ||V||^2``, the K=V sharing fit, not centred): the
  fit spends a degree of freedom per column of K, so the plain ``R^2`` of a V
  unrelated to K reads ``d_head / n``. ``(K^T K)^{-1}`` by a Cholesky factorisation ``K^T K = L L^T``
  (a pivot is judged on the unit-diagonal ``D K^T K D``, whose factor is ``D L``:
  ``L_ii^2 / (K^T K)_ii``); a Gram that is singular to float64 (fewer
  tokens than ``d_head``, dead columns) falls back to its pseudo-inverse,
  dropping eigenvalues below ``d_head * eps64 * lambda_max``;
* ``erank_kcache``, ``erank_vcache``: effective rank (Roy & Vetterli 2007) of
  the ``[n, d_head]`` caches, ``sigma_i^2 = eig(K^T K)`` (not centred), bias-
  corrected by the delete-one-window jackknife ``N theta - (N-1) mean_i theta_(i)``
  (``analysis.intervals.jackknife``): a sample's singular values spread out, so the
  plain erank reads low by about ``c / n`` (0.5 of 115 at d_head 128 and 4,096
  tokens), a bias with no closed form that the jackknife removes (with one
  window, or fewer than ``8 x d_head`` tokens, the plain value);
* ``logit_symmetry`` = ``(1 + sum_w tr(L_w L_w) / sum_w ||L_w||_F^2) / 2``
  (Saponati et al. 2025's symmetry score over the windows' logit matrices),
  per head and of the logits summed over heads (head None);
* ``kv_cka_layer_act``, ``erank_kcache_layer``, ``erank_vcache_layer``: the same of the whole
  layer's caches, all ``n_kv_heads * d_head`` columns side by side (``analysis.layer_caches``: the
  projection-sharing paper's definition), from the float64 totals of the input's Gram and sum;
  their interval is a delete-one-group jackknife-t over ``layer_groups(d_model)`` groups of windows
  (window ``w`` in group ``w % groups``), whose float32 Grams of the input the accumulator holds
  beside its other sums (``4 groups d_model^2`` bytes: 32 MiB per layer at d_model 1024 and 2048),
  the eranks bias-corrected by it, their chance draws by the halves as below;
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
  value at chance says nothing about the trained projections. A draw needs only
  totals over windows, and its K and V sums are exact functions of the input's
  Gram ``G = sum_t x_t x_t^T`` (float64) and ``s = sum_t x_t``: ``K_r^T K_r = R_K^T
  G R_K``, ``V_r^T V_r = R_V^T G R_V``, ``K_r^T V_r = R_K^T G R_V``, ``sum k_r = R_K^T
  s``; its logit sums are per window (above). So the draws are held through the
  forward only when the logits are captured; otherwise ``result()`` draws them
  again from the seed (the same matrices), which spares three matrices the size
  of the layer's K and V for every layer during the forward (the 134M Llama of
  ``bench/forward_speed.py``: the job's peak 2,272-2,315 -> 1,871-1,949 MiB).
* ``n_tokens``: the tokens behind the value (all windows).
* ``ci_low``, ``ci_high``: 95% interval over the ``N`` windows (the independent
  units: tokens of one window are not independent of each other): ``value -+
  t_{N-1, 0.975} se`` with ``se`` the delete-one-window jackknife's standard error
  (each metric recomputed from the sums less one window), clipped to the
  metric's range. Few windows are few clusters: a percentile bootstrap over 8
  windows covers 0.75-0.9, and with the uncorrected estimators 0.000 at d_head 128;
  the t quantile with ``N - 1`` degrees of freedom and the bias corrections
  above cover >= 0.9 at d_head 16-256 on synthetic inputs with known values
  (``bench/interval_coverage.py``, docs/statistics.md). NaN, with a note, when
  there is a single window.

The chance draws get the same corrections: the adjusted R^2 and debiased CKA are
functions of the totals, and their eranks are extrapolated in ``1/n`` from the
even and the odd windows (``_chance_metrics``), so a random layer's corrected
value meets a band of corrected values.

``kv_share_r2_act``, ``kv_cka_act``, ``erank_kcache`` and ``erank_vcache``
need more tokens than columns (at least ``8 x d_head``); with fewer the value
is stored and the notes say how it is biased.

Precision: on the Gram path everything after the float32 ``x`` and weights is
float64. On the projection path the projections are float32 products of float32
``x`` and weights (float64 on a GPU that has TF32 matmuls switched on), the
layer's ``[T, T]`` logits a float32 product of them, every product and sum after
them float64; float64 projections would double the cost of ``add()`` on a CPU
for no measurable gain. A chance draw's logit sums there (they only set a chance
level, of a Gaussian projection) take their products over a window's tokens in
float32 too and sum them in float64: errors of a few 1e-6 of ``||L||_F^2`` (the
symmetry score within 1.5e-6 of float64 on 512-token windows whose mean is 10x
their spread, tests/analysis/test_activations_paths.py), where float64 products
cost a fifth of ``add()`` (one nanoGPT-shaped layer, 16 windows of 256 tokens:
118 -> 95 ms). Against a float64
reference (the same float32 ``x`` and weights, everything in float64, on the
concatenated caches) every value agrees to < 1e-3 relative on heads with
condition numbers up to 1e6 (tests/analysis/test_activations.py); the Gram
path's sums equal float64 projections to 1e-10, and both paths give the same
rows (tests/analysis/test_activations_paths.py).
"""
from __future__ import annotations

import math

import pandas as pd
import torch

from analysis.above_chance import NULL_BAND, p_value
from analysis._linalg import as_float32, gram_sv, small_eigh, small_eigvalsh, spectrum_stats, stack_heads
from analysis.errors import AnalysisError
from analysis.intervals import jackknife, t_quantile
from analysis.layer_caches import LAYER_METRICS, layer_metrics
from analysis.layer_caches import RANGES as LAYER_RANGES
from analysis.plugins import activation_values
from analysis.registry import BY_NAME, PAIR_COLUMNS, RESULT_COLUMNS
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
#: Metrics fixed by an input of no more directions than a head has columns (``analysis.degenerate``).
_FEW_DIRECTIONS = ("kv_cka_act", "kv_cosine_act", "kv_share_r2_act", "erank_kcache", "erank_vcache")
#: Where each metric lives (the jackknife-t interval is clipped to it; eranks: [1, d_head];
#: a plugin's metric: unbounded).
_RANGE = {"kv_cosine_act": (-1.0, 1.0), "kv_cka_act": (0.0, 1.0), "kv_share_r2_act": (0.0, 1.0),
          "logit_symmetry": (0.0, 1.0), "logit_symmetry_layer": (0.0, 1.0)}
_ERANKS = ("erank_kcache", "erank_vcache")
#: Float32 Grams of the input per group of windows that an accumulator may hold for the whole
#: layer's metrics (bytes): ``layer_groups``.
_LAYER_GROUP_BYTES = 2**25
#: The most groups of windows (the whole layer's jackknife units).
LAYER_GROUPS = 8


def layer_groups(d_model: int) -> int:
    """How many groups of windows an accumulator keeps the input's Gram of, for the whole layer's
    delete-one-group jackknife: as many as ``_LAYER_GROUP_BYTES`` holds (float32 ``d_model^2``
    each), a power of two from 2 to ``LAYER_GROUPS`` (d_model 1024: 8, 32 MiB; 2048: 2, 32 MiB;
    4096: 2, 128 MiB)."""
    fits = _LAYER_GROUP_BYTES // (4 * d_model * d_model)
    groups = 2
    while groups * 2 <= min(fits, LAYER_GROUPS):
        groups *= 2
    return groups


#: Jackknife batches: bounds the leave-one-window d_head x d_head stacks in memory.
_BOOT_BYTES = 2**27
#: Per-window Grams held before they are reduced to the metrics' statistics (bytes).
_PENDING_BYTES = 2**26
#: Float64 work space of one reduction or projection chunk (bytes).
_CHUNK_BYTES = 2**26


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
            self.n_random, self._seed = n_random, seed
            self._width = 2 * g * e + (h * e if self.logits else 0)
            # add() projects x through the draws when the logits are captured; otherwise only
            # result() needs them, and they are drawn again there rather than held through the
            # forward (three matrices the size of the layer's K and V, for every layer at once)
            self._r = self._draw() if self.logits else None
            self.has_bias = bool(self.b.any())
        self._windows: list[dict[str, torch.Tensor]] = []  # per-window sums [B, ...]
        self._pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []   # (G_w, s_w, n_w)
        self._pending_bytes = 0
        self._gram = torch.zeros(d, d, dtype=torch.float64, device=self.dev)      # sum_t x_t x_t^T
        # the same over the even windows, and sum_t x_t and the token count over the even and the
        # odd windows (two halves of the sample: the chance draws' eranks are bias-corrected from
        # them; float32 for the half Gram, which only sets a chance level: half the memory)
        self._gram_even = torch.zeros(d, d, dtype=torch.float32, device=self.dev)
        self._sums = torch.zeros(2, d, dtype=torch.float64, device=self.dev)
        self._counts = [0, 0]
        self._n_win = 0
        self._chance_logits: list[dict[str, torch.Tensor] | None] = [None] * n_random   # totals per draw
        self._n = 0
        # the whole layer's metrics (analysis.layer_caches): the input's Gram, sum and token count per
        # group of windows (window w in group w % groups; groups even, so a group's windows are all
        # even or all odd), the delete-one-group jackknife's units; float32 Grams (the value itself
        # reads the float64 total)
        self.groups = layer_groups(d)
        self._lgram = torch.zeros(self.groups, d, d, dtype=torch.float32, device=self.dev)
        self._lsums = torch.zeros(self.groups, d, dtype=torch.float64, device=self.dev)
        self._lcounts = torch.zeros(self.groups, dtype=torch.float64, device=self.dev)

    @property
    def r(self) -> list[torch.Tensor]:
        """The chance draws: ``n_random x [d_model, 2ge (+ he)]``, K, V (and Q) head-major."""
        return self._r if self._r is not None else self._draw()

    def _draw(self) -> list[torch.Tensor]:
        """Random projections of the layer's shapes, N(0, 1/d_model), from the seed; drawn on the
        CPU so that a seed gives the same matrices on every device."""
        return list(self._seeded())

    def _seeded(self):
        """The draws from the seed, one at a time, in order (``_draw``)."""
        gen = torch.Generator().manual_seed(self._seed)
        for _ in range(self.n_random):
            yield (torch.randn(self.d, self._width, generator=gen) / math.sqrt(self.d)).to(self.dev)

    @property
    def n_tokens(self) -> int:
        """Tokens added so far (all windows)."""
        return self._n

    def add(self, x: torch.Tensor) -> None:
        """Accumulate the statistics of ``x: [B, T, d_model]`` (B windows of T tokens)."""
        if x.dim() != 3 or x.shape[-1] != self.d or x.shape[1] == 0:
            raise AnalysisError(f"layer {self.layer}: expected the attention input as [windows, tokens, "
                                f"d_model={self.d}], found {list(x.shape)}")
        with torch.inference_mode():
            x = as_float32(x, self.dev)
            B, T, d = x.shape
            x64 = x.double()                                             # [B, T, d]
            if _gram_path(d, T):
                # Gram path: each window's x^T x is no bigger than the window itself; every
                # statistic is a quadratic form of it, reduced later in batches of windows
                gw = x64.mT @ x64                                        # [B, d, d]
                sw = x64.sum(1)                                          # [B, d]
                half = (torch.arange(B, device=self.dev) + self._n_win) % 2   # each window's half
                group = (torch.arange(B, device=self.dev) + self._n_win) % self.groups
                self._lgram.index_add_(0, group, gw.float())
                self._lsums.index_add_(0, group, sw)
                self._lcounts.index_add_(0, group, torch.full((B,), float(T), dtype=torch.float64,
                                                              device=self.dev))
                self._gram += gw.sum(0)
                self._gram_even += gw[half == 0].sum(0).float()
                self._sums.index_add_(0, half, sw)
                self._pending.append((gw, sw, torch.full((B,), float(T), dtype=torch.float64, device=self.dev)))
                self._pending_bytes += gw.numel() * 8
                if self._pending_bytes > _PENDING_BYTES:
                    self._reduce()
            else:
                self._reduce()                                           # keep the windows in order
                for p in (0, 1):                                         # even, odd windows
                    # the half's groups (groups is even: group j holds windows of parity j % 2)
                    gp = torch.zeros(d, d, dtype=torch.float64, device=self.dev)
                    for j in range(p, self.groups, 2):
                        xf = x64[(j - self._n_win) % self.groups::self.groups].reshape(-1, d)
                        gj = xf.mT @ xf
                        gp += gj
                        self._lgram[j] += gj.float()
                        self._lsums[j] += xf.sum(0)
                        self._lcounts[j] += xf.shape[0]
                    self._gram += gp
                    if p == 0:
                        self._gram_even += gp.float()
                    self._sums[p] += x64[(p + self._n_win) % 2::2].reshape(-1, d).sum(0)
                self._add_projected(x)
        for p in (0, 1):
            self._counts[p] += len(range((p + self._n_win) % 2, B, 2)) * T
        self._n += B * T
        self._n_win += B

    def _add_projected(self, x: torch.Tensor) -> None:
        """Projection path (windows shorter than d_model): float64 statistics of the float32
        projections of ``x: [B, T, d]``, the real ones per window, each draw's K and Q summed."""
        g, h, e = self.g, self.h, self.e
        B, T, d = x.shape
        xf = x.reshape(B * T, d)
        p = _project(xf, self.w, self.b if self.has_bias else None).view(B, T, -1)   # [B, T, 2ge (+ he)]
        if self.identity_q:
            p = torch.cat([p, x[..., :h * e] + self.b_q_identity], -1)  # [B, T, 2ge + he]
        self._windows.append(self._proj_stats(p, with_v=True, with_q=self.logits))
        for i, r in enumerate(self.r if self.logits else []):           # one product per draw
            # its K and Q, [d, ge + he] (its K and V totals come from the input's Gram)
            kq = _project(xf, torch.cat([r[:, :g * e], r[:, 2 * g * e:]], 1), None).view(B, T, -1)
            # a draw's logit sums only set a chance level: float32 products, float64 sums (module docstring)
            st = self._proj_stats(kq, with_v=False, with_q=True, draw=True)
            self._add_chance_logits(i, {k: st[k].sum(0) for k in _LOGIT_KEYS})   # over windows

    def _proj_stats(self, p: torch.Tensor, *, with_v: bool, with_q: bool,
                    draw: bool = False) -> dict[str, torch.Tensor]:
        """Per-window sums of projected ``p: [..., T, c]``, heads of d_head in the order K (g),
        V (g, ``with_v``), Q (h, ``with_q``); leading dims kept. The products over tokens in
        float64; for a chance ``draw`` only the logit sums, its products in float32 (every sum of
        them float64)."""
        *lead, T, c = p.shape
        g, e, rep = self.g, self.e, self.rep
        f64, dtype = torch.float64, torch.float32 if draw else torch.float64
        heads = lambda lo, m: _tokens_last(p[..., lo * e:(lo + m) * e].unflatten(-1, (m, e)), dtype)   # noqa: E731
        kt = heads(0, g)                                                 # [..., g, e, T] dtype, contiguous
        kk = kt @ kt.mT                                                  # K^T K: [..., g, e, e]
        st = {} if draw else {"n": torch.full(lead, float(T), dtype=f64, device=p.device), "sk": kt.sum(-1),
                              "kk": kk}
        if with_v:
            vt = heads(g, g)
            st.update(sv=vt.sum(-1), vv=vt @ vt.mT, kv=kt @ vt.mT)
        if with_q:
            qt = heads(c // e - self.h, self.h)                          # [..., h, e, T]
            # a kv head's query heads side by side: [..., g, rep*e, T] @ [..., g, T, e]
            ct = (qt.flatten(-3, -2).unflatten(-2, (g, rep * e)) @ kt.mT).unflatten(-2, (rep, e))
            gq = (qt @ qt.mT).unflatten(-3, (g, rep))                    # Q_h^T Q_h: [..., g, rep, e, e]
            st["lsym"] = (ct * ct.mT).sum((-2, -1), dtype=f64).flatten(-2)   # tr(L_h L_h), C_h^T = Q_h^T K_g: [..., h]
            st["lsq"] = (gq * kk[..., None, :, :]).sum((-2, -1), dtype=f64).flatten(-2)   # ||L_h||_F^2
            # the layer's L = Qs Ks^T (Qs: the query heads summed per kv head), [T, T] per window
            q = p[..., c - self.h * e:]                                  # [..., T, he]
            if rep > 1:
                q = q.unflatten(-1, (g, rep, e)).sum(-2).flatten(-2)     # [..., T, ge]
            st["lsym_layer"], st["lsq_layer"] = _layer_logit_sums(q, p[..., :g * e], dtype)
        return st

    def _reduce(self) -> None:
        """Gram path: the statistics of the held windows from their Grams, in batches of windows."""
        if not self._pending:
            return
        gw = torch.cat([p[0] for p in self._pending])                   # [N, d, d]
        sw = torch.cat([p[1] for p in self._pending])                   # [N, d]
        nw = torch.cat([p[2] for p in self._pending])                   # [N]
        self._pending, self._pending_bytes = [], 0
        # the draws are projected here only with the logits (else result() takes them from the Gram)
        d, width = self.d, self.w.shape[1] * (1 + (self.n_random if self.logits else 0))
        step = max(1, _CHUNK_BYTES // (8 * d * (d + 2 * width)))        # the Grams and W^T G of a batch
        real = self._real64()
        draws = self._draws64() if self.logits else None
        for lo in range(0, gw.shape[0], step):
            part = gw[lo:lo + step], sw[lo:lo + step], nw[lo:lo + step]
            st = _gram_stats(*part, real, self.rep, with_q=self.logits)
            self._windows.append({k: v if k == "n" else v[0] for k, v in st.items()})
            if self.logits:                                              # the draws: leading [n_random]
                st = _gram_stats(*part, draws, self.rep, with_q=True, with_v=False)
                for i in range(self.n_random):
                    self._add_chance_logits(i, {k: st[k][i].sum(0) for k in _LOGIT_KEYS})   # over windows

    def _real64(self) -> dict:
        """The layer's projections in float64, per head (``_heads``), formed when used: held for
        every layer they would double the accumulators' memory."""
        return _heads(self.w.double()[None], self.b.double(), self.g, self.h, self.e,
                      identity_q=self.identity_q, b_q=self.b_q_identity)

    def _draws64(self) -> dict:
        """The chance draws in float64, per head (``_heads``; leading ``[n_random]``), formed when used."""
        return _heads(torch.stack(self.r).double(), None, self.g, self.h, self.e, identity_q=False)

    def _add_chance_logits(self, i: int, st: dict[str, torch.Tensor]) -> None:
        """Add draw ``i``'s logit sums over windows."""
        prev = self._chance_logits[i]
        self._chance_logits[i] = st if prev is None else {k: prev[k] + st[k] for k in st}

    def _chance_stats(self) -> list[tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]]:
        """The totals of every draw: K and V sums from the input's Gram (``R^T G R``), the logit
        sums accumulated per window (the held windows reduced first); beside them the draw's K and
        V Grams (``kk``, ``vv``) over each half of the windows (none with one window)."""
        self._reduce()
        n = torch.tensor([float(self._n), float(self._counts[0])], dtype=torch.float64, device=self.dev)
        grams = torch.stack([self._gram, self._gram_even.double()])     # all, even: [2, d, d]
        sums = torch.stack([self._sums.sum(0), self._sums[0]])
        kv = 2 * self.g * self.e
        draws = []
        # one draw at a time (drawn again from the seed where not held): its K and V columns in
        # float64 and their products with the Grams, 1/n_random of all the draws' at once
        for i, r in enumerate(self._r if self._r is not None else self._seeded()):
            heads = _heads(r[:, :kv].double()[None], None, self.g, self.h, self.e, identity_q=False)
            tot = _gram_stats(grams, sums, n, heads, self.rep, with_q=False)   # [1, 2, ...]
            st = {k: v[0, 0] for k, v in tot.items() if k != "n"}
            st["n"] = n[0]
            if self.logits:
                st.update(self._chance_logits[i])
            even = {k: tot[k][0, 1] for k in ("kk", "vv")}
            halves = [even, {k: st[k] - even[k] for k in even}] if min(self._counts) else []   # odd = all - even
            draws.append((st, halves))
        return draws

    def _chance_metrics(self, st: dict[str, torch.Tensor], halves: list[dict[str, torch.Tensor]],
                        correct: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """A draw's metrics from its totals, the eranks in ``correct`` bias-corrected as the value's
        are: from the two halves of the windows (``n_a``, ``n_b`` tokens) by Richardson
        extrapolation in 1/n, ``theta - (theta_h - theta) / (h n - 1)`` with ``theta_h`` the halves'
        mean and ``h = (1/n_a + 1/n_b) / 2`` (equal halves: ``2 theta - theta_h``), which removes a
        bias ``c / n`` as the delete-one-window jackknife does."""
        out = _metrics(st, self.e)
        if correct:
            n, (na, nb) = float(self._n), self._counts
            h = (1 / na + 1 / nb) / 2
            for m, key in (("erank_kcache", "kk"), ("erank_vcache", "vv")):
                half = sum(spectrum_stats(gram_sv(part[key]))["erank"] for part in halves) / 2
                out[m] = out[m] - (half - out[m]) / (h * n - 1)
        return out

    def result(self) -> tuple[pd.DataFrame, dict[str, str]]:
        """Rows (``analysis.registry.RESULT_COLUMNS``) of every activation metric, and notes."""
        if not self._windows and not self._pending:
            raise AnalysisError(f"layer {self.layer}: no tokens were added (call add() first)")
        notes = dict(self.notes)
        with torch.inference_mode():
            self._reduce()
            per_win = {key: torch.cat([w[key] for w in self._windows]) for key in self._windows[0]}
            n_win = int(per_win["n"].shape[0])
            total = {key: val.sum(0) for key, val in per_win.items()}
            values = _metrics(total, self.e)
            correct = _ERANKS if n_win > 1 and self._n >= TOKENS_PER_COLUMN * self.e else ()
            layer_values, layer_lo, layer_hi, layer_nulls = self._layer()
            draws = [self._chance_metrics(st, halves, correct) for st, halves in self._chance_stats()]
            nulls = {m: (torch.stack([dr[m] for dr in draws]).flatten().sort().values
                         if _row_metric(m).chance != "none" else torch.empty(0, dtype=torch.float64))
                     for m in values}                        # draws x heads, sorted
            nulls.update(layer_nulls)
            nulls = {m: t[torch.isfinite(t)].cpu() for m, t in nulls.items()}
            chance = {m: float(t.quantile(0.5)) if len(t) else math.nan   # median (the mean of the middle two)
                      for m, t in nulls.items()}
            band = {m: tuple(float(x) for x in t.quantile(torch.tensor(NULL_BAND, dtype=t.dtype)))
                    if len(t) else (math.nan, math.nan) for m, t in nulls.items()}
            # the input's directions: a Gram of rank <= d_head lets every head's K and V caches span the
            # same subspace (the share fit reads 1 whatever the weights)
            lam = small_eigvalsh(self._gram) if self._n else torch.zeros(1, dtype=torch.float64)
            in_rank = int((lam > self.d * EPS64 * lam.max().clamp_min(0)).sum()) + int(self.has_bias)
            if n_win > 1:
                # the eranks' small-sample bias has no closed form: the jackknife removes its 1/n
                # term, where there are enough tokens for the value to be measured at all
                values, lo, hi = self._jackknife(per_win, total, values, correct)
            else:
                lo = hi = {m: torch.full_like(val, float("nan")) for m, val in values.items()}
            values, lo, hi = {**values, **layer_values}, {**lo, **layer_lo}, {**hi, **layer_hi}
        n = self._n
        fixed: set[str] = set()                                # metrics degenerate in this layer
        if n < TOKENS_PER_COLUMN * self.e:
            fixed |= set(_FEW_TOKENS)
            for m, why in _FEW_TOKENS.items():
                _add_note(notes, m, f"degenerate: {n} tokens < {TOKENS_PER_COLUMN} x d_head = "
                                    f"{TOKENS_PER_COLUMN * self.e}: {why}")
        cols = self.g * self.e                                 # the whole layer's cache columns
        if n < TOKENS_PER_COLUMN * cols:
            fixed |= set(LAYER_METRICS)
            for m, like in zip(LAYER_METRICS, ("kv_cka_act", "erank_kcache", "erank_vcache")):
                _add_note(notes, m, f"degenerate: {n} tokens < {TOKENS_PER_COLUMN} x n_kv_heads*d_head = "
                                    f"{TOKENS_PER_COLUMN * cols}: {_FEW_TOKENS[like]} (more tokens: analyze "
                                    f"--tokens {TOKENS_PER_COLUMN * cols})")
        if in_rank <= self.e:
            fixed |= set(_FEW_DIRECTIONS)
            for m in _FEW_DIRECTIONS:
                _add_note(notes, m, f"degenerate: the captured input spans {in_rank} directions, no more than "
                                    f"the head's {self.e} columns, so the K and V caches span the same subspace "
                                    "and the value is fixed by the input, not the weights")
        if n_win == 1:
            # one note per registered metric (the per-layer logit row is logit_symmetry's)
            for m in dict.fromkeys("logit_symmetry" if m == "logit_symmetry_layer" else m for m in values):
                _add_note(notes, m, "one window: no interval over windows (ci_low, ci_high empty)")
        rows = []
        for m, val in values.items():
            row = _row_metric(m)
            lab = "KV" if row.axis == "kv_head" else "H"
            heads = [None] if m == "logit_symmetry_layer" or row.axis == "layer" else range(val.numel())
            metric = row.name
            flat, flo, fhi = val.reshape(-1).tolist(), lo[m].reshape(-1).tolist(), hi[m].reshape(-1).tolist()
            for i, hd in enumerate(heads):
                label = f"L{self.layer}" if hd is None else f"L{self.layer}{lab}{hd}"
                rows.append((self.layer, hd, label, metric, flat[i], chance[m], n, flo[i], fhi[i], *band[m],
                             pd.NA, metric in fixed, pd.NA, pd.NA, p_value(flat[i], nulls[m].tolist())))
        df = pd.DataFrame(rows, columns=RESULT_COLUMNS + ["p_null"])
        for col in ("head", "n_tokens", *PAIR_COLUMNS):
            df[col] = df[col].astype("Int64")
        df["above_chance"] = df["above_chance"].astype("boolean")
        df["degenerate"] = df["degenerate"].astype(bool)
        return df, notes

    def _layer(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor],
                              dict[str, torch.Tensor]]:
        """The whole layer's metrics (``analysis.layer_caches``) as ``(values, ci_low, ci_high, null
        draws)``, 0-dim float64 tensors: the value from the float64 totals, its delete-one-group
        jackknife-t interval over the groups of windows (``t_{N-1}``, ``N`` the groups with tokens;
        NaN with one), the eranks bias-corrected by the same jackknife where the sample has at least
        ``8 x n_kv_heads*d_head`` tokens (the CKA is the paper's estimator, not corrected); the null
        draws: the same input through the chance draws' K and V columns (no biases), their eranks
        extrapolated from the even and the odd windows as the per-head draws' are."""
        ge = self.g * self.e
        a, b = self.w[:, :ge].double(), self.w[:, ge:2 * ge].double()
        bk, bv = (self.b[:ge].double(), self.b[ge:2 * ge].double()) if self.has_bias else (None, None)
        s_all, n = self._sums.sum(0), float(self._n)
        values = layer_metrics(a, b, bk, bv, self._gram, s_all, n)
        used = (self._lcounts > 0).nonzero().flatten().tolist()
        correct = len(used) > 1 and self._n >= TOKENS_PER_COLUMN * ge
        nan = lambda: torch.tensor(float("nan"), dtype=torch.float64, device=self.dev)   # noqa: E731
        lo, hi = {m: nan() for m in LAYER_METRICS}, {m: nan() for m in LAYER_METRICS}
        if len(used) > 1:
            reps = [layer_metrics(a, b, bk, bv, self._gram - self._lgram[j].double(), s_all - self._lsums[j],
                                  n - float(self._lcounts[j])) for j in used]
            t = t_quantile(len(used) - 1)
            for m in LAYER_METRICS:
                value, se = jackknife(torch.stack([r[m] for r in reps]), values[m])
                value = value if correct and m != "kv_cka_layer_act" else values[m]
                low, high = LAYER_RANGES[m] or (1.0, float(ge))
                values[m] = value.clamp(low, high)
                lo[m], hi[m] = (value - t * se).clamp(low, high), (value + t * se).clamp(low, high)
        n_even, n_odd = self._counts
        g_even, s_even = self._gram_even.double(), self._sums[0]
        draws: dict[str, list[torch.Tensor]] = {m: [] for m in LAYER_METRICS}
        for r in (self._r if self._r is not None else self._seeded()):
            ra, rb = r[:, :ge].double(), r[:, ge:2 * ge].double()
            got = layer_metrics(ra, rb, None, None, self._gram, s_all, n)
            if correct and n_even and n_odd:
                halves = [layer_metrics(ra, rb, None, None, g_even, s_even, float(n_even)),
                          layer_metrics(ra, rb, None, None, self._gram - g_even, self._sums[1], float(n_odd))]
                h = (1 / n_even + 1 / n_odd) / 2
                for m in ("erank_kcache_layer", "erank_vcache_layer"):
                    half = (halves[0][m] + halves[1][m]) / 2
                    got[m] = got[m] - (half - got[m]) / (h * n - 1)
            for m in LAYER_METRICS:
                draws[m].append(got[m])
        nulls = {m: torch.stack(v).sort().values for m, v in draws.items()}
        return values, lo, hi, nulls

    def _jackknife(self, per_win: dict[str, torch.Tensor], total: dict[str, torch.Tensor],
                   values: dict[str, torch.Tensor], correct: tuple[str, ...]
                   ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The delete-one-window jackknife of every metric (``analysis.intervals.jackknife``): the
        value (bias-corrected for the metrics in ``correct``) and its ``t_{N-1}`` interval, clipped
        to the metric's range; the leave-one-out sums ``total - window`` in batches of windows
        bounded by ``_BOOT_BYTES``."""
        n_win = int(per_win["n"].shape[0])
        width = sum(val[0].numel() for val in per_win.values())                  # float64s per window
        chunk = max(1, _BOOT_BYTES // (8 * width * 4))                            # sums + work space
        reps: dict[str, list[torch.Tensor]] = {}
        for s in range(0, n_win, chunk):
            sums = {key: total[key] - val[s:s + chunk] for key, val in per_win.items()}   # [b, ...]
            for m, val in _metrics(sums, self.e).items():
                reps.setdefault(m, []).append(val)
        t = t_quantile(n_win - 1)
        mid, lo, hi = {}, {}, {}
        for m, parts in reps.items():
            value, se = jackknife(torch.cat(parts), values[m])                   # [n_win, ...] -> [...]
            value = value if m in correct else values[m]
            low, high = _RANGE.get(m) or ((1.0, float(self.e)) if m in _ERANKS else (-math.inf, math.inf))
            mid[m] = value.clamp(low, high)
            lo[m], hi[m] = (value - t * se).clamp(low, high), (value + t * se).clamp(low, high)
        return mid, lo, hi


def _row_metric(m: str):
    """The registry row of a value of ``_metrics`` (the layer's logit symmetry is ``logit_symmetry``'s)."""
    return BY_NAME["logit_symmetry" if m == "logit_symmetry_layer" else m]


def _tokens_last(t: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``[..., T, a, b] -> [..., a, b, T]`` in ``dtype``, contiguous, in one copy (``t`` may be a view)."""
    *lead, T, a, b = t.shape
    return torch.empty(*lead, a, b, T, dtype=dtype, device=t.device).copy_(t.movedim(-3, -1))


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


#: The per-window logit sums (statistics keys).
_LOGIT_KEYS = ("lsym", "lsq", "lsym_layer", "lsq_layer")


def _heads(w: torch.Tensor, b: torch.Tensor | None, g: int, h: int, e: int, *, identity_q: bool,
           b_q: torch.Tensor | None = None) -> dict[str, torch.Tensor | None]:
    """Float64 per-head views of ``L`` sets of projections side by side ``w: [L, d, 2ge (+ he)]``
    (K, V, Q head-major) and their biases ``b: [2ge (+ he)]`` (None: none): ``wk``, ``wv``
    ``[L, d, g, e]``, ``wq`` ``[L, d, h, e]`` (the identity for an identity query), ``wqs``
    ``[L, d, g, e]`` (the query heads summed per kv head: the layer's logits are ``Qs K^T``),
    biases ``bk`` ... ``bqs`` (``[heads, e]``, None where zero)."""
    ge, rep = g * e, h // g
    nz = lambda t: None if t is None or not bool(t.any()) else t      # noqa: E731
    out = {"wk": w[..., :ge].unflatten(-1, (g, e)), "wv": w[..., ge:2 * ge].unflatten(-1, (g, e)),
           "bk": None if b is None else nz(b[:ge].view(g, e)), "bv": None if b is None else nz(b[ge:2 * ge].view(g, e)),
           "wq": None, "bq": None}
    if w.shape[-1] > 2 * ge:
        out["wq"] = w[..., 2 * ge:].unflatten(-1, (h, e))
        out["bq"] = None if b is None else nz(b[2 * ge:].view(h, e))
    elif identity_q:                                                     # Q_h = x[:, h*e:(h+1)*e] + b_Q[h]
        eye = torch.eye(w.shape[-2], dtype=w.dtype, device=w.device)
        out["wq"] = eye.expand(w.shape[0], -1, -1).unflatten(-1, (h, e))
        out["bq"] = nz(b_q.double().view(h, e))
    if out["wq"] is not None:
        out["wqs"] = out["wq"].unflatten(-2, (g, rep)).sum(-2) if rep > 1 else out["wq"]   # [L, d, g, e]
        out["bqs"] = None if out["bq"] is None else out["bq"].view(g, rep, e).sum(1)
    return out


def _gram_stats(G: torch.Tensor, s: torch.Tensor, n: torch.Tensor, heads: dict, rep: int, *, with_q: bool,
                with_v: bool = True) -> dict[str, torch.Tensor]:
    """Per-window sums of ``L`` sets of projections ``x W + b`` (``_heads``) from the windows'
    float64 Grams ``G = sum_t x_t x_t^T: [N, d, d]``, sums ``s = sum_t x_t: [N, d]`` and token
    counts ``n: [N]``, by ``(X A + 1 a^T)^T (X B + 1 b^T) = A^T G B + (A^T s) b^T + a (s^T B)
    + n a b^T``; keys as ``ActivationAccumulator._proj_stats``, every value ``[L, N, ...]``."""
    names = ["k"] + (["v"] if with_v else []) + (["q"] if with_q else []) + (["qs"] if with_q and rep > 1 else [])
    L, d = heads["wk"].shape[:2]
    N = G.shape[0]
    ws = [heads["w" + k] for k in names]                                 # [L, d, heads, e]
    wc = torch.cat([w.transpose(0, 1).reshape(d, -1) for w in ws], 1)    # [d, C], columns (L, head, e)
    y = (wc.T @ G.transpose(0, 1).reshape(d, N * d)).view(-1, N, d)      # W^T G per window: [C, N, d]
    sw = s @ wc                                                          # s^T W: [N, C]
    parts, off = {}, 0
    for k, w in zip(names, ws):
        c = w[0].numel() // d
        parts[k] = (w, y[off:off + L * c], sw[:, off:off + L * c], heads["b" + k])
        off += L * c
    if with_q and rep == 1:
        parts["qs"] = parts["q"]
    nn = n[:, None, None, None]                                          # [N, 1, 1, 1]

    def cross(a: str, b: str, *, flat: bool = False, rep_b: int = 1) -> torch.Tensor:
        """``sum_t (x_t W_a + b_a)^T (x_t W_b + b_b)`` per head (``flat``: all heads as one):
        ``[L, N, heads, e_a, e_b]``."""
        wa, ya, sa, ba = parts[a]
        wb, _, sb, bb = parts[b]
        m, ea = (1, wa.shape[-2] * wa.shape[-1]) if flat else wa.shape[-2:]
        mb, eb = (1, wb.shape[-2] * wb.shape[-1]) if flat else wb.shape[-2:]
        right = wb.reshape(L, d, mb, eb).permute(0, 2, 1, 3)             # [L, heads, d, e_b]
        sb = sb.view(N, L, mb, eb).transpose(0, 1)                       # [L, N, heads, e_b]
        bb = None if bb is None else bb.reshape(mb, eb)
        if rep_b > 1:                                                    # kv head g(h) beside query head h
            right, sb = right.repeat_interleave(rep_b, 1), sb.repeat_interleave(rep_b, 2)
            bb = None if bb is None else bb.repeat_interleave(rep_b, 0)
        out = torch.bmm(ya.view(L * m, ea * N, d), right.reshape(L * m, d, eb))
        out = out.view(L, m, ea, N, eb).permute(0, 3, 1, 2, 4)          # [L, N, heads, e_a, e_b]
        ba = None if ba is None else ba.reshape(m, ea)
        if bb is not None:
            out = out + sa.view(N, L, m, ea).transpose(0, 1)[..., :, None] * bb[:, None, :]
        if ba is not None:
            out = out + ba[:, :, None] * sb[..., None, :]
        if ba is not None and bb is not None:
            out = out + nn * (ba[:, :, None] * bb[:, None, :])
        return out

    def total(name: str) -> torch.Tensor:
        """``sum_t (x_t W + b)`` per head: ``[L, N, heads, e]``."""
        w, _, sb, b = parts[name]
        t = sb.view(N, L, *w.shape[-2:]).transpose(0, 1)
        return t if b is None else t + n[:, None, None] * b

    kk = cross("k", "k")
    st = {"n": n, "sk": total("k"), "kk": kk}
    if with_v:
        st.update(sv=total("v"), vv=cross("v", "v"), kv=cross("k", "v"))
    if with_q:
        ct = cross("q", "k", rep_b=rep)                                  # C_h^T = Q_h^T K_g(h): [L, N, h, e, e]
        st["lsym"] = (ct * ct.mT).sum((-2, -1))                          # tr(L_h L_h)
        st["lsq"] = (cross("q", "q") * kk.repeat_interleave(rep, -3)).sum((-2, -1))   # ||L_h||_F^2
        c = cross("k", "qs", flat=True)[..., 0, :, :]                    # K^T Qs: [L, N, ge, ge]
        st["lsym_layer"] = (c * c.mT).sum((-2, -1))                      # tr(L L), L = Qs K^T
        st["lsq_layer"] = (cross("k", "k", flat=True) * cross("qs", "qs", flat=True)).sum((-3, -2, -1))
    return st


def _gram_path(d: int, T: int) -> bool:
    """Whether windows of ``T`` tokens of width ``d`` are reduced through their Grams (``d <= T``:
    the Gram is no bigger than the window, and its quadratic forms cost fewer products than the
    projections) rather than projected."""
    return d <= T


def _layer_logit_sums(q: torch.Tensor, k: torch.Tensor,
                      dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """``tr(L L)`` and ``||L||_F^2`` of ``L = q k^T`` (``q, k: [..., T, ge]`` float32; ``L`` is
    ``[T, T]`` per window, formed in float32 in batches of windows; its elementwise products in
    ``dtype``, summed in float64): ``[...]``."""
    lead, T = q.shape[:-2], q.shape[-2]
    qf, kf = q.reshape(-1, T, q.shape[-1]), k.reshape(-1, T, k.shape[-1])   # [M, T, ge]
    step = max(1, _CHUNK_BYTES // (8 * T * T * 3))
    sym, sq = [], []
    for lo in range(0, qf.shape[0], step):
        lw = (qf[lo:lo + step] @ kf[lo:lo + step].mT).to(dtype)          # [m, T, T]
        sym.append((lw * lw.mT).sum((-2, -1), dtype=torch.float64))
        sq.append(lw.square().sum((-2, -1), dtype=torch.float64))
    return torch.cat(sym).view(lead), torch.cat(sq).view(lead)


def _add_note(notes: dict[str, str], metric: str, msg: str) -> None:
    notes[metric] = f"{notes[metric]}; {msg}" if metric in notes else msg


def _metrics(st: dict[str, torch.Tensor], d_head: int) -> dict[str, torch.Tensor]:
    """Every metric from summed statistics with any leading batch dims ``[..., g, ...]``
    (module docstring); float64 ``[..., g]``, ``[..., h]`` and ``[...]`` (the layer's logits)."""
    kk, vv, kv, n = st["kk"], st["vv"], st["kv"], st["n"]
    tr = lambda a: torch.diagonal(a, dim1=-2, dim2=-1).sum(-1)           # noqa: E731
    out = {"kv_cosine_act": tr(kv) / (tr(kk) * tr(vv)).sqrt()}
    root = n.sqrt()[..., None, None]                                     # [..., 1, 1]
    uk, uv = st["sk"] / root, st["sv"] / root                            # sum / sqrt(n): [..., g, e]
    # centred Grams, e.g. Kc^T Kc = K^T K - (sum k)(sum k)^T / n, and their squared norms:
    # each formed in one fused pass (rank-one update) and read once (no squared copy)
    fro = lambda a, u, w: torch.linalg.vector_norm(_minus_outer(a, u, w), dim=(-2, -1)).square()   # noqa: E731
    out["kv_cka_act"] = _debiased_cka(fro(kv, uk, uv), fro(kk, uk, uk), fro(vv, uv, uv),
                                      tr(kk) - uk.square().sum(-1), tr(vv) - uv.square().sum(-1), n[..., None])
    out["kv_share_r2_act"] = _adjusted_r2(_share_r2(kk, vv, kv, d_head), n[..., None], d_head)
    for name, gram in (("erank_kcache", kk), ("erank_vcache", vv)):
        out[name] = spectrum_stats(gram_sv(gram))["erank"]
    if "lsym" in st:
        out["logit_symmetry"] = (1 + st["lsym"] / st["lsq"]) / 2
        out["logit_symmetry_layer"] = (1 + st["lsym_layer"] / st["lsq_layer"]) / 2
    out.update(activation_values(st, d_head))                            # registered plugins' metrics
    return out


def _minus_outer(a: torch.Tensor, u: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``a - u w^T`` for stacks ``a: [..., m, n]``, ``u: [..., m]``, ``w: [..., n]``, in one pass
    over ``a`` (``baddbmm``: no outer-product temporary)."""
    m, k = a.shape[-2:]
    flat = torch.baddbmm(a.reshape(-1, m, k), u.reshape(-1, m, 1), w.reshape(-1, 1, k), alpha=-1)
    return flat.view(a.shape)


def _debiased_cka(kv2: torch.Tensor, kk2: torch.Tensor, vv2: torch.Tensor, trk: torch.Tensor, trv: torch.Tensor,
                  n: torch.Tensor) -> torch.Tensor:
    """Linear CKA with each squared norm debiased: ``(||C_kv||^2 - tr C_kk tr C_vv / (n-1)) /
    sqrt((||C_kk||^2 - tr(C_kk)^2 / (n-1)) (||C_vv||^2 - tr(C_vv)^2 / (n-1)))`` from the centred
    Grams' squared norms and traces. For Gaussian tokens ``C ~ Wishart(n - 1, Sigma)`` and each
    term's expectation is the same multiple of the population's ``||Sigma_kv||^2`` (Wishart
    moments; the unbiased HSIC of Song et al. 2012 and the debiased CKA of Kornblith et al. 2019
    in the linear-kernel, Gaussian case, formed from the sums the accumulator keeps). The plain
    ratio where a debiased norm is not positive (no more tokens than columns)."""
    m = n - 1
    num, den_k, den_v = kv2 - trk * trv / m, kk2 - trk.square() / m, vv2 - trv.square() / m
    ok = (den_k > 0) & (den_v > 0)
    return torch.where(ok, num / (den_k * den_v).clamp_min(1e-300).sqrt(), kv2 / (kk2 * vv2).sqrt())


def _adjusted_r2(r2: torch.Tensor, n: torch.Tensor, d_head: int) -> torch.Tensor:
    """``1 - (1 - R^2) n / (n - d_head)``: the share fit's residual per degree of freedom (``n -
    d_head``: the fit spends one per column of K) against ``||V||^2`` per token, so a V unrelated
    to K reads about 0 instead of ``d_head / n`` (the adjusted R^2 of an uncentred fit); the plain
    value where ``n <= d_head``."""
    return torch.where(n > d_head, 1 - (1 - r2) * n / (n - d_head).clamp_min(1), r2)


def _share_r2(kk: torch.Tensor, vv: torch.Tensor, kv: torch.Tensor, d_head: int) -> torch.Tensor:
    """``tr(KV^T KK^{-1} KV) / tr(VV)`` per stack entry, float64 (module docstring)."""
    low, info = torch.linalg.cholesky_ex(kk)                             # KK = L L^T
    # the pivots of the unit-diagonal D KK D (D = diag(KK)^-1/2), whose factor is D L:
    # (D L)_ii^2 = L_ii^2 / KK_ii
    piv2 = torch.diagonal(low, dim1=-2, dim2=-1).square() / torch.diagonal(kk, dim1=-2, dim2=-1)
    ok = (info == 0) & (piv2.amin(-1) > d_head * EPS64) & torch.isfinite(piv2).all(-1)
    if not bool(ok.all()):                                               # the solve must not see them
        low = torch.where(ok[..., None, None], low, torch.eye(kk.shape[-1], dtype=kk.dtype, device=kk.device))
    y = torch.linalg.solve_triangular(low, kv, upper=False)              # L^-1 K^T V
    explained = torch.linalg.vector_norm(y, dim=(-2, -1)).square()       # ||L^-1 K^T V||_F^2
    if not bool(ok.all()):                                               # singular: pseudo-inverse
        bad = ~ok
        lam, u = small_eigh((kk[bad] + kk[bad].mT) / 2)                  # ascending
        keep = lam > d_head * EPS64 * lam[..., -1:].clamp_min(0)
        inv = torch.where(keep, 1 / torch.where(keep, lam, torch.ones_like(lam)), torch.zeros_like(lam))
        explained[bad] = ((u.mT @ kv[bad]).square().sum(-1) * inv).sum(-1)
    return (explained / torch.diagonal(vv, dim1=-2, dim2=-1).sum(-1)).clamp(max=1.0)
