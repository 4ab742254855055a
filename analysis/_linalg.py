"""Small batched linear-algebra helpers shared by the metric modules.

Everything here works on stacks of per-head matrices, ``[..., rows, d_head]``,
and never forms a ``rows x rows`` matrix: a tall matrix's singular values come
from its ``d_head x d_head`` Gram matrix (``sigma_i^2 = eig_i(A^T A)``).

Precision: the weights and caches arrive as float32 (or narrower) data, and
every Gram is accumulated in float64 from that data (``gram``; a product of two
float32 numbers is exact in float64, so only the summation rounds, at
``~eps64 * lambda_max``). The eigen-decompositions are float64 too. An
eigenvalue is "unresolved", and set to 0, below ``n * eps * lambda_max`` with
``eps`` the machine epsilon of the Gram's own dtype (``eps64`` for the Grams
formed here; ``eps32`` if a caller passes float32 products): singular values
down to ``~1e-7 sigma_max`` (condition numbers to ``~1e7``) are kept. A float32
Gram would lose everything below ``~2e-3 sigma_max`` at d_head 64.
"""
from __future__ import annotations

import torch

from analysis._lapack_pool import pooled

#: Machine epsilon of float32 (the data, and the fast LU of ``query_absorb``).
EPS32 = float(torch.finfo(torch.float32).eps)
#: Machine epsilon of float64 (every Gram and decomposition here).
EPS64 = float(torch.finfo(torch.float64).eps)

#: Largest number of elements converted to float64 at once by ``gram``/``row_gram`` and the
#: other chunked products (4 MiB of float64): bounds the extra memory on large models, and
#: keeps each copy small enough that the allocator reuses its memory; 64 MiB chunks were
#: fresh pages every time (page faults), and the Grams of a Llama-2-7B layer 2.8x slower.
CHUNK = 1 << 19


#: Whether stacks of small matrices on CUDA (``n <= HOST_MAX_N``: the ``d_head x d_head``
#: Grams and products) are eigen-decomposed and SVD'd on the host (``small_eigvalsh``,
#: ``small_eigh``, ``small_svdvals``): cuSOLVER solves such a batch as a few milliseconds of
#: latency-bound kernels with a sync, and a layer has dozens of batches. One Llama-2-7B-shaped
#: layer on an H200: 0.241 s on the host (one problem per core) against 0.486 s on the GPU
#: (``scripts/layer_profile.py --pool`` times both side by side; ``bench/analysis_speed.py
#: --device-eig`` runs the GPU choice).
#: The values are the same float64 problems either way.
HOST_SMALL = True
#: The largest ``n`` that ``HOST_SMALL`` sends to the host.
HOST_MAX_N = 512


def _on_host(t: torch.Tensor) -> bool:
    """Whether the small decompositions of ``t`` run on the host: a CPU tensor, or a CUDA
    stack of small matrices under ``HOST_SMALL``."""
    return t.device.type == "cpu" or (HOST_SMALL and t.is_cuda and t.shape[-1] <= HOST_MAX_N)


def _small(f, a: torch.Tensor):
    """``f`` (a ``torch.linalg`` decomposition of stacks) of ``a``: on the host, the stack's
    problems spread over the host's cores (``_lapack_pool.pooled``), for a CPU tensor or a
    small CUDA stack under ``HOST_SMALL``; else on ``a``'s device. Results on ``a``'s device."""
    if not _on_host(a):
        return f(a)
    out = pooled(f, a.cpu())
    return tuple(t.to(a.device) for t in out) if isinstance(out, tuple) else out.to(a.device)


def small_eigvalsh(g: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.eigvalsh`` of a stack ``[..., n, n]`` (ascending), as ``_small``."""
    return _small(torch.linalg.eigvalsh, g)


def gram_sv(gram: torch.Tensor) -> torch.Tensor:
    """Singular values (descending) of the matrix behind a float64 Gram ``[..., e, e]``;
    eigenvalues below ``e * eps64 * lambda_max`` (round-off) are 0. ``eigvalsh`` reads the lower
    triangle: a Gram formed by products is symmetric to round-off (``~e * eps64 * ||G||``, below
    that tolerance), so it is not symmetrised first (a copy of every stack, ~10% of a jackknife)."""
    lam = small_eigvalsh(gram).flip(-1)                                # [..., e], descending
    tol = gram.shape[-1] * EPS64 * lam[..., :1].clamp_min(0)
    return torch.where(lam > tol, lam, torch.zeros_like(lam)).sqrt()


def small_eigh(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.linalg.eigh`` of a stack ``[..., n, n]`` (ascending), as ``_small``."""
    return tuple(_small(torch.linalg.eigh, g))


def small_svdvals(a: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.svdvals`` of a stack ``[..., m, n]``, as ``_small``."""
    return _small(torch.linalg.svdvals, a)


def as_float32(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A float32 copy-or-view of ``t`` on ``device``; callers never write into it.

    A narrower host tensor bound for a GPU crosses in its own dtype and widens there: half
    the bytes of a bfloat16 checkpoint over the bus and no conversion on the host (one
    ``to(device, float32)`` widens on the host first). Widening is exact, so the values
    are the same either way."""
    t = t.detach()
    dev = torch.device(device)
    if dev.type != "cpu" and t.device.type == "cpu" and t.element_size() < 4 and t.is_floating_point():
        return t.to(dev).to(torch.float32)                            # strides kept (preserve_format)
    return t.to(device=dev, dtype=torch.float32)


def stack_heads(a: torch.Tensor) -> torch.Tensor:
    """``[heads, rows, d_head] -> [rows, heads*d_head]`` (head-major columns), float32,
    stored column-major (``A^T`` contiguous).

    The loaders hand out ``W_Q``/``W_K``/``W_V`` with each head's matrix stored
    transposed (an ``nn.Linear`` weight's rows, ``loaders/layouts/_common.py``):
    then this is a view, and LAPACK's LU and BLAS products read it in place;
    any other layout costs one copy.
    """
    heads, rows, d_head = a.shape
    return a.float().mT.reshape(heads * d_head, rows).mT         # [heads*d_head, rows] -> [rows, heads*d_head]


def sum_groups(a: torch.Tensor, groups: int) -> torch.Tensor:
    """Sum of consecutive blocks of ``heads / groups`` matrices of ``a: [heads, m, n]``
    -> ``[groups, m, n]``, reduced in ``a``'s own memory order (a reduction whose
    output strides cross the input's runs 10x slower)."""
    heads, m, n = a.shape
    if a.stride(-2) == 1 and a.stride(-1) != 1:                  # each matrix stored transposed
        return a.mT.reshape(groups, heads // groups, n, m).sum(1).mT
    return a.reshape(groups, heads // groups, m, n).sum(1)


def f64_chunks(a: torch.Tensor, per: int):
    """Float64 copies of ``a``'s leading-axis chunks of ``per`` (``[per, ...]``; the last may be
    shorter), one at a time, written into one reused buffer with ``a``'s strides (a
    transposed layout stays one BLAS call per chunk). A chunk is valid until the next is
    asked for: callers keep what they compute from it, never the chunk itself."""
    buf = None
    for c in a.split(per):
        if buf is None or buf.shape != c.shape:
            buf = torch.empty_like(c, dtype=torch.float64)       # [per, ...], c's stride order
        buf.copy_(c)
        yield buf


def _per(a: torch.Tensor) -> int:
    """Leading-axis entries of ``a`` per chunk: at most ``CHUNK`` elements, at least one."""
    return max(1, CHUNK // max(1, a[0].numel()))


def _chunked(a: torch.Tensor, f) -> torch.Tensor:
    """``f`` of float64 copies of ``a``'s leading-axis chunks (at most ``CHUNK`` elements
    each, ``f64_chunks``), concatenated."""
    if a.dim() < 3:
        return f(a.double())
    return torch.cat([f(c) for c in f64_chunks(a, _per(a))])


def gram(a: torch.Tensor) -> torch.Tensor:
    """``A^T A`` in float64 for a stack ``[..., rows, n]`` -> ``[..., n, n]`` (any input dtype)."""
    return _chunked(a, lambda x: x.mT @ x)


def row_gram(a: torch.Tensor) -> torch.Tensor:
    """``A A^T`` in float64 for a stack ``[..., n, cols]`` -> ``[..., n, n]`` (e.g. W_O)."""
    return _chunked(a, lambda x: x @ x.mT)


def grams_and_cross(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(A^T A, B^T B, A^T B)`` in float64 for stacks ``[heads, rows, n]`` of one shape, each
    chunk of ``a`` and ``b`` converted once for all three."""
    if a.dim() < 3:
        a, b = a.unsqueeze(0), b.unsqueeze(0)
        return tuple(t.squeeze(0) for t in grams_and_cross(a, b))
    aa, bb, ab = [], [], []
    for x, y in zip(f64_chunks(a, _per(a)), f64_chunks(b, _per(a))):
        aa.append(x.mT @ x)
        bb.append(y.mT @ y)
        ab.append(x.mT @ y)
    return torch.cat(aa), torch.cat(bb), torch.cat(ab)


def _tolerance(g: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """``n * eps * lambda_max`` with ``eps`` of ``g``'s dtype (float64 unless a caller
    passed float32 products): the eigenvalues that products of that precision resolve."""
    eps = EPS32 if g.dtype in (torch.float32, torch.float16, torch.bfloat16) else EPS64
    return g.shape[-1] * eps * top


def gram_eigvals(g: torch.Tensor) -> torch.Tensor:
    """Eigenvalues (descending, float64, >= 0) of symmetric PSD stacks ``[..., n, n]``,
    those below ``n * eps * lambda_max`` (``_tolerance``) set to 0."""
    g64 = g.to(torch.float64)
    g64 = (g64 + g64.mT) / 2
    lam = small_eigvalsh(g64).flip(-1)  # [..., n], descending
    tol = _tolerance(g, lam[..., :1].clamp_min(0))
    return torch.where(lam > tol, lam, torch.zeros_like(lam))


def singular_values(a: torch.Tensor) -> torch.Tensor:
    """Singular values (descending, float64) of a tall stack ``[..., rows, n]``, rows >= n,
    as ``sqrt(eig(A^T A))`` with the Gram in float64."""
    return gram_eigvals(gram(a)).sqrt()


def clean_eigh(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigen-decomposition (float64, ascending) of symmetric PSD stacks ``[..., n, n]``
    (float64 or float32 products), with the unresolved eigenvalues (below
    ``n * eps * lambda_max``, as in ``gram_eigvals``) set to 0: ``(lam, U)``."""
    g64 = g.to(torch.float64)
    g64 = (g64 + g64.mT) / 2
    lam, u = small_eigh(g64)                             # [..., n], [..., n, n]
    tol = _tolerance(g, lam[..., -1:].clamp_min(0))
    lam = torch.where(lam > tol, lam, torch.zeros_like(lam))
    return lam, u


def psd_sqrt(g: torch.Tensor) -> torch.Tensor:
    """Symmetric square root ``G^{1/2}`` (float64) of PSD stacks ``[..., n, n]``.

    If ``A = W S`` is the polar decomposition of ``A`` (``W`` a partial isometry),
    ``S = (A^T A)^{1/2}``; so for ``M = A B^T``, ``sv(M) = sv(S_A S_B)``.
    """
    return psd_sqrt_from(clean_eigh(g))


def psd_sqrt_from(eig: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """``G^{1/2} = U diag(sqrt(lam)) U^T`` from ``clean_eigh(G)``."""
    lam, u = eig
    return (u * lam.sqrt().unsqueeze(-2)) @ u.mT


def spectrum_stats(sv: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rank summaries of singular values ``sv`` ``[..., n]`` (any order, >= 0).

    * ``erank`` (Roy & Vetterli 2007, "The effective rank: a measure of effective
      dimensionality"): ``p_i = sigma_i / sum_j sigma_j``,
      ``erank = exp(-sum_i p_i log p_i)`` (``0 log 0 = 0``).
    * ``stable_rank`` = ``||A||_F^2 / ||A||_2^2 = sum sigma_i^2 / max sigma_i^2``.
    * ``energy_rank90`` / ``energy_rank99``: the smallest ``k`` whose top-``k``
      singular values hold 90% / 99% of ``sum sigma_i^2``.

    All are NaN for an all-zero matrix (undefined, not 0).
    """
    s = sv.to(torch.float64).sort(dim=-1, descending=True).values
    total = s.sum(-1, keepdim=True)
    p = s / total
    ent = -(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum(-1)
    erank = ent.exp()
    energy = s.square()
    e_total = energy.sum(-1, keepdim=True)
    stable = e_total.squeeze(-1) / energy[..., 0]
    frac = energy.cumsum(-1) / e_total
    out = {"erank": erank, "stable_rank": stable}
    for pct, name in ((0.90, "energy_rank90"), (0.99, "energy_rank99")):
        # count of prefixes still below the threshold, +1; tolerance for round-off
        k = (frac < pct - 1e-12).sum(-1).to(torch.float64) + 1
        out[name] = k
    nan = torch.full_like(erank, float("nan"))
    zero = total.squeeze(-1) <= 0
    return {k: torch.where(zero, nan, v) for k, v in out.items()}


def identity_queries(n_heads: int, d_model: int, d_head: int,
                     device: torch.device | str) -> torch.Tensor:
    """The query-free model's W_Q: head h reads ``x[:, h*d_head:(h+1)*d_head]``.

    Returns ``[n_heads, d_model, d_head]`` with ``E_h[h*d_head + i, i] = 1``.
    Needs ``n_heads * d_head == d_model`` (the caller checks and explains).
    """
    eye = torch.eye(d_model, dtype=torch.float32, device=device)   # [d_model, d_model]
    return eye.view(d_model, n_heads, d_head).permute(1, 0, 2).contiguous()  # [n_heads, d_model, d_head]


def kv_index(n_heads: int, n_kv_heads: int, device: torch.device | str) -> torch.Tensor:
    """kv head of each query head: ``h // (n_heads // n_kv_heads)`` (GQA/MQA)."""
    group = n_heads // n_kv_heads
    return torch.arange(n_heads, device=device) // group
