"""llama2.c exports built in code (struct + numpy), in the byte order of karpathy/llama2.c
``export.py`` (v0 legacy, v1 float32, v2 Q8_0) and its ``tokenizer.bin``."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import torch


def llama_state(*, dim=16, hidden=40, n_layers=2, n_heads=4, n_kv=2, vocab=300, seq_len=32,
                shared=True, seed=0) -> dict[str, torch.Tensor]:
    """A random llama2.c ``model.py`` state dict (names as its ``Transformer``)."""
    g = torch.Generator().manual_seed(seed)
    kv = dim * n_kv // n_heads

    def r(*shape, scale=0.3):
        return torch.randn(*shape, generator=g) * scale

    sd = {"tok_embeddings.weight": r(vocab, dim, scale=1.0), "norm.weight": 1 + r(dim, scale=0.1)}
    for i in range(n_layers):
        p = f"layers.{i}."
        sd[p + "attention.wq.weight"] = r(dim, dim)
        sd[p + "attention.wk.weight"] = r(kv, dim)
        sd[p + "attention.wv.weight"] = r(kv, dim)
        sd[p + "attention.wo.weight"] = r(dim, dim)
        sd[p + "feed_forward.w1.weight"] = r(hidden, dim)
        sd[p + "feed_forward.w2.weight"] = r(dim, hidden)
        sd[p + "feed_forward.w3.weight"] = r(hidden, dim)
        sd[p + "attention_norm.weight"] = 1 + r(dim, scale=0.1)
        sd[p + "ffn_norm.weight"] = 1 + r(dim, scale=0.1)
    sd["output.weight"] = sd["tok_embeddings.weight"] if shared else r(vocab, dim)
    return sd


def _geometry(sd, n_heads, n_kv, seq_len):
    vocab, dim = sd["tok_embeddings.weight"].shape
    hidden = sd["layers.0.feed_forward.w1.weight"].shape[0]
    n_layers = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("layers."))
    return dim, hidden, n_layers, vocab


def _f32(t) -> bytes:
    return np.ascontiguousarray(t.detach().numpy().reshape(-1), dtype="<f4").tobytes()


def _layers(sd, n_layers, stem):
    return [sd[f"layers.{i}.{stem}.weight"] for i in range(n_layers)]


def write_bin(path: Path, sd, *, version: int, n_heads: int, n_kv: int, seq_len: int,
              group_size: int = 8) -> Path:
    dim, hidden, L, vocab = _geometry(sd, n_heads, n_kv, seq_len)
    shared = torch.equal(sd["output.weight"], sd["tok_embeddings.weight"])
    mats = [*_layers(sd, L, "attention.wq"), *_layers(sd, L, "attention.wk"),
            *_layers(sd, L, "attention.wv"), *_layers(sd, L, "attention.wo")]
    ffn = [*_layers(sd, L, "feed_forward.w1"), *_layers(sd, L, "feed_forward.w2"),
           *_layers(sd, L, "feed_forward.w3")]
    out = bytearray()
    if version == 0:
        out += struct.pack("<7i", dim, hidden, L, n_heads, n_kv, vocab if shared else -vocab, seq_len)
        hs = dim // n_heads
        inv = 1.0 / (10000.0 ** (torch.arange(0, hs, 2).float() / hs))
        ang = torch.outer(torch.arange(seq_len).float(), inv)              # [seq_len, hs/2]
        for t in [sd["tok_embeddings.weight"], *_layers(sd, L, "attention_norm"), *mats,
                  *_layers(sd, L, "ffn_norm"), *ffn, sd["norm.weight"], ang.cos(), ang.sin()]:
            out += _f32(t)
        if not shared:
            out += _f32(sd["output.weight"])
    else:
        out += struct.pack("<Ii7iB", 0x616B3432, version, dim, hidden, L, n_heads, n_kv, vocab, seq_len,
                           int(shared))
        if version == 2:
            out += struct.pack("<i", group_size)
        out += b"\0" * (256 - len(out))
        norms = [*_layers(sd, L, "attention_norm"), *_layers(sd, L, "ffn_norm"), sd["norm.weight"]]
        weights = [sd["tok_embeddings.weight"], *mats, *ffn] + ([] if shared else [sd["output.weight"]])
        for t in norms:
            out += _f32(t)
        if version == 1:
            for t in weights:
                out += _f32(t)
        else:
            scales = []
            for t in weights:
                w = t.detach().numpy().reshape(-1, group_size).astype(np.float32)
                s = np.abs(w).max(axis=1) / 127.0
                q = np.round(w / s[:, None]).astype(np.int8)
                out += q.tobytes()
                scales.append(s.astype("<f4"))
            for s in scales:
                out += s.tobytes()
    path.write_bytes(bytes(out))
    return path


def dequantized(t: torch.Tensor, group_size: int) -> torch.Tensor:
    """What a v2 file stores for ``t`` (Q8_0 round trip), in float64."""
    w = t.double().reshape(-1, group_size)
    s = (w.abs().amax(1) / 127.0).float().double()
    q = torch.round(w.float() / s.float()[:, None]).double()
    return (q * s[:, None]).reshape(t.shape)


def write_tokenizer(path: Path, pieces: list[str], scores: list[float]) -> Path:
    out = bytearray(struct.pack("<i", max(len(p.encode()) for p in pieces)))
    for piece, score in zip(pieces, scores):
        b = piece.encode("utf-8")
        out += struct.pack("<fi", score, len(b)) + b
    path.write_bytes(bytes(out))
    return path


def toy_pieces(vocab: int) -> tuple[list[str], list[float]]:
    """A vocabulary in llama2.c's shape: <unk>, <s>, </s>, 256 byte tokens, then pieces."""
    pieces = ["<unk>", "\n<s>\n", "\n</s>\n"] + [f"<0x{b:02X}>" for b in range(256)]
    extra = [" ", "e", "t", "h", " t", "th", " th", "he", " the", "a", "c", " c", "at", " cat", "s"]
    pieces += extra
    pieces += [f"x{i}" for i in range(vocab - len(pieces))]
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces) - 259)]
    return pieces[:vocab], scores[:vocab]
