"""The Inspector's attention-map sample, torch-free: the dashboard reads these defaults
without importing torch (``experiments.attention_maps``, which runs the forward pass in the
reading child, imports torch)."""
from __future__ import annotations

#: Default sample text of the Inspector's attention maps (English prose, ~80 tokens of BERT's vocabulary).
SAMPLE_TEXT = (
    "The quick brown fox jumps over the lazy dog while the researcher asks whether "
    "attention needs separate queries, keys and values. Each layer reads the residual "
    "stream, compares every token with every earlier token and mixes their values; "
    "if keys and values carry the same information, one of them could be dropped."
)
#: Default and cap of its tokens on the page (``app.pages.inspector``) and in ``app.jobs``.
MAX_TOKENS = 64
