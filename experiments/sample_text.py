"""The samples metrics run on, torch-free: the Inspector's attention-map sample (the dashboard
reads these defaults without importing torch; ``experiments.attention_maps``, which runs the
forward pass in the reading child, imports torch) and an activation job's ``SampleSpec``."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

#: Default sample text of the Inspector's attention maps (English prose, ~80 tokens of BERT's vocabulary).
SAMPLE_TEXT = (
    "The quick brown fox jumps over the lazy dog while the researcher asks whether "
    "attention needs separate queries, keys and values. Each layer reads the residual "
    "stream, compares every token with every earlier token and mixes their values; "
    "if keys and values carry the same information, one of them could be dropped."
)
#: Default and cap of its tokens on the page (``app.pages.inspector``) and in ``app.jobs``.
MAX_TOKENS = 64


@dataclass(frozen=True)
class SampleSpec:
    """What the activation metrics run on: a text (None: the bundled corpus) and a token count
    (None: ``max(DEFAULT_TOKENS, TOKENS_PER_COLUMN * d_head)``); for a vision model the images
    (``images``: ``digits``, an .npz or a class-folder dataset; None: the dataset the run trained
    on, else ``digits``; for a Hugging Face vision model ``digits``), whose patches are the tokens.
    Torch-free: ``analyze`` names its sample in the parent, which computes nothing
    (``experiments.activation_runs`` runs it, in the reading child)."""

    text: str | None = None
    tokens: int | None = None
    images: str | None = None

    def key(self) -> dict:
        """The cache key of an activation job: the same key again reads the stored rows."""
        if self.text is None:
            source = "bundled"
        else:
            source = "sha256:" + hashlib.sha256(self.read().text.encode("utf-8")).hexdigest()
        key = {"text": source, "tokens": self.tokens if self.tokens is not None else "default"}
        if self.images is not None:
            key["images"] = self.images
        return key

    def read(self):
        """The text (``loaders.text_corpus.read_text_sample``: the bundled corpus for None)."""
        from loaders.text_corpus import read_text_sample   # here: only when a text is read

        return read_text_sample(self.text)
