"""The reading child the dashboard starts before anyone asks for it.

Opening a stored checkpoint in the Inspector (spectra, attention maps, an
analysis) runs in the reading child of ``loaders.parse_child`` (never in the
server). Its start costs about 1 s of imports (torch, duckdb, the readers),
and the first forward pass through a Hugging Face model about 2 s more for
``transformers``' model machinery. ``prestart_reader`` has ``POOL`` start
that child in the background and import ``READER_MODULES`` in it, so that the
first checkpoint a user opens waits for neither. The idle child holds about
450 MB resident; ``QKVSCOPE_PRESTART=0`` in the server's environment turns
this off (the first request then starts the child, as before).
"""
from __future__ import annotations

import threading

#: What the prestarted child imports: the Inspector's code, and ``transformers.modeling_utils``
#: (1.8 s of the 2.0 s a first forward pass through a Hugging Face GPT-2 spent importing).
READER_MODULES = ("app.inspect_child", "analysis.weights", "experiments.attention_maps",
                  "transformers.modeling_utils")


def prestart_reader() -> threading.Thread | None:
    """Start the reading child in the background (``loaders.parse_child.prestart(READER_MODULES)``:
    nothing when ``QKVSCOPE_PRESTART=0``); the thread doing it, or None when nothing was started."""
    from loaders.parse_child import prestart  # here: the server's first page, not at import

    return prestart(READER_MODULES)
