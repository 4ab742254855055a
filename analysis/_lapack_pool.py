"""Stacks of small LAPACK problems on the host, one problem per core.

torch's CPU ``linalg.eigh``/``eigvalsh``/``svdvals`` of a stack ``[b, n, n]`` solve
the ``b`` problems one after another, and MKL spreads each ``n x n`` problem (a
``d_head x d_head`` Gram: ``n`` 64-128) over every intra-op thread. At that size
the threads mostly wait for each other: one Llama-2-7B-shaped layer's
``[32, 128, 128]`` ``eigh`` took 36.9 ms with 16 threads on a 16-core host (an
H200 machine), and 5.65 ms split as below (``eigvalsh`` 28.5 -> 2.93 ms,
``svdvals`` of ``[32, 512, 128]`` 54.5 -> 7.30 ms). ``pooled`` instead splits the stack into one slice per thread and solves the
slices side by side in worker threads that each run a single-threaded MKL:
a worker that finds torch's intra-op count above 1 sets it to 1
(``torch.set_num_threads`` in a thread sets that thread's OpenMP and MKL counts,
ATen's ``set_num_threads``: ``mkl_set_num_threads_local``). Each problem is the
same LAPACK call either way; ``scripts/layer_profile.py`` times both side by
side (``--pool``).

What it is for: the CUDA path, whose small decompositions run on the host
(``analysis._linalg.HOST_SMALL``) of a many-core machine. There one Llama-2-7B-shaped
layer's ``weight_metrics`` took 0.241 s against 0.421 s as one torch call per stack.
On a CPU device the layer's larger products dominate and it gains little (a whole
``analyze`` of the 1.1B shape on a 2-core host: 0.94 of the time without it;
docs/performance.md, "Speed mechanisms").

``torch.set_num_threads`` also stores the count as the default of threads that
start later, so the caller's count is set again before ``pooled`` returns (the
one global side effect, and only after a worker's first call; calls are
serialised by a lock). A forked child starts its own workers.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

#: Whether ``pooled`` splits stacks across threads (off: one torch call, MKL's own threading).
POOL = True
#: The fewest problems in a stack worth splitting.
MIN_BATCH = 2

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_workers = 0
#: Whether a worker has set its count since the caller's was last restored.
_dirty = False


def _after_fork() -> None:
    """A forked child has none of the parent's worker threads (its executor would wait
    forever) and may inherit the lock held: start both afresh."""
    global _lock, _executor, _workers, _dirty
    _lock, _executor, _workers, _dirty = threading.Lock(), None, 0, False


os.register_at_fork(after_in_child=_after_fork)


def _single_threaded(f, *args):
    """``f(*args)`` in a worker thread with torch's intra-op count (OpenMP, MKL) at 1."""
    global _dirty
    if torch.get_num_threads() != 1:
        _dirty = True
        torch.set_num_threads(1)
    return f(*args)


def _pool(workers: int) -> ThreadPoolExecutor:
    global _executor, _workers
    if _executor is None or _workers < workers:
        if _executor is not None:
            _executor.shutdown(wait=False)
        _executor = ThreadPoolExecutor(workers, thread_name_prefix="qkvscope-lapack")
        _workers = workers
    return _executor


def workers_for(batch: int) -> int:
    """Threads ``pooled`` would use for a stack of ``batch`` problems (1: one plain call)."""
    threads = torch.get_num_threads()
    if not POOL or threads < 2 or batch < MIN_BATCH:
        return 1
    return min(threads, batch)


def _in_workers(workers: int, tasks: list[tuple]) -> list:
    """``f(*args)`` of each task ``(f, *args)`` in a single-threaded worker (``_single_threaded``)
    of a pool of ``workers`` threads; the results in order. Calls are serialised by the lock;
    the caller's intra-op count is set again before it returns (module docstring); every task
    has ended before an error reaches the caller."""
    global _dirty
    with _lock:
        threads = torch.get_num_threads()
        futures = [_pool(workers).submit(_single_threaded, *task) for task in tasks]
        try:
            return [fut.result() for fut in futures]
        finally:
            for fut in futures:                                       # none left running on an error
                fut.exception()
            if _dirty:
                torch.set_num_threads(threads)                        # the process default, as it was
                _dirty = False


def pooled(f, *xs: torch.Tensor):
    """``f(*xs)`` for CPU stacks ``xs`` of small matrices ``[..., m, n]`` (same leading
    shape), computed as ``f`` of slices of the flattened stack ``[b, m, n]`` in parallel
    threads and joined back to ``[..., ...]``. ``f`` returns a tensor or a tuple of
    tensors whose leading axis is the stack's; each problem is ``f``'s own LAPACK call."""
    lead = xs[0].shape[:-2]
    batch = lead.numel()
    workers = workers_for(batch)
    if workers == 1:
        return f(*xs)
    flat = [x.reshape(batch, *x.shape[-2:]) for x in xs]             # [..., m, n] -> [b, m, n]
    bounds = [batch * i // workers for i in range(workers + 1)]
    parts = _in_workers(workers, [(f, *(x[lo:hi] for x in flat)) for lo, hi in zip(bounds, bounds[1:])])
    if isinstance(parts[0], tuple):
        return tuple(torch.cat(p).reshape(*lead, *p[0].shape[1:]) for p in zip(*parts))
    return torch.cat(parts).reshape(*lead, *parts[0].shape[1:])
