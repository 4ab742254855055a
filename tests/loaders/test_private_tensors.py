"""loaders.private_tensors: a view that covers all of a tensor read for one call alone is
handed out as it is, once; anything else is copied by the converters."""
from __future__ import annotations

import gc

import torch

from loaders.layouts._common import fresh, rows_to_heads
from loaders.private_tensors import _private, claim, private


def test_a_whole_view_is_claimed_once():
    t = private(torch.arange(24, dtype=torch.float32).reshape(6, 4))
    view = t.reshape(2, 3, 4).transpose(1, 2)                        # all 24 values, another layout
    assert claim(view)
    assert not claim(t)                                               # a second view of the same memory: copied
    assert fresh(t).data_ptr() != t.data_ptr()


def test_a_part_or_an_unmarked_tensor_is_not_claimed():
    t = private(torch.zeros(8, 4))
    assert not claim(t[:4])                                           # half of it (a fused QKV's slice)
    assert claim(t)                                                   # still private: the slice took nothing
    u = torch.zeros(8, 4)
    assert not claim(u) and fresh(u).data_ptr() != u.data_ptr()


def test_the_mark_goes_with_the_tensor():
    t = private(torch.zeros(16, 16))
    ptr = t.untyped_storage().data_ptr()
    assert ptr in _private
    del t
    gc.collect()
    assert ptr not in _private                                        # memory reused at that address is not private


def test_converters_hand_out_a_private_read_without_copying_it():
    w = private(torch.randn(4 * 8, 16).to(torch.bfloat16))             # a Linear [n*d_head, d_model]
    heads = rows_to_heads(w, 4, 8)                                     # [4, 16, 8], the view
    assert heads.data_ptr() == w.data_ptr() and heads.shape == (4, 16, 8)
    torch.testing.assert_close(heads, w.reshape(4, 8, 16).transpose(1, 2))
    again = rows_to_heads(w, 4, 8)                                     # the same memory asked for twice
    assert again.data_ptr() != w.data_ptr()
