"""Which way is better for a logged metric: ``"min"`` (losses) or ``"max"`` (accuracy).

A dependency-free leaf (standard library only). Recognised from the metric's
name; a per-metric override (edited on the pages) wins over the name. Rules
on the lower-cased name split at ``/ _ - . @`` and spaces, first match wins:

* lower is better when a part names a loss: ``loss``, ``nll``, ``ppl``,
  ``perplexity``, ``bpb``, ``bpc``, ``error``/``err``, ``wer``, ``cer``;
* higher is better: ``acc``, ``accuracy``, ``top1``, ``top5``, ``topk``,
  ``auroc``, ``auc``, ``f1``, ``precision``, ``recall``, ``iou``, ``miou``,
  ``dice``, ``map``, ``bleu``, ``rouge``, ``score``, ``reward``, ``tokens_per_s``,
  ``throughput``, ``mfu``;
* everything else is lower-is-better (an unknown name is read as a loss).
"""
from __future__ import annotations

import re

DIRECTIONS = ("min", "max")

_LOWER = re.compile(r"^(loss|nll|ppl|perplexity|bpb|bpc|error|err|wer|cer)$")
_HIGHER = re.compile(r"^(acc\d*|accuracy|top_?\d+|topk|auroc|auc|f1|precision|recall|m?iou|dice|map|"
                     r"bleu|rouge\w*|score|reward|throughput|mfu)$")


def direction(metric: str, overrides: dict[str, str] | None = None) -> str:
    """``"max"`` when a higher value of ``metric`` is better, else ``"min"``."""
    if overrides and overrides.get(metric) in DIRECTIONS:
        return overrides[metric]
    parts = [p for p in re.split(r"[/_\-.@\s]+", str(metric).strip().lower()) if p]
    if any(_LOWER.match(p) for p in parts):
        return "min"
    # "top_1" splits into "top", "1": read the name with its underscores too.
    joined = str(metric).strip().lower().replace("-", "_")
    if any(_HIGHER.match(p) for p in parts) or re.search(r"top_?\d+|tokens_per_s", joined):
        return "max"
    return "min"


def best(values, metric: str, overrides: dict[str, str] | None = None):
    """The best of ``values`` (an iterable of numbers, NaN/None skipped) for ``metric``; None if empty."""
    clean = [float(v) for v in values if v is not None and v == v]
    if not clean:
        return None
    return max(clean) if direction(metric, overrides) == "max" else min(clean)
