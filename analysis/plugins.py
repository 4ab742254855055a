"""Running the metrics that plugins registered (``analysis.registry.register``) on one layer.

``weight_metrics`` (``analysis/weights.py``) ends with ``add_weight_metrics``:
each weight-level plugin's ``compute(layer, meta, device)`` gets a
``PluginLayer`` (the canonical tensors as float32 on ``device``, each
converted the first time it is read, never written into), the geometry and
the device, under ``torch.inference_mode()``, and its values become rows by
the row's axis:

* ``head``: ``n_heads`` values, labelled ``L{l}H{h}``;
* ``kv_head``: ``n_kv_heads`` values, ``L{l}KV{g}``;
* ``layer``: one number, ``head`` None, ``L{l}``;
* ``head+layer``: ``(per_head, whole)``, both of the above.

A plugin that raises ``Absent(reason)`` gives no rows and the note ``reason``
(as built-in metrics do for a model they do not apply to); a value of the
wrong count is an ``AnalysisError`` naming the metric. Activation-level
plugins are functions of the accumulated sums (``activation_values``, called
by ``analysis.activations``), so their chance level and jackknife-t interval come
from the same sums as the built-in metrics'.
"""
from __future__ import annotations

import torch

from analysis._linalg import as_float32
from analysis.errors import AnalysisError
from analysis.registry import check_plugins, plugins


class Absent(Exception):
    """Raised by a plugin's ``compute`` where its metric does not exist for the layer; the message is the note."""


class PluginLayer:
    """The ``LayerLike`` fields of a layer as float32 tensors on one device, converted on first read.

    Shapes (``loaders/canonical.py``): ``W_Q`` ``[n_heads, d_model, d_head]`` or
    None (query-free), ``W_K``, ``W_V`` ``[n_kv_heads, d_model, d_head]``,
    ``W_O`` ``[n_heads, d_head, d_model]``, biases ``[heads, d_head]`` or None.
    """

    _FIELDS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V")

    def __init__(self, layer, device: torch.device):
        self.layer = layer.layer
        self._src, self._dev, self._seen = layer, device, {}

    def __getattr__(self, name: str):
        if name not in PluginLayer._FIELDS:
            raise AttributeError(name)
        if name not in self._seen:
            t = getattr(self._src, name, None)
            self._seen[name] = None if t is None else as_float32(t, self._dev)
        return self._seen[name]


def _values(metric: str, got, count: int, what: str) -> torch.Tensor:
    """``got`` (a tensor, a sequence or a number) as ``count`` float64 values on the CPU."""
    vals = torch.as_tensor(got, dtype=torch.float64).detach().cpu().reshape(-1)
    if vals.numel() != count:
        raise AnalysisError(f"metric {metric!r}: compute returned {vals.numel()} values, expected {count} "
                            f"({what})")
    return vals


def add_weight_metrics(out, notes: dict[str, str], layer, meta, device: torch.device) -> None:
    """Every weight-level plugin's rows for ``layer`` into ``out`` (``weights._Rows``), and its notes."""
    check_plugins()
    todo = plugins("weights")
    if not todo:
        return
    view = PluginLayer(layer, device)
    with torch.inference_mode():
        for p in todo:
            m = p.metric
            try:
                got = p.compute(view, meta, device)
            except Absent as why:
                notes[m.name] = str(why)
                continue
            per_head, whole = (got if m.axis == "head+layer" else
                               (None, got) if m.axis == "layer" else (got, None))
            if per_head is not None:
                kv = m.axis == "kv_head"
                count, what = (meta.n_kv_heads, "one per kv head") if kv else (meta.n_heads, "one per head")
                out.heads(m.name, _values(m.name, per_head, count, what), kv=kv)
            if whole is not None:
                out.whole(m.name, float(_values(m.name, whole, 1, "one for the layer")[0]))


def activation_values(stats: dict[str, torch.Tensor], d_head: int) -> dict[str, torch.Tensor]:
    """Every activation-level plugin's values from the summed statistics (any leading batch dims)."""
    check_plugins()
    return {p.metric.name: p.compute(stats, d_head) for p in plugins("activations")}
