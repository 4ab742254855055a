"""Norms of the weights: the Frobenius norm of each projection of the layer (all heads), plotted against
weight decay. ``||A||_F^2`` is the sum of the traces of the per-head Grams the other families form.
No chance level: a norm measures the scale itself, which random matrices of any scale match.
"""
from __future__ import annotations

from analysis.registry import Metric, register


def _compute(p: str):
    def compute(layer, meta, device):
        if p == "q":
            layer.need_q()
        return layer.norm(p)

    compute.__name__ = compute.__qualname__ = f"norm_{p}"
    return compute


for _p, _w in (("q", "W_Q"), ("k", "W_K"), ("v", "W_V"), ("o", "W_O")):
    register(Metric(f"norm_{_p}", "weights", "layer", "norms",
                    f"Frobenius norm of the layer's {_w} (all heads); plotted against weight decay",
                    "none", "none", "none: a norm measures the scale itself, which random matrices of any scale match",
                    reads=(_p.upper(),)),
             _compute(_p))
