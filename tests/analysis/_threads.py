"""``one_thread``: a module-scoped fixture that runs a test module's torch code on one thread.

``tests/conftest.py`` sets two torch threads. On a busy two-core machine (CI runs two pytest-xdist
workers on it) batched float64 eigen-decompositions of ``[.., 128, 128]`` Gram stacks on two threads
took 10-400x longer than on one (0.15 s on one thread, 7.8-66 s on two, for 84 of them, load
average 12-16; the threads spin waiting for each other). Import it into a test module to use it.
"""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
