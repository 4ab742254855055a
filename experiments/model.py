"""One GPT-style model for every attention variant qkvscope studies.

Pre-norm, causal, byte-level by default. Attention is parametrised by

* ``variant`` (see DESIGN.md):

  ==================  =====================================================
  ``qkv``             q = x W_q, k = x W_k, v = x W_v (the standard layer)
  ``wq_identity``     query-free (arXiv 2510.23912): head h's query is the
                      slice ``x[..., h*d_head:(h+1)*d_head]`` of the
                      normalised residual stream; no W_q at all
  ``q_eq_k``          q = k (one tensor ``qk``; symmetric logits)
  ``k_eq_v``          v = k (one tensor ``kv``; ONE cached tensor per layer)
  ``q_eq_k_eq_v``     q = k = v (one tensor ``qkv``)
  ==================  =====================================================

* ``n_kv_heads``: n_head (MHA), a divisor (GQA-g), or 1 (MQA). Query head h
  reads kv head ``h // (n_head // n_kv_heads)``. When q is tied to k
  (``q_eq_k``, ``q_eq_k_eq_v``) the query of head h is that kv head's key.

The state dict holds the real parameter set of the variant, nothing tied is
stored twice (``blocks.N.attn.kv.weight`` for K=V, no query weight for
``wq_identity``). Weight layout: ``nn.Linear`` weights ``[out, in]`` with
output feature ``head * d_head + j``; in canonical form
``W_K[h] = k.weight.view(n_kv_heads, d_head, d_model)[h].T``.

The incremental decoding cache (:class:`KVCache`) stores, per layer, the
keys and values (two tensors) or, for K=V variants, the one shared tensor, so
its bytes per token are ``n_layer * n_cached * n_kv_heads * d_head * bytes``
with ``n_cached = 1`` for K=V, as in DESIGN.md "KV-cache and serving cost".

Checkpoints: :meth:`GPT.from_state_dict` (this model's own, in its own names);
other people's (nanoGPT, the two papers' models, llama2.c) are built by
:mod:`experiments.foreign` from the canonical container their layout module
(``loaders/layouts/``) reads, so no checkpoint's key names are written here.
"""
from __future__ import annotations

import math
from typing import Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from analysis.variants import KV_TIED, PLUS, Q_TIED, base
# The configuration and option lists live torch-free in experiments.config; imported here under the
# names every caller uses (experiments.model.GPTConfig, VARIANTS, ...).
from experiments.config import NORMS, POSITIONS, PROJECTIONS, TASKS, VARIANTS, GPTConfig  # noqa: F401


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight (Zhang & Sennrich 2019)."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(cfg: GPTConfig) -> nn.Module:
    if cfg.norm == "layernorm":
        return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.d_model, cfg.norm_eps)
    return nn.Identity()


def rotary(x: torch.Tensor, start: int, base: float) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of x (B, H, T, D) by angle pos * base^(-2i/D),
    pos = start..start+T-1 (RoFormer, Su et al. 2021, interleaved pairs)."""
    B, H, T, D = x.shape
    inv = base ** (-torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D)  # (D/2,)
    pos = torch.arange(start, start + T, device=x.device, dtype=torch.float32)
    ang = torch.outer(pos, inv)  # (T, D/2)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (B, H, T, D/2) each
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (B, H, T, D/2, 2)
    return out.flatten(-2)


def sincos_2d(n: int, m: int) -> torch.Tensor:
    """Paper B's fixed 2D positional tensor ``P`` ``[n, n, m]``: channels ``0..m//2-1``
    encode the query position ``i``, the rest the key position ``j``, each as the
    usual sin/cos of ``pos * 10000^(-2c/k)`` (pairs (sin, cos), ``k`` channels).
    ``P[i, j] != P[j, i]``, which is what lets the "+" variants break Q=K symmetry."""
    def one(k: int) -> torch.Tensor:                   # [n, k]
        pos = torch.arange(n, dtype=torch.float32)[:, None]
        c = torch.arange(k)
        freq = 10000.0 ** (-(2 * (c // 2)).float() / max(k, 1))
        ang = pos * freq                                # [n, k]
        return torch.where(c % 2 == 0, ang.sin(), ang.cos())
    half = m // 2
    row, col = one(half), one(m - half)                 # [n, half], [n, m - half]
    return torch.cat((row[:, None, :].expand(n, n, half), col[None, :, :].expand(n, n, m - half)), dim=-1)


class KVCache:
    """Per-layer decoding cache: ``{"k", "v"}`` or, for K=V variants, ``{"kv"}``.

    Tensors are ``(B, n_kv_heads, T, d_head)``. For rotary K=V variants the
    shared tensor is cached before rotation (it is also the value) and keys
    are rotated when read.
    """

    def __init__(self, n_layer: int):
        self.layers: list[dict[str, torch.Tensor]] = [{} for _ in range(n_layer)]

    @property
    def length(self) -> int:
        """Tokens cached (in the last layer, i.e. before or after a full forward)."""
        return self.layer_length(len(self.layers) - 1)

    def layer_length(self, layer: int) -> int:
        d = self.layers[layer]
        return next(iter(d.values())).shape[2] if d else 0

    def append(self, layer: int, name: str, t: torch.Tensor) -> torch.Tensor:
        old = self.layers[layer].get(name)
        new = t if old is None else torch.cat((old, t), dim=2)
        self.layers[layer][name] = new
        return new

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.layers for t in layer.values())

    def bytes_per_token(self) -> int:
        """Cache bytes per cached token of one sequence."""
        first = self.layers[0]
        if not first:
            return 0
        B = next(iter(first.values())).shape[0]
        return self.nbytes() // (B * self.length)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        d, dh = cfg.d_model, cfg.d_head
        width = {"q": cfg.n_head * dh}
        for name in PROJECTIONS[cfg.variant]:
            setattr(self, name, nn.Linear(d, width.get(name, cfg.n_kv_heads * dh), bias=cfg.bias))
        self.o = nn.Linear(cfg.n_head * dh, d, bias=cfg.bias)
        if cfg.variant in PLUS:
            # scores' = scores * sum(w) + P @ w + b (a 1x1 convolution of [scores, P]);
            # w ~ N(0, 0.02^2) as in paper B's code, so attention starts near uniform
            self.pos_w = nn.Parameter(torch.randn(cfg.pos2d_dim) * 0.02)
            self.pos_b = nn.Parameter(torch.zeros(1))
            self.register_buffer("pos2d", sincos_2d(cfg.block_size, cfg.pos2d_dim), persistent=False)

    def _heads(self, t: torch.Tensor, n: int) -> torch.Tensor:
        B, T, _ = t.shape
        return t.view(B, T, n, self.cfg.d_head).transpose(1, 2)  # (B, n, T, dh)

    def forward(self, x: torch.Tensor, layer: int = 0, cache: KVCache | None = None) -> torch.Tensor:
        cfg = self.cfg
        B, T, C = x.shape
        H, G = cfg.n_head, cfg.n_kv_heads
        past = cache.layer_length(layer) if cache is not None else 0
        rope = cfg.positions == "rotary"
        v_new = None
        if cfg.variant in KV_TIED:
            shared = self._heads((self.kv if cfg.variant == "k_eq_v" else self.qkv)(x), G)  # (B, G, T, dh)
            kv_all = cache.append(layer, "kv", shared) if cache is not None else shared
            k = rotary(kv_all, 0, cfg.rope_base) if rope else kv_all
            v = kv_all
            k_new = shared
        else:
            k_new = self._heads((self.qk if base(cfg.variant) == "q_eq_k" else self.k)(x), G)  # (B, G, T, dh)
            v_new = self._heads(self.v(x), G)
            k_rot = rotary(k_new, past, cfg.rope_base) if rope else k_new
            k = cache.append(layer, "k", k_rot) if cache is not None else k_rot
            v = cache.append(layer, "v", v_new) if cache is not None else v_new
        if cfg.variant == "wq_identity":
            q = self._heads(x, H)  # (B, H, T, dh): the residual stream's head slices
        elif cfg.variant in Q_TIED:
            q = k_new.repeat_interleave(H // G, dim=1)  # (B, H, T, dh): head h uses kv head h // (H/G)
        else:
            q = self._heads(self.q(x), H)
        if rope:
            q = rotary(q, past, cfg.rope_base)
        if G != H:
            k = k.repeat_interleave(H // G, dim=1)  # (B, H, past+T, dh)
            v = v.repeat_interleave(H // G, dim=1)
        if cfg.variant in PLUS:
            y = self._plus_attention(q, k, v, past)
        elif past == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=cfg.causal, scale=cfg.attn_scale)
        elif not cfg.causal:
            raise ValueError("an encoder (causal=False) has no incremental decoding cache")
        else:
            # query i sits at absolute position past+i and sees keys 0..past+i
            mask = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(diagonal=past)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=cfg.attn_scale)
        y = y.transpose(1, 2).reshape(B, T, H * cfg.d_head)  # (B, T, H*dh)
        return self.o(y)

    def _plus_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int) -> torch.Tensor:
        """Attention with the "+" score correction; q (B, H, T, dh), k/v (B, H, past+T, dh)."""
        cfg = self.cfg
        T, S = q.shape[2], k.shape[2]
        if S > self.pos2d.shape[0]:
            raise ValueError(f"sequence of {S} tokens exceeds block_size {self.pos2d.shape[0]}")
        scores = (q @ k.transpose(-2, -1)) * cfg.attn_scale        # (B, H, T, S)
        P = self.pos2d[past:past + T, :S]                           # (T, S, m)
        scores = scores * self.pos_w.sum() + P @ self.pos_w + self.pos_b
        if cfg.causal:
            mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=past)
            scores = scores.masked_fill(~mask, float("-inf"))
        return F.softmax(scores, dim=-1) @ v                        # (B, H, T, dh)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.d_mlp, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_mlp, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = make_norm(cfg)
        self.attn = Attention(cfg)
        self.ln_2 = make_norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, layer: int, cache: KVCache | None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), layer, cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """The variant model. ``forward(idx, targets=None, cache=None) -> (logits, loss)``."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.positions == "learned":
            self.wpe = nn.Embedding(cfg.block_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = make_norm(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init)
        # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer)
        for name, p in self.named_parameters():
            if name.endswith("attn.o.weight") or name.endswith("mlp.proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def n_params(self) -> int:
        """Parameters counted once each (a tied lm_head is the embedding)."""
        return sum(p.numel() for p in self.parameters())

    def n_attention_params(self) -> int:
        return sum(p.numel() for b in self.blocks for p in b.attn.parameters())

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                cache: KVCache | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T = idx.shape
        past = cache.length if cache is not None else 0
        if past + T > self.cfg.block_size and self.cfg.positions == "learned":
            raise ValueError(f"sequence of {past + T} tokens exceeds block_size {self.cfg.block_size}")
        x = self.wte(idx)  # (B, T, C)
        if self.cfg.positions == "learned":
            x = x + self.wpe(torch.arange(past, past + T, device=idx.device))
        for i, block in enumerate(self.blocks):
            x = block(x, i, cache)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    @torch.inference_mode()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Sample with the KV cache; temperature 0 is greedy. Returns (B, T + new)."""
        cache = KVCache(self.cfg.n_layer)
        logits, _ = self(idx, cache=cache)
        out = [idx]
        for _ in range(max_new_tokens):
            last = logits[:, -1, :]
            if temperature == 0:
                nxt = last.argmax(-1, keepdim=True)
            else:
                probs = F.softmax(last / temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)
            out.append(nxt)
            logits, _ = self(nxt, cache=cache)
        return torch.cat(out, dim=1)

    # ---- state dicts ---------------------------------------------------------------
    def export_state_dict(self) -> dict[str, torch.Tensor]:
        """The real parameter set, each tensor once (no tied lm_head), contiguous copies."""
        sd = {k: v.detach().clone().contiguous() for k, v in self.state_dict().items()}
        if self.cfg.tie_embeddings:
            sd.pop("lm_head.weight", None)
        return sd

    @classmethod
    def from_state_dict(cls, cfg: GPTConfig, sd: Mapping[str, torch.Tensor]) -> "GPT":
        """This model's own checkpoint; missing or unexpected keys are listed, sorted."""
        model = cls(cfg)
        own = model.state_dict()
        expected = set(own) - ({"lm_head.weight"} if cfg.tie_embeddings else set())
        missing, unexpected = sorted(expected - set(sd)), sorted(set(sd) - expected)
        if missing or unexpected:
            raise KeyError(f"state dict does not match a {cfg.variant} model: "
                           f"missing {missing}, unexpected {unexpected}")
        with torch.no_grad():
            for k in expected:
                if tuple(sd[k].shape) != tuple(own[k].shape):
                    raise ValueError(f"{k}: expected shape {tuple(own[k].shape)}, found {tuple(sd[k].shape)}")
                own[k].copy_(sd[k])
        return model
