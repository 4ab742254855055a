"""The two configurations every run saves, torch-free: ``GPTConfig`` (the model) and ``TrainConfig``
(the optimisation), with the option lists (``NORMS``, ``TASKS``, ``POSITIONS``, ``VARIANTS``) and the
projection tensors each variant owns (``PROJECTIONS``).

Kept apart from :mod:`experiments.model` and :mod:`experiments.train` so that the CLI builds its
parsers (``train``/``sweep`` take their defaults and choices from here) without importing torch:
``python -m app --help``, ``runs``, ``kv-cost`` start in a fraction of the time and memory.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Mapping

from analysis.variants import ALL_VARIANTS as VARIANTS, PLUS, kv_bytes_per_token, n_cached

NORMS = ("layernorm", "rmsnorm", "none")
TASKS = ("language", "image")
POSITIONS = ("learned", "rotary")

#: The projection tensors each variant owns (``blocks.N.attn.<name>.weight``).
PROJECTIONS = {
    "qkv": ("q", "k", "v"),
    "wq_identity": ("k", "v"),
    "q_eq_k": ("qk", "v"),
    "k_eq_v": ("q", "kv"),
    "q_eq_k_eq_v": ("qkv",),
}
PROJECTIONS.update({plus: PROJECTIONS[b] for plus, b in PLUS.items()})


@dataclass
class GPTConfig:
    """Every architectural hyperparameter (saved with each checkpoint).

    ``n_kv_heads`` and ``d_head`` default (``None``) to ``n_head`` and
    ``d_model // n_head``; ``attn_scale`` ``None`` means ``1/sqrt(d_head)``
    (the query-free paper trains with ``1/(2*sqrt(d_head))``). ``causal``
    False makes an encoder (the vision models); ``pos2d_dim`` is the number
    ``m`` of channels of the "+" variants' 2D positional score correction.
    ``task`` is ``language`` (this GPT) or ``image`` (:mod:`experiments.vision`,
    with ``image_size``, ``patch_size``, ``channels`` and ``n_classes``).
    ``mlp_ratio``: MLP width = ``round(mlp_ratio * d_model)`` (4.0 standard;
    the query-free paper's parameter-matched comparison uses 4.5 vs 3.5).
    """

    vocab_size: int = 256
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_kv_heads: int | None = None
    d_model: int = 128
    d_head: int | None = None
    variant: str = "qkv"
    norm: str = "layernorm"
    positions: str = "learned"
    mlp_ratio: float = 4.0
    attn_scale: float | None = None
    bias: bool = False
    tie_embeddings: bool = True
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    causal: bool = True
    pos2d_dim: int = 10
    task: str = "language"
    image_size: int | None = None
    patch_size: int | None = None
    channels: int | None = None
    n_classes: int | None = None

    def __post_init__(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_head
        if self.d_head is None:
            self.d_head = self.d_model // self.n_head
        if self.attn_scale is None:
            self.attn_scale = 1.0 / math.sqrt(self.d_head)
        problems = []
        if self.variant not in VARIANTS:
            problems.append(f"variant {self.variant!r} is not one of {', '.join(VARIANTS)}")
        if self.norm not in NORMS:
            problems.append(f"norm {self.norm!r} is not one of {', '.join(NORMS)}")
        if self.positions not in POSITIONS:
            problems.append(f"positions {self.positions!r} is not one of {', '.join(POSITIONS)}")
        if self.n_kv_heads < 1 or self.n_head % self.n_kv_heads:
            problems.append(f"n_kv_heads {self.n_kv_heads} does not divide n_head {self.n_head}")
        if self.variant == "wq_identity" and self.n_head * self.d_head != self.d_model:
            problems.append(f"wq_identity needs n_head * d_head == d_model, found "
                            f"{self.n_head} * {self.d_head} != {self.d_model}")
        if self.task not in TASKS:
            problems.append(f"task {self.task!r} is not one of {', '.join(TASKS)}")
        if self.variant in PLUS and self.pos2d_dim < 2:
            problems.append(f"variant {self.variant} needs pos2d_dim >= 2, found {self.pos2d_dim}")
        if self.positions == "rotary" and self.d_head % 2:
            problems.append(f"rotary positions need an even d_head, found {self.d_head}")
        if problems:
            raise ValueError("invalid GPTConfig: " + "; ".join(problems))

    @property
    def d_mlp(self) -> int:
        return int(round(self.mlp_ratio * self.d_model))

    @property
    def n_cached(self) -> int:
        """Tensors cached per layer and kv head: 1 for K=V variants, else 2."""
        return n_cached(self.variant)

    def kv_bytes_per_token(self, bytes_per_elem: int = 4) -> int:
        """n_layer * n_cached * n_kv_heads * d_head * bytes_per_elem."""
        return kv_bytes_per_token(self.variant, self.n_layer, self.n_kv_heads, self.d_head, bytes_per_elem)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> "GPTConfig":
        """Build from a saved dict; unknown keys are an error naming them."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown GPTConfig keys: {', '.join(unknown)}")
        return cls(**dict(d))


@dataclass
class TrainConfig:
    """Training hyperparameters (model hyperparameters live in GPTConfig)."""

    steps: int = 1000
    batch_size: int = 16
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_interval: int = 100
    eval_batches: int = 16
    log_interval: int = 10
    seed: int = 1337
    val_seed: int = 0
    save_steps: list[int] = field(default_factory=list)
    corpus: str | None = None
    corpus_max_bytes: int | None = None
    dataset: str | None = None          # image task: 'digits', an .npz or a folder of class folders
    device: str = "cpu"
    threads: int | None = None

    #: settings that may differ between a run and its resumption
    RUNTIME = ("device", "threads")
