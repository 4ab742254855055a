"""What a plugin metric (``analysis.registry.register``) needs beyond the registry, and the activation plugins' values.

A weight-level metric, built-in or plugin, is computed by ``weight_metrics``
(``analysis/weights.py``): its ``compute(layer, meta, device)`` gets the layer's
``analysis.products.LayerProducts`` (the canonical tensors as float32 on
``device``, never written into, and the shared float64 Grams and cross
products), the geometry and the device, under ``torch.inference_mode()``; its
values become rows by the row's axis:

* ``head``: ``n_heads`` values, labelled ``L{l}H{h}``;
* ``kv_head``: ``n_kv_heads`` values, ``L{l}KV{g}``;
* ``layer``: one number, ``head`` None, ``L{l}``;
* ``head+layer``: ``(per_head, whole)``, both of the above (any axis: ``registry.Values``).

A metric that raises ``Absent(reason)`` gives no rows and the note ``reason``;
a value of the wrong count is an ``AnalysisError`` naming the metric.
Activation-level plugins are functions of the accumulated sums
(``activation_values``, called by ``analysis.activations``), so their chance
level and jackknife-t interval come from the same sums as the built-in metrics'.
"""
from __future__ import annotations

import torch

from analysis.registry import Absent, check_plugins, plugins

__all__ = ["Absent", "activation_values"]


def activation_values(stats: dict[str, torch.Tensor], d_head: int) -> dict[str, torch.Tensor]:
    """Every activation-level plugin's values from the summed statistics (any leading batch dims)."""
    check_plugins()
    return {p.metric.name: p.compute(stats, d_head) for p in plugins("activations")}
