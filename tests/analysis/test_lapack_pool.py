"""analysis._lapack_pool: stacks of small decompositions split across single-threaded workers
give the same values as one torch call, and leave the caller's thread count as it was."""
from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest
import torch

from analysis import _lapack_pool
from analysis.weights import weight_metrics

from .test_metrics import _layer, _meta


@pytest.fixture
def four_threads():
    # more threads than this machine may have: the split is what is tested, not the speed
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield 4
    torch.set_num_threads(before)


def _count_of_a_new_thread() -> int:
    """torch's intra-op count in a thread started now (the default ``set_num_threads`` stores)."""
    later = []
    t = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
    t.start()
    t.join()
    return later[0]


def _stack(*lead, rows=24, n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(*lead, rows, n, generator=g, dtype=torch.float64)
    return a, a.mT @ a                                                # [..., rows, n], [..., n, n]


@pytest.mark.parametrize("lead", [(7,), (3, 5), (2,), (1,), ()])
def test_pooled_decompositions_equal_one_call(four_threads, lead):
    a, g = _stack(*lead)
    lam, u = _lapack_pool.pooled(torch.linalg.eigh, g)
    want_lam, want_u = torch.linalg.eigh(g)
    assert lam.shape == want_lam.shape and u.shape == want_u.shape
    torch.testing.assert_close(lam, want_lam, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(u.abs(), want_u.abs(), rtol=1e-9, atol=1e-9)   # each vector up to its sign
    torch.testing.assert_close(_lapack_pool.pooled(torch.linalg.eigvalsh, g), want_lam, rtol=1e-12, atol=1e-12)
    sv = _lapack_pool.pooled(torch.linalg.svdvals, a)                # [..., 24, 6]: not square
    torch.testing.assert_close(sv, torch.linalg.svdvals(a), rtol=1e-12, atol=1e-12)


def test_workers_split_the_stack_and_run_single_threaded(four_threads):
    seen = []

    def f(x):
        seen.append((threading.current_thread().name, x.shape[0], torch.get_num_threads()))
        return x.sum((-1, -2))

    _, g = _stack(10)
    torch.testing.assert_close(_lapack_pool.pooled(f, g), g.sum((-1, -2)))
    assert sorted(n for _, n, _ in seen) == [2, 2, 3, 3]              # 10 problems over 4 workers
    assert all(name.startswith("qkvscope-lapack") and threads == 1 for name, _, threads in seen), seen


def test_the_callers_thread_count_and_the_default_of_new_threads_stay(four_threads):
    _lapack_pool._executor = None                                     # fresh workers: each sets its count now
    _lapack_pool.pooled(torch.linalg.eigvalsh, _stack(8)[1])
    assert torch.get_num_threads() == 4
    assert _count_of_a_new_thread() == 4                              # not the workers' 1


def test_an_error_in_a_worker_reaches_the_caller_and_the_count_is_restored(four_threads):
    _lapack_pool._executor = None

    def f(x):
        if x.shape[0] == 3:
            raise ValueError("bad slice")
        return x

    with pytest.raises(ValueError, match="bad slice"):
        _lapack_pool.pooled(f, _stack(10)[1])                         # slices of 2, 3, 2, 3
    torch.testing.assert_close(_lapack_pool.pooled(f, _stack(8)[1]), _stack(8)[1])   # 2, 2, 2, 2: no error
    assert _count_of_a_new_thread() == 4 and not _lapack_pool._dirty


def test_off_or_one_thread_or_one_problem_is_one_plain_call(four_threads, monkeypatch):
    calls = []

    def f(x):
        calls.append(threading.current_thread().name)
        return x

    g = _stack(6)[1]
    _lapack_pool.pooled(f, g[:1])
    monkeypatch.setattr(_lapack_pool, "POOL", False)
    _lapack_pool.pooled(f, g)
    monkeypatch.setattr(_lapack_pool, "POOL", True)
    torch.set_num_threads(1)
    _lapack_pool.pooled(f, g)
    assert calls == [threading.current_thread().name] * 3


def _tag(x):
    return x + 1


def _child(q):
    # no LAPACK here: GNU OpenMP itself does not survive a fork once the parent has used its
    # threads (torch's own matmul hangs in such a child); the pool's part is what is tested
    torch.set_num_threads(2)                                          # a forked child starts at 1
    assert _lapack_pool.workers_for(6) == 2
    q.put(int(_lapack_pool.pooled(_tag, torch.zeros(6, 2, 2)).sum()))


def test_a_forked_child_starts_its_own_workers(four_threads):
    # the parent's worker threads do not exist in a forked child: an inherited executor waits forever
    _lapack_pool.pooled(_tag, torch.zeros(6, 2, 2))
    assert _lapack_pool._executor is not None
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q,))
    p.start()
    p.join(30)
    if p.is_alive():
        p.kill()
        pytest.fail("the forked child's pooled call hung")
    assert p.exitcode == 0 and q.get(timeout=5) == 24


def test_weight_rows_are_the_same_pooled_or_not(four_threads, monkeypatch):
    rows = {}
    for pool in (True, False):
        monkeypatch.setattr(_lapack_pool, "POOL", pool)
        rows[pool], _ = weight_metrics(_layer(), _meta(norm="none"), device="cpu")
    assert rows[True][["layer", "head", "metric"]].equals(rows[False][["layer", "head", "metric"]])
    np.testing.assert_allclose(rows[True]["value"].to_numpy(), rows[False]["value"].to_numpy(),
                               rtol=1e-9, atol=1e-12)
