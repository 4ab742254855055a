"""app.attention_view: max-pooled maps keep their spikes and name the token pair; a grid of heads on one scale."""
from __future__ import annotations

import numpy as np
import pytest

from app.attention_view import GRID_BINS, LARGE_BINS, grid_figure, head_figure, pool_max, shared_max


def test_pool_max_known_answer_and_argmax_pair():
    w = np.arange(36, dtype=np.float32).reshape(6, 6) / 100
    w[1, 4] = 0.99                                    # a spike inside block (0, 2)
    z, q, k = pool_max(w, 3)                          # s = 2: blocks of 2 x 2
    assert z.shape == (3, 3)
    ref = w.reshape(3, 2, 3, 2).max(axis=(1, 3))
    np.testing.assert_array_equal(z, ref)
    assert (q[0, 2], k[0, 2]) == (1, 4) and z[0, 2] == pytest.approx(0.99)
    assert (q[2, 2], k[2, 2]) == (5, 5)
    np.testing.assert_array_equal(w[q, k], z)          # each cell's pair holds its value


def test_pool_max_small_map_is_unchanged_and_ragged_edges_pad():
    w = np.random.default_rng(0).random((5, 5)).astype(np.float32)
    z, q, k = pool_max(w, 8)
    np.testing.assert_array_equal(z, w)
    np.testing.assert_array_equal(q, np.repeat(np.arange(5)[:, None], 5, 1))
    z, q, k = pool_max(w, 2)                          # s = 3: last block is 2 wide, padding never wins
    assert z.shape == (2, 2) and z[1, 1] == w[3:, 3:].max() and q.max() <= 4 and k.max() <= 4


def test_grid_of_all_heads_on_one_scale_and_enlarged_head_at_2048_tokens():
    t, heads = 2048, 6
    rng = np.random.default_rng(1)
    maps = np.tril(rng.random((heads, t, t), dtype=np.float32))
    maps /= maps.sum(-1, keepdims=True)               # causal softmax-like rows
    maps[3, 1500, 7] = 0.9                            # one sharp spike in head 3
    tokens = [f"t{i}" for i in range(t)]
    fig = grid_figure(maps, tokens, layer=2, selected=3)
    assert [tr.name for tr in fig.data] == [f"L2H{h}" for h in range(heads)]
    assert all(np.asarray(tr.z).shape == (GRID_BINS, GRID_BINS) for tr in fig.data)
    assert fig.layout.coloraxis.cmin == 0 and fig.layout.coloraxis.cmax == pytest.approx(shared_max(maps))
    assert all(tr.coloraxis == "coloraxis" for tr in fig.data)     # one shared colour scale
    assert len(fig.layout.shapes) == 1                            # the enlarged head is outlined
    spike = np.asarray(fig.data[3].z)
    s = -(-t // GRID_BINS)                                        # ceil(2048 / 48) = 43 tokens a block
    i, j = 1500 // s, 7 // s
    assert spike[i, j] == pytest.approx(0.9)                      # max-pooling keeps the spike
    assert list(fig.data[3].customdata[i][j]) == ["1500 't1500'", "7 't7'"]   # hover names the token pair
    big = head_figure(maps[3], tokens, title="L2H3", zmax=shared_max(maps))
    assert np.asarray(big.data[0].z).shape == (LARGE_BINS, LARGE_BINS)
    assert "block max at query" in big.data[0].hovertemplate
    assert big.layout.title.text == "L2H3" and "blocks of 16 tokens" in big.layout.xaxis.title.text
