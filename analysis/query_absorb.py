"""Can W_Q be absorbed into the residual stream? (query-free attention, arXiv 2510.23912)

Stack a layer's query heads: ``A = [W_Q[0] | ... | W_Q[H-1]]``,
``[d_model, n_heads*d_head]``. If ``A`` is square and invertible, the change of
basis ``x~ = x A`` makes head ``h``'s query the identity slice
``x~[:, h*d_head:(h+1)*d_head]``, and keys keep their values with
``W_K' = A^{-1} W_K`` (``b_K' = b_K - b_Q A^{-1} W_K`` when ``x~ = x A + b_Q``).

* ``condition`` = ``sigma_max(A) / sigma_min(A)`` (inf when singular).
* ``orth_defect``: a change of basis commutes with RMSNorm/LayerNorm only when
  it is a scaled orthogonal matrix (the obstruction the paper names). With
  ``n = d_model`` and ``c = mean_i sigma_i^2 = ||A||_F^2 / n``,
  ``defect = log(c) - (2/n) log|det A| = log(arithmetic / geometric mean of sigma_i^2)``:
  0 exactly for a scaled orthogonal ``A``, larger the more the ``sigma_i``
  spread, inf for a singular ``A``. It is the log-determinant (Stein) divergence
  ``(tr(G/c) - log det(G/c) - n) / n`` of ``G = A^T A / c`` from the identity,
  i.e. ``2/n`` times the KL divergence of ``N(0, G/c)`` from ``N(0, I)``; for a
  nearly orthogonal ``A`` it is about ``var(sigma_i^2 / c) / 2``. Invariant to
  scaling ``A``. Computed on ``W_Q`` as stored (norm gains folded in only where
  the converter did).
* ``absorb_error`` (models without normalisation, where the conversion is
  exact in exact arithmetic): ``max |L~ - L| / max |L|`` over heads and pairs of
  ``tokens`` sample inputs ``x ~ N(0, 1)``, where ``L = (x W_Q[h] + b_Q)(x W_K + b_K)^T``
  and ``L~`` the converted model's logits (float32, ``torch.linalg.solve``):
  how much the conversion loses to round-off and ill-conditioning.

The first two need no SVD of ``A`` and no ``A^T A``: one LU factorisation
(``log|det A|`` from its diagonal, ``sigma_min`` by Lanczos through its
triangular solves) and ``sigma_max`` by Lanczos on ``x -> A^T (A x)``; see
``stacked_spectrum``. Precision: the LU is float32; for a layer whose condition
number exceeds ``REDO_CONDITION`` (3e3) ``sigma_min`` is refined to float64
accuracy through that same LU (iteratively refined inverse iteration), and past
``REFINE_CONDITION`` (~2e6) the LU is redone in float64, so both equal float64
``svdvals``/``slogdet`` to 1e-3 relative or better at condition numbers up to 1e6
(measured ~1e-5 and below; ``log|det A|`` from the float32 LU moves the defect by
~6e-6 at 1e6). ``absorb_error`` is float32
round-off by definition and stays float32.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from analysis._linalg import EPS32, EPS64, kv_index, small_eigh, stack_heads


def stack_queries(q: torch.Tensor) -> torch.Tensor:
    """``[n_heads, d_model, d_head] -> [d_model, n_heads*d_head]`` (head-major columns),
    stored column-major (``A^T`` contiguous): LAPACK's layout, so the LU and solves
    need no transposing copy, and ``A x`` and ``A^T y`` both read it in place
    (``analysis._linalg.stack_heads``)."""
    return stack_heads(q)


#: How far the gap-based error estimate ``r^2 / (theta - theta_2)`` is trusted: the Ritz gap
#: overstates the true gap while the next Ritz value has not converged (clustered top singular
#: values), and the estimate then understates the error. Measured: a Gaussian 2048 x 2048 W_Q
#: (bf16 values, seed 0) stopped after 26 steps at a true error of 2.3e-4 for a requested 1e-4;
#: with the estimate taken 10x larger, 51 steps and 7.8e-8 (a Gaussian 4096: 52 -> 57 steps).
_GAP_DISTRUST = 10.0


#: The Lanczos block size of ``stacked_spectrum`` off the CPU (on the CPU: 1). A block needs
#: fewer steps, each a few GPU kernels and one sync; but the projected matrix ``T`` that each
#: step decomposes on the host grows ``block`` times larger (``scripts/layer_profile.py
#: --gpu-blocks`` times the choices side by side).
GPU_BLOCK = 8


def _largest_sv_squared(fwd: Callable[[torch.Tensor], torch.Tensor], bwd: Callable[[torch.Tensor], torch.Tensor],
             n: int, device, *, block: int = 1, rtol: float | Callable[[float], float] = 1e-6,
             max_iter: int = 300, vectors: int = 0):
    """``sigma_max(F)^2``, the largest eigenvalue of ``F^T F``, for an operator given by
    ``fwd: X -> F X`` and ``bwd: Y -> F^T Y`` on float32 blocks ``[n, block]``.

    Block Lanczos with full re-orthogonalisation (Golub & Van Loan, Matrix
    Computations, sec. 10.3): the orthonormal basis ``B = [Q_0 | Q_1 | ...]`` grows
    by ``Q_{k+1} R_k = (I - B B^T) Z_k``, ``Z_k = F^T F Q_k``. The top Ritz pair
    ``(theta, y)`` of ``T = B^T F^T F B`` has residual ``||R_k y_k||`` (``y_k``: the
    rows of ``y`` on the newest block). It stops when ``B`` spans everything, after
    ``max_iter`` blocks, or when the error estimate ``min(r, r^2 / (theta - theta_2))``
    (``theta_2`` the next Ritz value; Parlett, The Symmetric Eigenvalue Problem,
    sec. 11.7) is at most ``rtol * theta`` (``rtol`` may be a function of the
    current ``theta``), its second term taken ``_GAP_DISTRUST`` times larger.
    ``theta`` approaches the eigenvalue from below. The estimate is mostly 10-100x
    pessimistic when the top eigenvalues cluster (random matrices), but optimistic
    while ``theta_2`` lags its eigenvalue (``_GAP_DISTRUST``); extrapolating the rise
    of ``theta`` would stop sooner but stops too soon inside a cluster (a test has
    such a case).

    ``block = 1`` is plain Lanczos: on a CPU it needs the least arithmetic (a
    matrix-vector product is memory-bound); larger blocks need fewer, larger
    steps, which suits a GPU. ``vectors``: return ``(theta, V)`` with ``V: [n, k]`` the
    top ``k <= vectors`` Ritz vectors (float32, orthonormal; fewer when the basis is
    smaller) instead of ``theta`` alone.
    """
    block = max(1, min(block, n))
    steps = min(max_iter, n // block)
    gen = torch.Generator(device="cpu").manual_seed(0)
    q = torch.linalg.qr(torch.randn(n, block, generator=gen, dtype=torch.float64))[0]
    q = q.to(device=device, dtype=torch.float32)                          # [n, b]
    basis = torch.empty(n, steps * block, dtype=torch.float32, device=device)
    t = torch.zeros(steps * block, steps * block, dtype=torch.float64)    # T = B^T F^T F B (CPU)
    theta = 0.0
    for k in range(steps):
        lo, hi = k * block, (k + 1) * block
        basis[:, lo:hi] = q
        b_ = basis[:, :hi]
        z = bwd(fwd(q))                                                   # Z_k = F^T F Q_k, [n, b]
        bz = b_.mT @ z                                                    # B^T Z_k, [hi, b]
        bz_cpu = bz.double().cpu()
        if not bool(torch.isfinite(bz_cpu).all()):
            # an operator through a singular matrix's LU (round-off pivots) overflows: its top
            # eigenvalue is unbounded, which the callers read as sigma_min = 0 (singular)
            return (math.inf, b_) if vectors else math.inf
        t[:hi, lo:hi] = bz_cpu
        t[lo:hi, :hi] = bz_cpu.mT
        ritz, y = torch.linalg.eigh(t[:hi, :hi])
        theta = float(ritz[-1])
        done = ((lambda: (theta, b_ @ y[:, -min(vectors, hi):].to(device=device, dtype=torch.float32)))
                if vectors else (lambda: theta))
        if hi + block > n:                                                # B spans everything
            return done()
        z = z - b_ @ bz
        z = z - b_ @ (b_.mT @ z)                                          # twice is enough
        q, r_k = torch.linalg.qr(z)                                       # [n, b], [b, b]
        r_k = r_k.double().cpu()
        r = float(torch.linalg.vector_norm(r_k @ y[lo:hi, -1]))
        gap = theta - float(ritz[-2]) if hi > 1 else 0.0
        err = min(r, _GAP_DISTRUST * r * r / gap) if gap > 0 else r
        tol = rtol(theta) if callable(rtol) else rtol
        if err <= tol * abs(theta):
            return done()
        if float(torch.diagonal(r_k).abs().max()) <= 1e-6 * abs(theta):  # invariant subspace found
            return done()
        if block > 1:
            # columns of z at round-off level normalise into directions that are no
            # longer orthogonal to B: project once more
            q = torch.linalg.qr(q - b_ @ (b_.mT @ q))[0]
    return done()


@dataclass(frozen=True)
class StackedSpectrum:
    """What the layer analysis needs of the stacked W_Q ``A`` (``[d_model, n]``)."""

    n: int                    # columns of A, n_heads * d_head
    sigma_max: float
    sigma_min: float          # 0.0 when singular
    fro2: float               # ||A||_F^2 = sum_i sigma_i^2
    log_abs_det: float        # log|det A|; -inf when singular, nan when A is not square

    @property
    def condition(self) -> float:
        """``sigma_max / sigma_min`` (inf when singular)."""
        return self.sigma_max / self.sigma_min if self.sigma_min > 0 else float("inf")

    @property
    def orth_defect(self) -> float:
        """``log(||A||_F^2 / n) - (2/n) log|det A|`` (module docstring): nan when ``A``
        is not square or zero, inf when singular; round-off below 0 reads 0 (AM >= GM)."""
        if math.isnan(self.log_abs_det) or self.fro2 <= 0:
            return float("nan")
        if self.log_abs_det == float("-inf"):
            return float("inf")
        return max(math.log(self.fro2 / self.n) - 2.0 * self.log_abs_det / self.n, 0.0)


#: Above this condition number (as the float32 LU estimates it) ``sigma_min`` is refined
#: (``_refined_sigma_min``). The float32 LU's relative error in ``sigma_min`` grows like
#: ``eps32 * condition`` (measured 0.03-0.9x that on geometric and Gaussian spectra, n
#: 256-4096: 5.9e-4 at condition 5.7e3, 2.2e-3 at 3.9e4, 3.9e-3 at 1e6), so below 3e3 it
#: stays under ~4e-4; refined, it is ~1e-5 at condition 1e6 and ~1e-10 at 3.9e4.
REDO_CONDITION = 3e3
#: Above this condition number the float32 LU no longer converges iterative refinement
#: (each sweep shrinks the error by about ``eps32 * condition``): ``sigma_min`` and
#: ``log|det A|`` come from a float64 LU instead, at about twice the float32 LU's cost.
REFINE_CONDITION = 0.25 / EPS32
#: Above ``SINGULAR_EPS64 / (n * eps64)`` the stacked W_Q is singular to float64 working precision
#: (numpy's ``matrix_rank`` tolerance, ``sigma_min < n * eps * sigma_max``): ``sigma_min`` reads 0,
#: the condition number inf and the defect inf. A stack of repeated heads (Q = K with grouped
#: kv heads: query heads of one group share ``W_K[g]``, so the stack's column blocks repeat) is
#: exactly singular, and its LU's round-off pivots would otherwise give a finite ~1e18.
SINGULAR_EPS64 = 1.0
#: Refinement sweeps per solve and subspace-iteration steps, at most (both stop when converged),
#: and the subspace's width: ``sigma_min`` converges like ``(sigma_min / sigma_{_BLOCK+1})^2`` per step.
_SWEEPS, _STEPS, _BLOCK = 8, 8, 16


def _times(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``A X`` for a square ``A: [n, n]`` and a thin ``X: [n, k]``, formed as ``(X^T A^T)^T``:
    the same sums, but BLAS then streams ``A`` once for a short left factor, which MKL's
    float64 GEMM runs 2.5-4.4x faster than a thin right factor (n 4096, k 16, either
    layout of ``A``: 101 -> 23 ms and 41 -> 16 ms on this project's AMD EPYC)."""
    return (x.mT @ a.mT).mT


def _refined_solve(a64: torch.Tensor, lu: torch.Tensor, piv: torch.Tensor, b: torch.Tensor, *,
                   adjoint: bool, tol: float = 1e-12) -> torch.Tensor | None:
    """``A^{-1} B`` (``adjoint``: ``A^{-T} B``; ``B: [n, k]``) in float64 by iterative refinement
    (Wilkinson; Higham, Accuracy and Stability of Numerical Algorithms, ch. 12): solve with the
    float32 LU, add the float32 LU's solution of the float64 residual ``B - A X``, repeat until
    the correction is below ``tol ||X||`` (or stalls below ``1e-9 ||X||``: float64's floor).
    ``a64``: ``A`` in float64 (the float32 data, exactly). None when the corrections stop
    shrinking above that (the LU too inaccurate for this ``A``)."""
    mat = a64.mT if adjoint else a64
    solve = lambda r: torch.linalg.lu_solve(lu, piv, r.float(), adjoint=adjoint).double()   # noqa: E731
    x = solve(b)
    last = math.inf
    for _ in range(_SWEEPS):
        dx = solve(b - _times(mat, x))                                # residual in float64
        x = x + dx
        size = float(dx.norm()) / max(float(x.norm()), 1e-300)
        if size <= tol:
            return x
        if size >= 0.5 * last:                                        # stalled: at float64's floor, or diverging
            return x if size <= 1e-9 else None
        last = size
    return x


def _refined_sigma_min(a: torch.Tensor, lu: torch.Tensor, piv: torch.Tensor, v: torch.Tensor,
                       condition: float) -> float | None:
    """``sigma_min(A)`` to float64 accuracy from the float32 LU.

    Subspace iteration on ``(A^T A)^{-1}`` (``W <- A^{-1} A^{-T} W``, each solve
    iteratively refined, ``_refined_solve``) from ``v: [n, k]``, the float32 Lanczos' top
    Ritz vectors (filled up to ``_BLOCK`` columns with seeded random ones), with a
    Rayleigh-Ritz step in float64 after each: ``sigma_min^2`` is the smallest eigenvalue
    of ``(A W)^T (A W)`` for orthonormal ``W``, an upper bound that converges like
    ``(sigma_min / sigma_{_BLOCK+1})^2`` per step. A component of ``W`` along a large
    singular direction weighs ``(sigma_i / sigma_min)^2`` in that bound, so the solves are
    refined to ``1e-4 / condition``. Stops when the smallest Ritz vector is certified
    (``_certified``: one refined application of ``(A^T A)^{-1}`` to that vector alone).
    One step takes the error from ``eps32 * condition`` (2e-3 at condition 4e4) to ~1e-10
    on a Gaussian ``4096 x 4096`` stack. None when the refinement does not converge or
    nothing is certified within ``_STEPS`` steps (then a float64 LU is needed)."""
    n = a.shape[0]
    a64 = a.double()                                                  # [n, n], the float32 data exactly
    k = min(_BLOCK, n)
    w = v.double()
    if w.shape[1] < k:                                                # a short Lanczos run: fill the block
        gen = torch.Generator(device="cpu").manual_seed(1)
        extra = torch.randn(n, k - w.shape[1], generator=gen, dtype=torch.float64).to(a.device)
        w = torch.cat([w, extra], dim=1)
    w = torch.linalg.qr(w)[0]                                         # [n, k], orthonormal
    tol = min(1e-6, 1e-4 / max(condition, 1.0))
    best = math.inf
    for _ in range(_STEPS):
        y = _refined_solve(a64, lu, piv, w, adjoint=True, tol=tol)                       # A^{-T} W
        w_new = None if y is None else _refined_solve(a64, lu, piv, y, adjoint=False, tol=tol)   # (A^T A)^{-1} W
        if w_new is None or not bool(torch.isfinite(w_new).all()):
            return None
        w = torch.linalg.qr(w_new)[0]                                 # [n, k]
        aw = _times(a64, w)                                           # [n, k]
        lam, vec = small_eigh(aw.mT @ aw)                             # Rayleigh-Ritz, ascending
        w, aw = w @ vec, aw @ vec                                     # Ritz vectors, smallest first
        lam0 = float(lam[0].clamp_min(0))
        best = min(best, lam0 ** 0.5)
        if lam0 <= 0 or k < 2 or _certified(a64, lu, piv, w[:, :1], 1.0 / float(lam[1]), tol):
            return best
    return None


def _certified(a64: torch.Tensor, lu: torch.Tensor, piv: torch.Tensor, w: torch.Tensor, mu_2: float,
               tol: float) -> bool:
    """Whether the unit vector ``w: [n, 1]`` is ``(A^T A)^{-1}``'s top eigenvector to within a
    1e-8 relative error of its Rayleigh quotient ``mu``: the residual ``s = B w - mu w`` of
    ``B = (A^T A)^{-1}`` (one refined application, one column) bounds it by
    ``min(||s||, ||s||^2 / (mu - mu_2))`` (Kato-Temple; ``mu_2``: ``B``'s next Ritz value).
    ``B`` damps a large singular direction by ``1 / sigma_i^2``, so this residual is not
    swamped by them as ``A^T A``'s own residual is."""
    y = _refined_solve(a64, lu, piv, w, adjoint=True, tol=tol)
    y = None if y is None else _refined_solve(a64, lu, piv, y, adjoint=False, tol=tol)   # B w, [n, 1]
    if y is None or not bool(torch.isfinite(y).all()):
        return False
    mu = float(w.mT @ y)
    s = float(torch.linalg.vector_norm(y - mu * w))
    gap = mu - mu_2
    return mu > 0 and min(s, s * s / gap if gap > 0 else s) <= 1e-8 * mu


def _sigma_min_squared_inv(lu: torch.Tensor, piv: torch.Tensor, n: int, device, block: int,
                           dtype: torch.dtype = torch.float32, rtol: float = 1e-6, vectors: int = 0):
    """``1 / sigma_min(A)^2``, the top eigenvalue of ``(A^T A)^{-1} = A^{-1} A^{-T}``, by
    Lanczos through the triangular solves of ``A``'s LU (``lu``, ``piv``) of ``dtype``;
    the Lanczos basis stays float32 (the operator's relative error is what matters)."""
    if dtype == torch.float32:
        fwd = lambda x: torch.linalg.lu_solve(lu, piv, x, adjoint=True)          # A^{-T} x
        bwd = lambda y: torch.linalg.lu_solve(lu, piv, y)                        # A^{-1} y
    else:
        fwd = lambda x: torch.linalg.lu_solve(lu, piv, x.to(dtype), adjoint=True).float()
        bwd = lambda y: torch.linalg.lu_solve(lu, piv, y.to(dtype)).float()
    return _largest_sv_squared(fwd, bwd, n, device, block=block, rtol=rtol, vectors=vectors)


def stacked_spectrum(q: torch.Tensor, *, fro2: float | None = None) -> StackedSpectrum:
    """``sigma_max``, ``sigma_min``, ``||A||_F^2`` and ``log|det A|`` of the stacked W_Q.

    ``q: [n_heads, d_model, d_head]``. For a square ``A`` (``n_heads*d_head ==
    d_model``), no SVD and no Gram ``A^T A`` (both ``O(d_model^3)``, the slowest
    steps by far): one float32 LU factorisation ``A = P L U``
    (``log|det A| = sum_i log|U_ii|``); ``1/sigma_min^2``, the top eigenvalue of
    ``(A^T A)^{-1}``, by Lanczos through the LU's triangular solves (float32:
    relative accuracy about ``eps32 * condition``); ``sigma_max^2`` by Lanczos on
    ``x -> A^T (A x)`` to a relative accuracy of
    ``max(1e-6, min(1e-4, eps32 * condition / 10))`` on ``sigma_max``.

    Precision: when that float32 estimate of the condition number exceeds
    ``REDO_CONDITION``, ``sigma_min`` is refined (``_refined_sigma_min``: inverse
    iteration from the Lanczos vector with iteratively refined solves through the
    float32 LU, residuals in float64); past ``REFINE_CONDITION``, or when the
    refinement does not converge, ``A`` (float32 data, converted exactly) is
    factorised again in float64 and ``sigma_min`` and ``log|det A|`` come from that
    LU. The condition number and the orthogonality defect then equal float64
    ``svdvals``/``slogdet`` of ``A`` to ~1e-5 relative up to condition 1e6 and beyond
    (the float32 Lanczos alone is 4e-3 off at 1e6). This replaced a float64 LU for
    every layer past 3e3, about twice the float32 LU's time, which a Gaussian
    ``4096 x 4096`` W_Q (condition ~1.5e4) always needed. A non-square stack falls back to float64 ``svdvals``
    (``log_abs_det`` nan). ``fro2``: ``||W_Q||_F^2`` if the caller has it.
    """
    with torch.inference_mode():
        a = stack_queries(q)                                          # [d_model, n]
        d_model, n = a.shape
        if fro2 is None:
            fro2 = float(torch.linalg.vector_norm(a.double())) ** 2
        if d_model != n:
            sv = torch.linalg.svdvals(a.double())
            return _singular_checked(StackedSpectrum(n, float(sv[0]), float(sv[-1]), fro2, float("nan")))
        if fro2 <= 0:
            return StackedSpectrum(n, 0.0, 0.0, 0.0, float("-inf"))
        lu, piv, _ = torch.linalg.lu_factor_ex(a)                     # A = P L U, packed
        diag = torch.diagonal(lu).abs().double()                      # |U_ii|
        fwd, bwd = (lambda x: a @ x), (lambda y: a.mT @ y)           # A, A^T
        block = 1 if a.device.type == "cpu" else GPU_BLOCK            # see _largest_sv_squared
        if not bool(diag.min() > 0):
            top = _largest_sv_squared(fwd, bwd, n, a.device, block=block)
            return StackedSpectrum(n, top ** 0.5, 0.0, fro2, float("-inf"))
        log_det = float(diag.log().sum())
        # A first look at 1% (Lanczos' Ritz values rise to the true ones, so this condition
        # number is a lower bound): a layer already past REDO_CONDITION goes to float64 at once.
        inv_rough, v_min = _sigma_min_squared_inv(lu, piv, n, a.device, block, rtol=1e-2, vectors=_BLOCK)
        usable = inv_rough > 0 and math.isfinite(inv_rough)
        # sigma_max^2 >= ||A||_F^2 / n (the mean of the sigma_i^2): when that alone puts the
        # condition number past REDO_CONDITION, the rough Lanczos run on A is not needed (11 of
        # the ~60 matrix-vector steps of a Gaussian 4096 x 4096 W_Q)
        redo = usable and (fro2 / n * inv_rough) ** 0.5 > REDO_CONDITION
        if usable and not redo:
            top_rough = _largest_sv_squared(fwd, bwd, n, a.device, block=block, rtol=1e-2)
            redo = (top_rough * inv_rough) ** 0.5 > REDO_CONDITION
        if not redo:
            # sigma_max(A^{-T}) = 1 / sigma_min(A); A^{-T} and A^{-1} through the LU's triangular solves
            inv_top, v_min = _sigma_min_squared_inv(lu, piv, n, a.device, block, vectors=_BLOCK)
            if not (inv_top > 0 and math.isfinite(inv_top)):
                top = _largest_sv_squared(fwd, bwd, n, a.device, block=block)
                return StackedSpectrum(n, top ** 0.5, 0.0, fro2, float("-inf"))
            sigma_min = inv_top ** -0.5
        else:
            sigma_min = inv_rough ** -0.5                              # an upper bound: sets sigma_max's tolerance
        # relative tolerance on sigma_max^2: twice the one on sigma_max
        top = _largest_sv_squared(fwd, bwd, n, a.device, block=block, rtol=lambda theta: 2 * max(
            1e-6, min(1e-4, EPS32 * math.sqrt(max(theta, 0.0)) / sigma_min / 10)))
        sigma_max = top ** 0.5
        if redo or sigma_max / sigma_min > REDO_CONDITION:            # float32 LU not accurate enough
            refined = (_refined_sigma_min(a, lu, piv, v_min, sigma_max / sigma_min)
                       if sigma_max / sigma_min <= REFINE_CONDITION else None)
            if refined is not None and refined > 0:
                return _singular_checked(StackedSpectrum(n, sigma_max, refined, fro2, log_det))
            lu64, piv64, _ = torch.linalg.lu_factor_ex(a.double())    # keeps A's column-major layout
            diag64 = torch.diagonal(lu64).abs()
            if not bool(diag64.min() > 0):
                return StackedSpectrum(n, sigma_max, 0.0, fro2, float("-inf"))
            log_det = float(diag64.log().sum())
            sigma_min = _sigma_min_squared_inv(lu64, piv64, n, a.device, block, torch.float64) ** -0.5
        return _singular_checked(StackedSpectrum(n, sigma_max, sigma_min, fro2, log_det))


def _singular_checked(s: StackedSpectrum) -> StackedSpectrum:
    """``s``, or with ``sigma_min`` 0 and ``log|det A|`` -inf where ``A`` is singular to float64
    working precision (``SINGULAR_EPS64``) or ``sigma_min`` is not a finite positive number."""
    if s.sigma_min > 0 and math.isfinite(s.sigma_min) and \
            s.sigma_max / s.sigma_min < SINGULAR_EPS64 / (s.n * EPS64):
        return s
    return StackedSpectrum(s.n, s.sigma_max, 0.0, s.fro2,
                           s.log_abs_det if math.isnan(s.log_abs_det) else float("-inf"))


def condition_and_defect(q: torch.Tensor) -> tuple[float, float]:
    """``(condition, orth_defect)`` of the stacked W_Q (see module docstring and
    ``stacked_spectrum``); the defect is nan for a non-square stack."""
    s = stacked_spectrum(q)
    return s.condition, s.orth_defect


def absorb_error(q: torch.Tensor, k: torch.Tensor, b_q: torch.Tensor | None,
                 b_k: torch.Tensor | None, *, tokens: int = 64, seed: int = 0) -> float:
    """Relative max logit error of the query-free conversion (see module docstring).

    ``q: [n_heads, d_model, d_head]`` with ``n_heads*d_head == d_model``,
    ``k: [n_kv_heads, d_model, d_head]``, biases ``[heads, d_head]`` or None.
    """
    with torch.inference_mode():
        n_heads, d_model, d_head = q.shape
        n_kv = k.shape[0]
        dev = q.device
        gen = torch.Generator(device="cpu").manual_seed(seed)
        x = torch.randn(tokens, d_model, generator=gen).to(dev)          # [T, d_model]
        q32, k32 = q.float(), k.float()
        bq = b_q.float() if b_q is not None else torch.zeros(n_heads, d_head, device=dev)
        bk = b_k.float() if b_k is not None else torch.zeros(n_kv, d_head, device=dev)
        kv_of = kv_index(n_heads, n_kv, dev)
        # original: [H, T, d_head] queries, [n_kv, T, d_head] keys
        qh = torch.einsum("td,hde->hte", x, q32) + bq[:, None, :]
        kh = torch.einsum("td,gde->gte", x, k32) + bk[:, None, :]
        logits = qh @ kh[kv_of].mT                                      # [H, T, T]
        # converted: x~ = x A + b_Q (flattened), W_K' = A^{-1} W_K
        a = stack_queries(q32)                                          # [d_model, d_model]
        bq_flat = bq.reshape(-1)                                        # [d_model]
        k_stack = k32.permute(1, 0, 2).reshape(d_model, n_kv * d_head)  # [d_model, n_kv*d_head]
        k_new = torch.linalg.solve(a, k_stack)                          # A^{-1} W_K
        k_new = k_new.view(d_model, n_kv, d_head).permute(1, 0, 2)       # [n_kv, d_model, d_head]
        bk_new = bk - torch.einsum("d,gde->ge", bq_flat, k_new)
        xt = x @ a + bq_flat                                            # [T, d_model]
        qt = xt.view(tokens, n_heads, d_head).permute(1, 0, 2)          # identity slices, [H, T, d_head]
        kt = torch.einsum("td,gde->gte", xt, k_new) + bk_new[:, None, :]
        logits_new = qt @ kt[kv_of].mT
        scale = logits.abs().max()
        return float((logits_new - logits).abs().max() / scale) if scale > 0 else float("nan")
