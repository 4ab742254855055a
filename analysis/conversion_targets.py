"""What ``analysis.conversion`` converts to and by which methods: names only, no torch, so the
dashboard's What-if page (imported with every page when the server builds its navigation) can
offer them without loading torch into the server. Formulas and sources: ``analysis.conversion``.
"""
from __future__ import annotations

#: The conversions ``whatif --to`` offers, named after the attention they make.
TARGETS = ("k_eq_v", "q_eq_k", "q_eq_k_eq_v", "wq_identity", "gqa", "mqa", "latent")
#: Each target's methods, its default first.
METHODS = {
    "k_eq_v": ("lstsq", "keep_k", "keep_v", "avg"),
    "q_eq_k": ("psd", "keep_q", "keep_k", "avg"),
    "q_eq_k_eq_v": tuple(f"{a}+{b}" for a in ("psd", "keep_q", "keep_k", "avg")
                         for b in ("lstsq", "keep_k", "keep_v", "avg")),
    "wq_identity": ("basis",),
    "gqa": ("mean", "aligned"),
    "mqa": ("mean", "aligned"),
    "latent": ("svd",),
}
DEFAULT_METHOD = {t: m[0] for t, m in METHODS.items()}
