"""The model classes of Brainchip-Inc/Do-Transformers-Need-3-Projections, vendored
(MIT; SOURCES.md), and the table of their language-model files.

``PAPER_B``: every language-model file of that repository, by the model class
it trains. The 1.2B files hold the same classes with other ``ModelConfig``
defaults (n_head 32; n_kv_groups 8 for GQA and QGQA, 1 for MQA and QMQA; read
from ``transformer_*_1_2B.py``), so a 1.2B case builds the 300M file's class at
the 1.2B head counts.
"""
from __future__ import annotations

import dataclasses
import importlib

import torch

PAPER_B = [
    # file, model class, config heads (300M / 1.2B), kv heads per size, variant
    ("transformer_KQV_300_M", "GPT", {"300M": (16, 16), "1.2B": (32, 32)}, "qkv"),
    ("transformer_GQA_300_M", "GPT_GQA", {"300M": (16, 4), "1.2B": (32, 8)}, "qkv"),
    ("transformer_MQA_300_M", "GPT_MQA", {"300M": (16, 1), "1.2B": (32, 1)}, "qkv"),
    ("transformer_KV_1_300_M", "GPT_QKV_KEqualsV", {"300M": (16, 16), "1.2B": (32, 32)}, "k_eq_v"),
    ("transformer_QGQA_300_M", "GPT_Q_GQA", {"300M": (16, 8), "1.2B": (32, 8)}, "k_eq_v"),
    ("transformer_QMQA_300_M", "GPT_QMQA", {"300M": (16, 1), "1.2B": (32, 1)}, "k_eq_v"),
    ("transformer_QK_300_M", "GPT_KV", {"300M": (16, 16)}, "q_eq_k"),
    ("transformer_K_300_M", "GPT_K", {"300M": (16, 16)}, "q_eq_k_eq_v"),
]
PAPER_B_CASES = [(f, cls, size, heads, variant) for f, cls, sizes, variant in PAPER_B
                 for size, heads in sizes.items()]


def paper_b_model(file: str, cls: str, n_head: int, n_kv: int, seed: int = 0):
    """Their GPT class of ``file`` at d_head 4, 2 layers (the head counts of the size),
    random weights under their own init, in eval mode (dropout off)."""
    mod = importlib.import_module(f"tests.loaders.paper_b.{file}")
    fields = {f.name for f in dataclasses.fields(mod.ModelConfig)}
    conf = mod.ModelConfig(vocab_size=64, n_positions=16, n_layer=2, n_embd=4 * n_head, n_head=n_head,
                           n_inner=16 * n_head, use_flash_attention=False,
                           **({"n_kv_groups": n_kv} if "n_kv_groups" in fields else {}))
    torch.manual_seed(seed)
    model = getattr(mod, cls)(conf).eval()
    with torch.no_grad():                    # their init zeroes biases: make every term count
        for name, t in model.named_parameters():
            if name.endswith(".bias"):
                t.normal_(0, 0.1)
    return model, conf


