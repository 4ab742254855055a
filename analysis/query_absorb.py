"""Can W_Q be absorbed into the residual stream? (query-free attention, arXiv 2510.23912)

Stack a layer's query heads: ``A = [W_Q[0] | ... | W_Q[H-1]]``,
``[d_model, n_heads*d_head]``. If ``A`` is square and invertible, the change of
basis ``x~ = x A`` makes head ``h``'s query the identity slice
``x~[:, h*d_head:(h+1)*d_head]``, and keys keep their values with
``W_K' = A^{-1} W_K`` (``b_K' = b_K - b_Q A^{-1} W_K`` when ``x~ = x A + b_Q``).

* ``condition`` = ``sigma_max(A) / sigma_min(A)`` (inf when singular).
* ``orth_defect``: a change of basis commutes with RMSNorm/LayerNorm only when
  it is a scaled orthogonal matrix (the obstruction the paper names). With
  ``c = mean_i sigma_i^2``, ``defect = sqrt(mean_i (sigma_i^2 / c - 1)^2)
  = ||A^T A / c - I||_F / sqrt(n)``: 0 for a scaled orthogonal ``A``. Computed
  on ``W_Q`` as stored (norm gains folded in only where the converter did).
* ``absorb_error`` (models without normalisation, where the conversion is
  exact in exact arithmetic): ``max |L~ - L| / max |L|`` over heads and pairs of
  ``tokens`` sample inputs ``x ~ N(0, 1)``, where ``L = (x W_Q[h] + b_Q)(x W_K + b_K)^T``
  and ``L~`` the converted model's logits (float32, ``torch.linalg.solve``):
  how much the conversion loses to round-off and ill-conditioning.

The first two need no SVD of ``A``: see ``condition_and_defect``.
"""
from __future__ import annotations

import torch

from analysis._linalg import kv_index


def stack_queries(q: torch.Tensor) -> torch.Tensor:
    """``[n_heads, d_model, d_head] -> [d_model, n_heads*d_head]`` (head-major columns)."""
    n_heads, d_model, d_head = q.shape
    return q.float().permute(1, 0, 2).reshape(d_model, n_heads * d_head)


def _top_eig(apply, n: int, device, *, steps: int = 80, tol: float = 1e-7, check: int = 4) -> float:
    """Largest eigenvalue of a symmetric PSD operator ``apply: [n] -> [n]`` (float32)
    by Lanczos with full re-orthogonalisation (float64 basis, tridiagonal Ritz values;
    Golub & Van Loan, Matrix Computations, sec. 10.1). Every ``check`` steps it stops
    when the top Ritz value changed by less than ``tol`` relative; at most ``steps``."""
    steps = min(steps, n)
    gen = torch.Generator(device="cpu").manual_seed(0)
    basis = torch.zeros(n, steps + 1, dtype=torch.float64, device=device)   # Lanczos vectors
    v = torch.randn(n, generator=gen, dtype=torch.float64).to(device)
    basis[:, 0] = v / v.norm()
    alphas, betas = [], []
    prev = top = None
    for j in range(steps):
        w = apply(basis[:, j].float()).double()                       # [n]
        alphas.append(float(w @ basis[:, j]))
        vs = basis[:, :j + 1]                                         # [n, j+1]
        w = w - vs @ (vs.mT @ w)
        w = w - vs @ (vs.mT @ w)                                      # twice is enough
        beta = float(w.norm())
        last = j == steps - 1 or beta <= 1e-12 * abs(alphas[0])
        if last or (j + 1) % check == 0:
            t = torch.diag(torch.tensor(alphas, dtype=torch.float64))
            if betas:
                off = torch.tensor(betas, dtype=torch.float64)
                t += torch.diag(off, 1) + torch.diag(off, -1)
            top = float(torch.linalg.eigvalsh(t)[-1])
            if last or (prev is not None and abs(top - prev) <= tol * abs(top)):
                return top
            prev = top
        betas.append(beta)
        basis[:, j + 1] = w / beta
    return top


def condition_and_defect(q: torch.Tensor) -> tuple[float, float]:
    """``(condition, orth_defect)`` of the stacked W_Q (see module docstring).

    No SVD of the ``d_model x d_model`` matrix (the slowest step by far):
    ``sigma_max^2`` is the top eigenvalue of the float32 Gram ``G = A^T A``
    (Lanczos), ``1/sigma_min^2`` the top eigenvalue of
    ``(A^T A)^{-1}``, applied through one LU factorisation of ``A`` (triangular solves; float32;
    relative accuracy ~ eps32 * condition), and
    ``defect = ||G/c - I||_F / sqrt(n)`` with ``c = tr(G)/n``. A non-square
    stack (n_heads*d_head != d_model) falls back to ``svdvals``.
    """
    with torch.inference_mode():
        a = stack_queries(q)                                          # [d_model, n]
        d_model, n = a.shape
        g = a.mT @ a                                                  # [n, n]
        c = torch.diagonal(g).sum() / n
        if c <= 0:
            return float("nan"), float("nan")
        off = g - c * torch.eye(n, device=a.device, dtype=g.dtype)    # G - c I
        defect = float(torch.linalg.matrix_norm(off).double() / c / n ** 0.5)
        if d_model != n:
            sv = torch.linalg.svdvals(a).double()
            return (float(sv[0] / sv[-1]) if sv[-1] > 0 else float("inf")), defect
        _, low, up = torch.linalg.lu(a)                               # A = P L U
        if not bool(torch.diagonal(up).abs().min() > 0):
            return float("inf"), defect
        top = _top_eig(lambda x: g @ x, n, a.device)
        tri = torch.linalg.solve_triangular

        def inv_gram(x):              # A^T A = U^T L^T L U (P cancels): apply U^-1 L^-1 L^-T U^-T
            z = tri(up.mT, x[:, None], upper=False)
            z = tri(low.mT, z, upper=True, unitriangular=True)
            z = tri(low, z, upper=False, unitriangular=True)
            return tri(up, z, upper=True)[:, 0]
        inv_top = _top_eig(inv_gram, n, a.device)
        if not (inv_top > 0 and torch.isfinite(torch.tensor(inv_top))):
            return float("inf"), defect
        return float((top * inv_top) ** 0.5), defect


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
