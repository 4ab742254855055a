"""The Inspector's attention maps: one short sample text through a checkpoint, per layer its
K, V, logits and attention probabilities (``capture_activations``).

The text (``SAMPLE_TEXT`` by default, at most ``MAX_TOKENS`` tokens, capped by the model's
positions) goes through the checkpoint's tokenizer or vocabulary, else UTF-8 bytes
(``experiments.runnable``). A forward pre-hook on each layer's attention module records its
input ``x`` ``[1, T, d_model]``; ``analysis.captures.capture_layer`` then forms, from the
canonical weights, ``K = x W_K + b_K``, ``V = x W_V + b_V`` (un-rotated), the logits
``(x W_Q + b_Q) K^T`` where positions do not rotate them, and the maps: transformers' own
(``output_attentions``), or for the project's GPT ``softmax(mask(s * L))``, with rotary
positions ``softmax(mask(s * rot(q) rot(k)^T))`` through ``experiments.model.rotary``.
"""
from __future__ import annotations

import torch

from analysis.captures import Capture, capture_layer
from analysis.weights import default_device
from experiments.runnable import NoForwardPass, attention_modules, hf_towers, load_runnable, model_context
from experiments.sample_text import MAX_TOKENS, SAMPLE_TEXT
from loaders.canonical import Checkpoint


def sample_tokens(text: str, tok, vocab: int, max_tokens: int) -> tuple[torch.Tensor, list[str], str]:
    """``(ids [T], pieces as text, how)`` of the first ``max_tokens`` tokens of ``text``: through a
    ``loaders.vocab`` vocabulary (``SampledIds``: drawn ids), a transformers tokenizer, else UTF-8
    bytes (needs ``vocab >= 256``); fewer than 2 tokens is ``NoForwardPass``."""
    from loaders.vocab import SampledIds, Vocabulary  # here: only a forward pass needs a vocabulary

    if isinstance(tok, Vocabulary):
        ids = tok.sample(max_tokens) if isinstance(tok, SampledIds) else tok.encode(text)[:max_tokens]
        if len(ids) < 2:
            raise NoForwardPass(f"the {tok.how} vocabulary turned the sample text into {len(ids)} tokens")
        return torch.tensor(ids, dtype=torch.long), tok.pieces(ids), tok.how
    if tok is not None:
        enc = tok(text, return_tensors="pt", truncation=True, max_length=max_tokens)
        ids = enc["input_ids"][0]
        if ids.numel() < 2:
            raise NoForwardPass(f"the tokenizer turned the sample text into {ids.numel()} tokens")
        return ids, tok.convert_ids_to_tokens(ids.tolist()), "tokenizer"
    raw = list(text.encode("utf-8"))[:max_tokens]
    if vocab < 256:
        raise NoForwardPass(f"no tokenizer and vocab_size {vocab} < 256: cannot feed UTF-8 bytes")
    return torch.tensor(raw), [bytes([b]).decode("latin-1") for b in raw], "bytes"


def capture_activations(ckpt: Checkpoint, *, text: str = SAMPLE_TEXT, max_tokens: int = MAX_TOKENS,
                        device: str | None = None) -> Capture:
    """Run ``ckpt`` on ``text`` and capture, per layer, K, V, logits and attention maps.

    Raises ``NoForwardPass`` with the reason when the checkpoint cannot be run (vision
    models among them: they read images, not text).
    """
    meta = ckpt.meta
    dev = torch.device(device or default_device())
    model, tok, vocab = load_runnable(ckpt)
    cfg = getattr(model, "cfg", None)          # the project's GPT: learned positions cap the sample
    if getattr(cfg, "task", "language") == "image" or hf_towers(model) is not None:
        raise NoForwardPass(f"{ckpt.path}: a vision model reads images, not text: its attention maps over a "
                            "sample text do not exist (its activation metrics run on images: "
                            "python -m app analyze PATH --activations)")
    mods = attention_modules(model)
    if len(mods) != meta.n_layers:
        raise NoForwardPass(f"{ckpt.path}: found {len(mods)} attention modules in the model, "
                            f"expected {meta.n_layers} (one per layer)")
    if cfg is not None and getattr(cfg, "positions", None) == "learned":
        max_tokens = min(max_tokens, cfg.block_size)
    max_tokens = min(max_tokens, model_context(model))
    # the project's GPT with rotary positions (llama2.c / Meta Llama, own rotary runs): its
    # attention is softmax(rot(q) rot(k)^T * scale) with experiments.model.rotary on the
    # canonical q and k (same interleaved pair order), so the maps are the model's own
    own_rotary = cfg is not None and getattr(cfg, "positions", None) == "rotary"
    ids, token_text, how = sample_tokens(text, tok, vocab, max_tokens)
    inputs: dict[int, torch.Tensor] = {}

    def hook_for(i):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs.get("hidden_states")
            inputs[i] = x.detach()                                       # [1, T, d_model]
        return hook

    handles = [m.register_forward_pre_hook(hook_for(i), with_kwargs=True) for i, m in enumerate(mods)]
    model = model.to(dev)
    try:
        with torch.inference_mode():
            hf = type(model).__module__.startswith("transformers")   # also transformers_modules.*
            kwargs = {"output_attentions": True} if hf else {}
            out = model(ids[None, :].to(dev), **kwargs)
    finally:
        for h in handles:
            h.remove()
    hf_attn = getattr(out, "attentions", None)
    rope = meta.positions not in ("learned", "none")
    reason = (f"positions are {meta.positions}: logits of the un-rotated q and k are not the "
              "model's logits") if rope else None
    rotate = None
    if rope and own_rotary:
        from experiments.model import rotary    # here: the model module loads only for rotary maps

        def rotate(t: torch.Tensor) -> torch.Tensor:                     # [n, T, d_head] at 0..T-1
            return rotary(t[None], 0, cfg.rope_base)[0]
    scale = cfg.attn_scale if rotate is not None else meta.attn_scale
    layers = []
    with torch.inference_mode():
        for i, layer in enumerate(ckpt.layers()):
            x = inputs[i][0].float().to(dev)                                  # [T, d_model]
            layers.append(capture_layer(x, layer, n_heads=meta.n_heads, n_kv_heads=meta.n_kv_heads,
                                        d_head=meta.d_head, attn_scale=scale, logits=not rope, rotate=rotate,
                                        model_attn=None if hf_attn is None else hf_attn[i][0]))
    return Capture(token_text, how, layers, reason)
