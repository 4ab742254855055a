"""Pure tensor math on what a forward pass captured: caches, logits and attention maps of
one layer, token windows, images fitted to a model. No model, no file: callers
(``experiments.attention_maps``, ``experiments.activation_runs``) run the model and hand
the tensors here.

Per layer, from the attention input ``x`` ``[T, d_model]`` (already normalised where the
model normalises) and the canonical weights (``W_Q`` ``[H, d_model, d_head]`` or None for
the query-free identity slices, ``W_K``, ``W_V`` ``[G, d_model, d_head]``, biases
``[heads, d_head]`` or None; ``loaders.canonical``), with ``g(h) = h // (H / G)``:

    K_g = x W_K[g] + b_K[g]            [G, T, d_head]  (un-rotated keys)
    V_g = x W_V[g] + b_V[g]            [G, T, d_head]
    Q_h = x W_Q[h] + b_Q[h]            [H, T, d_head]  (x[:, h*d_head:(h+1)*d_head] without W_Q)
    L_h = Q_h K_{g(h)}^T               [H, T, T]  pre-softmax, unscaled, before the mask
    A_h = softmax(mask(s * L_h))       [H, T, T]  causal mask (row t sees columns <= t)

``s`` is the model's ``attn_scale``. With rotary positions ``L_h`` is not the model's
logit: given ``rotate`` (a function applying the model's rotation to ``[n, T, d_head]`` at
positions ``0..T-1``) the map is ``softmax(mask(s * rot(Q_h) rot(K_{g(h)})^T))`` and no
logits are kept; a model's own attention probabilities (``model_attn``, e.g. transformers'
``output_attentions``) replace the computed map.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

#: Longest window fed to a model (its own context caps it further).
MAX_WINDOW = 512


@dataclass
class LayerCapture:
    """What one layer saw on the sample tokens (batch of one)."""

    layer: int
    k: torch.Tensor                     # [n_kv_heads, T, d_head], un-rotated keys
    v: torch.Tensor                     # [n_kv_heads, T, d_head]
    logits: torch.Tensor | None         # [n_heads, T, T], pre-softmax, before the mask, unscaled
    attn: torch.Tensor | None           # [n_heads, T, T], the model's attention probabilities


@dataclass
class Capture:
    tokens: list[str]                   # the sample tokens as text, for plot axes
    tokenizer: str                      # 'tokenizer', 'bytes', 'sampled ids' or a vocabulary's name
    layers: list[LayerCapture]
    logits_reason: str | None = None    # why logits are None, if they are


def _project(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``x [T, d] @ w [n, d, e] + b [n, e]`` -> ``[n, T, e]`` in float32 on ``x``'s device."""
    out = torch.einsum("td,nde->nte", x, w.float().to(x.device))        # [n, T, e]
    if b is not None:
        out = out + b.float().to(x.device)[:, None, :]
    return out


def causal_softmax(scores: torch.Tensor) -> torch.Tensor:
    """``softmax`` over the last axis of ``scores`` ``[..., T, T]`` with column ``j > t`` of row
    ``t`` masked to ``-inf`` (a causal model's attention)."""
    t = scores.shape[-1]
    mask = torch.ones(t, t, dtype=torch.bool, device=scores.device).tril()
    return scores.masked_fill(~mask, float("-inf")).softmax(-1)


def capture_layer(x: torch.Tensor, layer, *, n_heads: int, n_kv_heads: int, d_head: int, attn_scale: float,
                  logits: bool, rotate: Callable[[torch.Tensor], torch.Tensor] | None = None,
                  model_attn: torch.Tensor | None = None) -> LayerCapture:
    """K, V, logits and attention map of one layer (formulas in the module docstring), on the CPU.

    ``x``: ``[T, d_model]`` float32 attention input; ``layer``: canonical ``AttentionWeights``.
    ``logits``: keep ``L_h`` (positions that do not rotate q and k); ``rotate``: the model's
    rotation (then the map is computed from the rotated q and k, and ``logits`` is ignored);
    ``model_attn`` ``[H, T, T]``: the model's own map, kept as the attention map.
    """
    k = _project(x, layer.W_K, layer.b_K)                                # [G, T, d_head]
    v = _project(x, layer.W_V, layer.b_V)                                # [G, T, d_head]
    lg = attn = None
    if logits or rotate is not None:
        if layer.W_Q is None:                                            # identity slices
            q = x.view(x.shape[0], n_heads, d_head).permute(1, 0, 2)     # [H, T, d_head]
            if layer.b_Q is not None:
                q = q + layer.b_Q.float().to(x.device)[:, None, :]
        else:
            q = _project(x, layer.W_Q, layer.b_Q)                        # [H, T, d_head]
        group = n_heads // n_kv_heads
        if rotate is None:
            lg = q @ k.repeat_interleave(group, 0).mT                    # [H, T, T]
        else:
            rot = rotate(q) @ rotate(k).repeat_interleave(group, 0).mT   # [H, T, T]
            attn = causal_softmax(rot * attn_scale)
    if model_attn is not None:
        attn = model_attn.float()
    elif lg is not None and attn is None:                                # own causal model
        attn = causal_softmax(lg * attn_scale)
    return LayerCapture(layer.layer, k.cpu(), v.cpu(), None if lg is None else lg.cpu(),
                        None if attn is None else attn.cpu())


def sample_windows(ids: torch.Tensor, *, context: int, n_tokens: int) -> torch.Tensor:
    """``[B, T]`` windows of the token stream ``ids: [N]``: ``T = min(context, MAX_WINDOW, N)``,
    ``B = ceil(n_tokens / T)`` (at most ``N // T``), non-overlapping, spread evenly over the text."""
    n = int(ids.numel())
    t = max(1, min(context, MAX_WINDOW, n))
    b = max(1, min(-(-n_tokens // t), n // t))
    starts = torch.linspace(0, n - t, b).round().long() if b > 1 else torch.zeros(1, dtype=torch.long)
    return torch.stack([ids[s:s + t] for s in starts.tolist()])          # [B, T]


def fits(channels_in: int, channels: int) -> bool:
    """Whether images of ``channels_in`` channels can be given ``channels`` (``fit_images``)."""
    return channels_in == channels or channels_in == 1 or channels == 1


def fit_images(images: torch.Tensor, size: int, channels: int) -> torch.Tensor:
    """``images`` ``[N, c, h, w]`` as ``[N, channels, size, size]`` float32: bilinear resize
    (``align_corners=False``), a grey channel repeated to ``channels`` (or colour channels
    averaged to one); ``ValueError`` for other channel counts (``fits``)."""
    n, c = int(images.shape[0]), int(images.shape[1])
    if not fits(c, channels):
        raise ValueError(f"images of {c} channels do not fit a model of {channels}")
    x = images.float()
    if (x.shape[-2], x.shape[-1]) != (size, size):
        x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    if c != channels:
        x = x.expand(n, channels, size, size).contiguous() if c == 1 else x.mean(1, keepdim=True)
    return x                                                             # [N, channels, size, size]
