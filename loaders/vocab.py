"""Vocabularies for forward passes of checkpoints that bring no Hugging Face tokenizer.

``find_vocabulary(path, source, vocab_size)`` looks, in this order, for

1. a llama2.c tokenizer beside a llama2.c checkpoint: ``tokenizer.bin`` or
   ``tok{vocab_size}.bin`` in the checkpoint's folder, with exactly
   ``vocab_size`` tokens (``loaders.llama2c.read_tokenizer``);
2. a character vocabulary in the checkpoint itself: ``stoi`` (and ``itos``)
   at its top level or in its ``config``;
3. nanoGPT's ``meta.pkl`` (``{"vocab_size", "itos", "stoi"}``, written by its
   ``data/*/prepare.py``): beside the checkpoint, or ``data/<dataset>/meta.pkl``
   under the checkpoint's folder or the two above it, ``dataset`` being the
   checkpoint's ``config["dataset"]`` (as nanoGPT's ``sample.py`` finds it).
   It is read with ``loaders.sources.load_plain_pickle``: nothing is imported,
   so a pickle that asks for any callable is refused (and the reason kept),
   never run.

and returns a ``Vocabulary`` (``encode(text) -> ids``, ``pieces(ids) -> text``,
``how``), or ``None``. A vocabulary that does not fit the model (more ids than
``vocab_size``) is not used; ``why_not`` says why.

``SampledIds`` stands in when there is none: token ids drawn uniformly from
``[0, vocab_size)`` with a fixed seed, so activation metrics can still be
measured on (meaningless) inputs, and every result says so.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from loaders.errors import CheckpointFormatError

__all__ = ["Vocabulary", "CharVocabulary", "SampledIds", "find_vocabulary"]


class Vocabulary:
    """What a forward pass needs of a tokenizer."""

    how: str = "vocabulary"

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def pieces(self, ids: list[int]) -> list[str]:
        raise NotImplementedError


class CharVocabulary(Vocabulary):
    """A character-level vocabulary (``stoi``: character -> id). Characters of the
    text that it lacks are dropped (``dropped``: how many, in the last ``encode``)."""

    def __init__(self, stoi: dict[str, int], *, how: str):
        self.stoi = stoi
        self.itos = {i: s for s, i in stoi.items()}
        self.how = how
        self.dropped = 0

    def encode(self, text: str) -> list[int]:
        ids = [self.stoi[c] for c in text if c in self.stoi]
        self.dropped = len(text) - len(ids)
        return ids

    def pieces(self, ids: list[int]) -> list[str]:
        return [self.itos.get(i, f"#{i}") for i in ids]


class SampledIds(Vocabulary):
    """Uniform token ids from ``[0, vocab_size)``, seed 0 (no vocabulary found)."""

    def __init__(self, vocab_size: int, reason: str):
        self.vocab_size = int(vocab_size)
        self.how = "sampled ids"
        self.reason = reason

    def sample(self, n: int) -> list[int]:
        g = torch.Generator().manual_seed(0)
        return torch.randint(0, self.vocab_size, (int(n),), generator=g).tolist()

    def encode(self, text: str) -> list[int]:
        """As many ids as the text has UTF-8 bytes (the text itself is not read)."""
        return self.sample(len(text.encode("utf-8")))

    def pieces(self, ids: list[int]) -> list[str]:
        return [f"#{i}" for i in ids]


def _stoi(value, vocab_size: int, where: str) -> tuple[dict[str, int] | None, str | None]:
    """A character vocabulary from a JSON-like ``stoi`` mapping, or (None, why not)."""
    if not isinstance(value, dict) or not value:
        return None, f"{where} has no stoi mapping"
    stoi = {}
    for s, i in value.items():
        if isinstance(i, bool) or not isinstance(i, (int, float)) or float(i) != int(i):
            return None, f"{where}: stoi maps {s!r} to {i!r}, not a token id"
        stoi[str(s)] = int(i)
    top = max(stoi.values())
    if min(stoi.values()) < 0 or top >= vocab_size:
        return None, f"{where}: stoi holds id {top}, outside the model's vocabulary of {vocab_size}"
    return stoi, None


def _meta_candidates(path: Path, config: dict) -> list[Path]:
    folder = path if path.is_dir() else path.parent
    out = [folder / "meta.pkl"]
    dataset = config.get("dataset") if isinstance(config, dict) else None
    if isinstance(dataset, str) and re.fullmatch(r"[\w.-]+", dataset) and dataset not in (".", ".."):
        for base in (folder, folder.parent, folder.parent.parent):
            out.append(base / "data" / dataset / "meta.pkl")
    seen, unique = set(), []
    for c in out:
        if c not in seen:
            seen.add(c)
            unique.append(c)
    return unique


def find_vocabulary(path: str | Path, *, extras: dict, config: dict, vocab_size: int,
                    llama2c: bool = False) -> tuple[Vocabulary | None, list[str]]:
    """The vocabulary for the checkpoint at ``path`` (module docstring) and the reasons
    the candidates looked at were not used (``[]`` when the first one fits).

    ``extras``/``config``: the source's; ``llama2c``: look for a llama2.c tokenizer.
    A ``meta.pkl`` that asks to import code is refused (``UnsafeCheckpointError``'s
    message joins the reasons) and nothing of it runs."""
    from loaders.llama2c import read_tokenizer  # here: loaders.llama2c imports this module (cycle)
    from loaders.sources import load_plain_pickle

    p = Path(path)
    folder = p if p.is_dir() else p.parent
    why: list[str] = []
    if llama2c:
        for name in ("tokenizer.bin", f"tok{vocab_size}.bin"):
            f = folder / name
            if not f.is_file():
                continue
            try:
                tok = read_tokenizer(f)
            except CheckpointFormatError as exc:
                why.append(str(exc))
                continue
            if len(tok) != vocab_size:
                why.append(f"{f}: {len(tok)} tokens, the model has {vocab_size}")
                continue
            return tok, why
    cfg = extras.get("config") if isinstance(extras.get("config"), dict) else {}
    for where, holder in (("the checkpoint", extras), ("the checkpoint's config", cfg),
                          ("the model config", config or {})):
        if "stoi" in holder:
            stoi, reason = _stoi(holder["stoi"], vocab_size, where)
            if stoi is not None:
                return CharVocabulary(stoi, how=f"stoi of {where}"), why
            why.append(reason)
    for f in _meta_candidates(p, cfg):
        if not f.is_file():
            continue
        try:
            meta = load_plain_pickle(f)
        except (CheckpointFormatError, OSError) as exc:      # UnsafeCheckpointError included: refused, said
            why.append(str(exc))
            continue
        stoi, reason = _stoi(meta.get("stoi") if isinstance(meta, dict) else None, vocab_size, str(f))
        if stoi is not None:
            return CharVocabulary(stoi, how=f"{f.name} characters"), why
        why.append(reason)
    return None, why
