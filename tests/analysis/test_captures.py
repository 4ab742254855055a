"""analysis.captures: caches, logits and attention maps of one layer against float64 references
written from the formulas; token windows and fitted images with known answers."""
from __future__ import annotations

import pytest
import torch

from analysis.captures import MAX_WINDOW, capture_layer, causal_softmax, fit_images, fits, sample_windows
from loaders.canonical import AttentionWeights

H, G, D, E, T = 4, 2, 16, 4, 7


def layer(*, identity=False, bias=True, seed=0) -> AttentionWeights:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)          # noqa: E731
    return AttentionWeights(layer=3, W_Q=None if identity else r(H, D, E), W_K=r(G, D, E), W_V=r(G, D, E),
                            W_O=r(H, E, D), b_Q=r(H, E) if bias else None, b_K=r(G, E) if bias else None,
                            b_V=r(G, E) if bias else None)


def reference(x: torch.Tensor, lw: AttentionWeights, scale: float):
    """Per head, in float64 and plain loops: K_g = x W_K[g] + b_K[g], Q_h, L_h = Q_h K_{h // 2}^T,
    A_h = softmax over the columns j <= t of row t of scale * L_h."""
    x = x.double()
    k = torch.stack([x @ lw.W_K[g].double() + lw.b_K[g].double() for g in range(G)])
    v = torch.stack([x @ lw.W_V[g].double() + lw.b_V[g].double() for g in range(G)])
    if lw.W_Q is None:
        q = torch.stack([x[:, h * E:(h + 1) * E] for h in range(H)])
    else:
        q = torch.stack([x @ lw.W_Q[h].double() for h in range(H)])
    if lw.b_Q is not None:
        q = q + lw.b_Q.double()[:, None, :]
    logits = torch.stack([q[h] @ k[h // (H // G)].T for h in range(H)])
    attn = torch.zeros_like(logits)
    for h in range(H):
        for t in range(T):
            row = torch.exp(scale * logits[h, t, :t + 1] - (scale * logits[h, t, :t + 1]).max())
            attn[h, t, :t + 1] = row / row.sum()
    return k, v, logits, attn


@pytest.mark.parametrize("identity", [False, True])
def test_capture_layer_matches_the_formulas(identity):
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(1))
    lw = layer(identity=identity, bias=True)
    if identity:
        lw.b_Q = None
    got = capture_layer(x, lw, n_heads=H, n_kv_heads=G, d_head=E, attn_scale=0.5, logits=True)
    k, v, logits, attn = reference(x, lw, 0.5)
    assert got.layer == 3 and got.k.shape == (G, T, E) and got.logits.shape == (H, T, T)
    for a, b in ((got.k, k), (got.v, v), (got.logits, logits), (got.attn, attn)):
        torch.testing.assert_close(a.double(), b, atol=1e-4, rtol=1e-4)


def test_rotated_maps_and_the_models_own_maps():
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(2))
    lw = layer()
    flip = lambda t: torch.flip(t, dims=[-1])            # noqa: E731 -- any map of [n, T, e] will do
    got = capture_layer(x, lw, n_heads=H, n_kv_heads=G, d_head=E, attn_scale=0.25, logits=False, rotate=flip)
    k, _, _, _ = reference(x, lw, 0.25)
    q = torch.stack([x.double() @ lw.W_Q[h].double() + lw.b_Q[h].double() for h in range(H)])
    rot = torch.stack([flip(q[h]) @ flip(k[h // 2]).T for h in range(H)])
    assert got.logits is None
    torch.testing.assert_close(got.attn.double(), causal_softmax(0.25 * rot), atol=1e-5, rtol=1e-4)
    own = torch.rand(H, T, T)
    kept = capture_layer(x, lw, n_heads=H, n_kv_heads=G, d_head=E, attn_scale=1.0, logits=False, model_attn=own)
    assert kept.logits is None and torch.equal(kept.attn, own)
    neither = capture_layer(x, lw, n_heads=H, n_kv_heads=G, d_head=E, attn_scale=1.0, logits=False)
    assert neither.logits is None and neither.attn is None


def test_causal_softmax():
    a = causal_softmax(torch.zeros(2, 3, 3))
    assert torch.equal(a[0], torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3]]))


def test_sample_windows_spread_evenly():
    ids = torch.arange(100)
    w = sample_windows(ids, context=10, n_tokens=35)                    # ceil(35 / 10) = 4 windows of 10
    assert w.tolist() == [list(range(s, s + 10)) for s in (0, 30, 60, 90)]
    assert sample_windows(ids, context=10, n_tokens=10_000).shape == (10, 10)   # at most N // T
    assert sample_windows(torch.arange(5), context=10, n_tokens=3).tolist() == [[0, 1, 2, 3, 4]]
    assert sample_windows(torch.arange(2000), context=10_000, n_tokens=600).shape == (2, MAX_WINDOW)


def test_fit_images():
    grey = torch.arange(4.0).reshape(1, 1, 2, 2)
    same = fit_images(grey, 2, 3)
    assert same.shape == (1, 3, 2, 2) and all(torch.equal(same[0, c], grey[0, 0]) for c in range(3))
    flat = fit_images(torch.full((2, 1, 3, 3), 7.0), 8, 1)
    assert flat.shape == (2, 1, 8, 8) and torch.equal(flat, torch.full((2, 1, 8, 8), 7.0))
    up = fit_images(torch.tensor([[[[0.0, 4.0]]]]).expand(1, 1, 2, 2), 4, 1)   # bilinear, align_corners=False
    assert up[0, 0, 0].tolist() == [0.0, 1.0, 3.0, 4.0]
    rgb = torch.stack([torch.zeros(2, 2), torch.ones(2, 2), 2 * torch.ones(2, 2)])[None]
    assert torch.equal(fit_images(rgb, 2, 1), torch.ones(1, 1, 2, 2))
    assert fits(1, 3) and fits(3, 1) and fits(3, 3) and not fits(2, 3)
    with pytest.raises(ValueError, match="images of 2 channels do not fit a model of 3"):
        fit_images(torch.zeros(1, 2, 4, 4), 4, 3)
