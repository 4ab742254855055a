"""llama2.c exports (karpathy/llama2.c ``export.py``): ``model.bin`` and ``tokenizer.bin``.

Three checkpoint versions, all little-endian, told apart by content:

* **v0** (legacy; ``stories15M.bin``, ``stories260K.bin``): a header of 7 int32
  ``dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len``
  (a negative ``vocab_size`` means the classifier is not the embedding), then
  float32 tensors: ``tok_embeddings [vocab, dim]``, every layer's
  ``attention_norm [dim]``, then every ``wq [dim, dim]``, ``wk``/``wv``
  ``[kv_dim, dim]`` (``kv_dim = dim * n_kv_heads / n_heads``), ``wo [dim, dim]``,
  ``ffn_norm [dim]``, ``w1 [hidden, dim]``, ``w2 [dim, hidden]``,
  ``w3 [hidden, dim]``, then ``norm [dim]``, the rotary tables ``freqs_cos``
  and ``freqs_sin`` ``[seq_len, head_size/2]`` and, when unshared,
  ``output [vocab, dim]``.
* **v1**: a 256-byte header: uint32 magic ``0x616b3432`` ("ak42"), int32
  version 1, the 7 int32 above (vocab positive), uint8 ``shared_classifier``,
  zero padding. float32 tensors in the order: every ``attention_norm``, every
  ``ffn_norm``, ``norm``, ``tok_embeddings``, every ``wq``, ``wk``, ``wv``,
  ``wo``, ``w1``, ``w2``, ``w3``, then ``output`` when unshared.
* **v2** (Q8_0): as v1 with version 2 and an int32 ``group_size`` after the
  flag. The norms first (float32, order as v1), then the int8 values of
  ``tok_embeddings``, every ``wq``, ``wk``, ``wv``, ``wo``, ``w1``, ``w2``,
  ``w3`` (and ``output``), then their float32 scales in the same order, one
  per ``group_size`` values: ``w = q * scale``.

A file is read as a llama2.c export only when its header is consistent and
its size is exactly what the header implies (``sniff``); a ``.bin`` whose
header is plausible but whose size is not is a ``CheckpointFormatError``
saying by how much. Tensors are named as llama2.c's ``model.py`` names them
(``layers.{i}.attention.wq.weight`` ...), so the ``llama_meta`` layout reads
them, and are read one at a time with ``os.pread`` (v2: dequantised to
float32 on read; ``dtype`` reports the stored ``int8``).

``exported_from(model.bin)``: the training checkpoint beside an export whose
weights it holds (``ckpt.pt``, compared tensor by tensor), so that ingesting a
llama2.c ``out/`` folder stores one checkpoint, not two.

``tokenizer.bin``: int32 ``max_token_length``, then per token a float32
score, an int32 byte length and the UTF-8 bytes (SentencePiece's "▁" stored
as a space). ``read_tokenizer`` parses it within a byte budget;
``Llama2cTokenizer.encode`` is llama2.c's ``encode`` (``run.c``): a dummy
space prefix, one token per UTF-8 character or ``<0xXX>`` byte tokens (id
byte + 3) for characters not in the vocabulary, then repeated merging of the
adjacent pair whose joined string has the highest score. The merging runs per
word (each chunk starts at a space), which equals the whole-text result
whenever no vocabulary piece has a space after its first character.
"""
from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from loaders.budgets import budget
from loaders.errors import CheckpointFormatError
from loaders.tensor_source import TensorSource
from loaders.vocab import Vocabulary

__all__ = ["Header", "sniff", "Llama2cSource", "read_tokenizer", "is_tokenizer", "Llama2cTokenizer",
           "exported_from", "MAGIC"]

MAGIC = 0x616B3432
_V0_HEADER = 28
_V12_HEADER = 256
_NAMES = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
#: Bounds for a header to be a plausible llama2.c v0 export (a guess below them is "unknown").
_PLAUSIBLE = 1 << 20
#: The biggest tokenizer.bin read (Llama 2's is 0.4 MB; a 128k vocabulary about 2 MB).


@dataclass(frozen=True)
class Header:
    version: int
    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int                 # positive
    seq_len: int
    shared_classifier: bool
    group_size: int | None = None   # v2 only

    @property
    def data_start(self) -> int:
        return _V0_HEADER if self.version == 0 else _V12_HEADER

    @property
    def kv_dim(self) -> int:
        return self.dim * self.n_kv_heads // self.n_heads

    @property
    def head_size(self) -> int:
        return self.dim // self.n_heads

    def config(self) -> dict:
        """The model configuration, with llama2.c ``ModelArgs`` names."""
        return {"dim": self.dim, "hidden_dim": self.hidden_dim, "n_layers": self.n_layers,
                "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads, "vocab_size": self.vocab_size,
                "max_seq_len": self.seq_len, "shared_classifier": self.shared_classifier}


def _problems(h: Header) -> list[str]:
    out = []
    for name in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"):
        if getattr(h, name) <= 0:
            out.append(f"{name} {getattr(h, name)} is not positive")
    if out:
        return out
    if h.dim % h.n_heads:
        out.append(f"dim {h.dim} is not divisible by n_heads {h.n_heads}")
    if h.n_kv_heads > h.n_heads or h.n_heads % h.n_kv_heads:
        out.append(f"n_kv_heads {h.n_kv_heads} does not divide n_heads {h.n_heads}")
    if h.version == 0 and h.head_size % 2:
        out.append(f"head size {h.head_size} is odd (the rotary tables need pairs)")
    if h.version == 2 and (h.group_size is None or h.group_size <= 0):
        out.append(f"group_size {h.group_size} is not positive")
    return out


def _plan(h: Header) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, kind) in file order; kind ``f32`` or ``q8`` (v2 int8 + scales)."""
    L, D, H, V, kv = h.n_layers, h.dim, h.hidden_dim, h.vocab_size, h.kv_dim

    def per_layer(stem: str, shape):
        return [(f"layers.{i}.{stem}.weight", shape) for i in range(L)]

    att_norm, ffn_norm = per_layer("attention_norm", (D,)), per_layer("ffn_norm", (D,))
    mats = [*per_layer("attention.wq", (D, D)), *per_layer("attention.wk", (kv, D)),
            *per_layer("attention.wv", (kv, D)), *per_layer("attention.wo", (D, D))]
    ffn = [*per_layer("feed_forward.w1", (H, D)), *per_layer("feed_forward.w2", (D, H)),
           *per_layer("feed_forward.w3", (H, D))]
    emb, out, norm = ("tok_embeddings.weight", (V, D)), ("output.weight", (V, D)), ("norm.weight", (D,))
    cls = [] if h.shared_classifier else [out]
    if h.version == 0:
        half = (h.seq_len, h.head_size // 2)
        order = [emb, *att_norm, *mats, *ffn_norm, *ffn, norm, ("freqs_cos", half), ("freqs_sin", half), *cls]
        return [(n, s, "f32") for n, s in order]
    norms = [(n, s, "f32") for n, s in (*att_norm, *ffn_norm, norm)]
    weights = [emb, *mats, *ffn, *cls]
    return norms + [(n, s, "f32" if h.version == 1 else "q8") for n, s in weights]


def _layout(h: Header) -> tuple[dict[str, tuple], int]:
    """name -> (shape, kind, offset, scale_offset) and the file size the header implies."""
    entries: dict[str, tuple] = {}
    pos = h.data_start
    q8 = []
    for name, shape, kind in _plan(h):
        n = math.prod(shape)
        if kind == "f32":
            entries[name] = (shape, kind, pos, None)
            pos += 4 * n
        else:
            entries[name] = (shape, kind, pos, None)
            q8.append((name, n))
            pos += n
    for name, n in q8:                                   # the scales follow every int8 block
        shape, kind, off, _ = entries[name]
        entries[name] = (shape, kind, off, pos)
        pos += 4 * (n // h.group_size)
    return entries, pos


def _read_head(p: Path) -> tuple[bytes, int]:
    size = p.stat().st_size
    with open(p, "rb") as f:
        return f.read(_V12_HEADER), size


def _parse(head: bytes) -> Header | None:
    """The header, if the first bytes are one (v1/v2 by magic, else v0); no size check."""
    if len(head) >= 8 and struct.unpack_from("<I", head, 0)[0] == MAGIC:
        version = struct.unpack_from("<i", head, 4)[0]
        if len(head) < _V12_HEADER:
            return Header(version, *([0] * 7), False)
        vals = struct.unpack_from("<7i", head, 8)
        shared = bool(head[36])
        group = struct.unpack_from("<i", head, 37)[0] if version == 2 else None
        return Header(version, *vals, shared, group)
    if len(head) < _V0_HEADER:
        return None
    vals = list(struct.unpack_from("<7i", head, 0))
    shared = vals[5] > 0
    vals[5] = abs(vals[5])
    return Header(0, *vals, shared)


def sniff(p: Path) -> Header | None:
    """The header of a llama2.c export whose size matches it exactly, else None.

    Raises ``CheckpointFormatError`` for a file that is one but is broken: the
    "ak42" magic with an unknown version, an inconsistent header or the wrong
    size; a ``.bin`` whose v0 header is plausible (every field in 1..2^20,
    divisible head counts) but whose size is not what it implies (truncated)."""
    head, size = _read_head(p)
    h = _parse(head)
    if h is None:
        return None
    magic = h.version != 0 or (len(head) >= 4 and struct.unpack_from("<I", head, 0)[0] == MAGIC)
    if magic:
        if h.version not in (1, 2):
            raise CheckpointFormatError(
                p, f"llama2.c export (magic \"ak42\") of version {h.version}; qkvscope reads versions 0, 1 and 2")
        if size < _V12_HEADER:
            raise CheckpointFormatError(
                p, f"llama2.c v{h.version} export is {size} bytes, shorter than its 256-byte header; "
                   "the file is truncated")
    problems = _problems(h)
    if problems:
        if magic:
            raise CheckpointFormatError(p, f"llama2.c v{h.version} header is inconsistent: {'; '.join(problems)}")
        return None
    if not magic and not all(getattr(h, n) <= _PLAUSIBLE for n in ("dim", "hidden_dim", "n_layers", "n_heads",
                                                                      "n_kv_heads", "vocab_size", "seq_len")):
        return None
    entries, need = _layout(h)
    if h.version == 2:
        bad = [n for n, (shape, kind, _, _) in entries.items() if kind == "q8" and math.prod(shape) % h.group_size]
        if bad:
            raise CheckpointFormatError(
                p, f"llama2.c v2 group_size {h.group_size} does not divide the size of {bad[0]}")
    if need == size:
        return h
    if magic or p.suffix.lower() == ".bin":
        fields = ", ".join(f"{n} {getattr(h, n)}" for n in ("dim", "hidden_dim", "n_layers", "n_heads",
                                                              "n_kv_heads", "vocab_size", "seq_len"))
        what = "truncated" if size < need else "longer than its tensors"
        raise CheckpointFormatError(
            p, f"llama2.c v{h.version} header ({fields}{', unshared classifier' if not h.shared_classifier else ''}) "
               f"implies {need:,} bytes but the file has {size:,}: {what}")
    return None


class Llama2cSource(TensorSource):
    """A llama2.c ``.bin`` export; one tensor read per ``get`` (module docstring)."""

    def __init__(self, path: str | Path, header: Header | None = None):
        from loaders.sources import _identity  # here: loaders.sources imports this module (cycle)

        p = Path(path)
        h = header or sniff(p)
        if h is None:
            raise CheckpointFormatError(p, "is not a llama2.c export (no header that matches the file size)")
        self.path, self._file, self.header = str(p), p, h
        self.format = f"llama2c-v{h.version}"
        self._entries, _ = _layout(h)
        self._stat = _identity(p)
        self.config = h.config()
        self.extras = {"llama2c_version": h.version}
        if h.version == 2:
            self.extras.update(quantization="Q8_0", group_size=h.group_size)
        self._fd: int | None = os.open(p, os.O_RDONLY)

    def keys(self) -> list[str]:
        return list(self._entries)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._entry(key)[0])

    def dtype(self, key: str) -> str:
        return "int8" if self._entry(key)[1] == "q8" else "float32"

    def get(self, key: str) -> torch.Tensor:
        """The tensor as float32 (v2: ``int8 * scale`` per group of ``group_size``)."""
        from loaders.sources import _check_no_hole, _check_unchanged  # here: a cycle, as above

        shape, kind, off, scale_off = self._entry(key)
        if self._fd is None:
            raise ValueError(f"{self.path}: source is closed")
        _check_unchanged(self._file, self._stat, os.fstat(self._fd), key)
        n = math.prod(shape)
        if kind == "f32":
            _check_no_hole(self._file, self._fd, key, off, 4 * n)
            return torch.frombuffer(self._read(key, off, 4 * n), dtype=torch.float32).reshape(shape)
        g = self.header.group_size
        _check_no_hole(self._file, self._fd, key, off, n)
        q = torch.frombuffer(self._read(key, off, n), dtype=torch.int8)                 # [n]
        s = torch.frombuffer(self._read(key, scale_off, 4 * (n // g)), dtype=torch.float32)  # [n/g]
        return (q.view(-1, g).float() * s[:, None]).reshape(shape)   # (n/g, g) -> shape

    def _read(self, key: str, offset: int, n: int) -> bytearray:
        if n == 0:
            return bytearray(4)[:0]
        try:
            buf = bytearray(n)
        except MemoryError:
            raise CheckpointFormatError(
                self._file, f"llama2.c tensor '{key}' needs {n:,} bytes, more memory than this process "
                            f"may use") from None
        view, done = memoryview(buf), 0
        while done < n:
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got == 0:
                raise CheckpointFormatError(
                    self._file, f"llama2.c file ended while reading tensor '{key}' (it shrank after it "
                                f"was opened)")
            done += got
        return buf

    def _entry(self, key: str) -> tuple:
        try:
            return self._entries[key]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {key!r}") from None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---- tokenizer.bin ---------------------------------------------------------------------

class Llama2cTokenizer(Vocabulary):
    """llama2.c's tokenizer (``run.c`` ``encode``; module docstring). ``pieces[i]`` is token
    i's text, ``scores[i]`` its merge score."""

    how = "tokenizer.bin"

    def __init__(self, pieces: list[str], scores: list[float], *, path: str = "<memory>"):
        self.pieces_, self.scores, self.path = pieces, scores, path
        self._id = {}
        for i, piece in enumerate(pieces):
            self._id.setdefault(piece, i)                # run.c's lookup finds the first
        self._cache: dict[str, list[int]] = {}

    def __len__(self) -> int:
        return len(self.pieces_)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS), with llama2.c's dummy space prefix."""
        if not text:
            return []
        text = " " + text if " " in self._id else text
        out: list[int] = []
        start = 0
        for i in range(1, len(text) + 1):                # a chunk ends before a space that follows a non-space
            if i == len(text) or (text[i] == " " and text[i - 1] != " "):
                chunk = text[start:i]
                ids = self._cache.get(chunk)
                if ids is None:
                    ids = self._merge(chunk)
                    if len(self._cache) < 100_000:
                        self._cache[chunk] = ids
                out += ids
                start = i
        return out

    def _merge(self, chunk: str) -> list[int]:
        ids: list[int] = []
        for ch in chunk:
            tid = self._id.get(ch)
            if tid is not None:
                ids.append(tid)
            else:                                        # byte fallback: <0xXX> tokens are ids 3..258
                ids += [b + 3 for b in ch.encode("utf-8") if b + 3 < len(self.pieces_)]
        while len(ids) > 1:
            best, at = -math.inf, -1
            for j in range(len(ids) - 1):
                tid = self._id.get(self.pieces_[ids[j]] + self.pieces_[ids[j + 1]])
                if tid is not None and self.scores[tid] > best:
                    best, at, merged = self.scores[tid], j, tid
            if at < 0:
                break
            ids[at:at + 2] = [merged]
        return ids

    def pieces(self, ids: list[int]) -> list[str]:
        return [self.pieces_[i] if 0 <= i < len(self.pieces_) else f"#{i}" for i in ids]


def _parse_tokenizer(p: Path, raw: bytes) -> tuple[list[str], list[float]]:
    if len(raw) < 4:
        raise CheckpointFormatError(p, f"llama2.c tokenizer is {len(raw)} bytes, shorter than its 4-byte header")
    max_len = struct.unpack_from("<i", raw, 0)[0]
    if not 0 < max_len <= 1024:
        raise CheckpointFormatError(p, f"llama2.c tokenizer max_token_length {max_len} is not in 1..1024")
    pos, pieces, scores = 4, [], []
    while pos < len(raw):
        if pos + 8 > len(raw):
            raise CheckpointFormatError(
                p, f"llama2.c tokenizer ends inside the header of token {len(pieces)} (byte {pos:,}): truncated")
        score, n = struct.unpack_from("<fi", raw, pos)
        if not 0 <= n <= max_len or pos + 8 + n > len(raw):
            raise CheckpointFormatError(
                p, f"llama2.c tokenizer token {len(pieces)} has length {n} at byte {pos:,} (max_token_length "
                   f"{max_len}, {len(raw) - pos - 8:,} bytes left): truncated or not a tokenizer")
        pieces.append(raw[pos + 8:pos + 8 + n].decode("utf-8", errors="replace"))
        scores.append(float(score))
        pos += 8 + n
    if not pieces:
        raise CheckpointFormatError(p, "llama2.c tokenizer holds no tokens")
    return pieces, scores


def read_tokenizer(path: str | Path) -> Llama2cTokenizer:
    """Parse a ``tokenizer.bin`` (at most the ``QKVSCOPE_TOKENIZER_BYTES`` budget); ``CheckpointFormatError`` otherwise."""
    p = Path(path)
    size = p.stat().st_size
    limit = budget("QKVSCOPE_TOKENIZER_BYTES")
    if size > limit:
        raise CheckpointFormatError(
            p, f"llama2.c tokenizer is {size:,} bytes, over the budget of {limit:,} (QKVSCOPE_TOKENIZER_BYTES; "
               "set it in the environment to raise it)")
    pieces, scores = _parse_tokenizer(p, p.read_bytes())
    return Llama2cTokenizer(pieces, scores, path=str(p))


def is_tokenizer(path: str | Path) -> bool:
    """Whether ``path`` parses as a llama2.c ``tokenizer.bin`` (used to keep it out of checkpoint
    counts). A llama2.c checkpoint (``sniff``) is answered from its header, without reading it."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(12)
        if len(head) < 12 or not 0 < struct.unpack_from("<i", head, 0)[0] <= 1024:
            return False
        try:
            if sniff(p) is not None:
                return False
        except CheckpointFormatError:
            return False
        read_tokenizer(p)
    except (CheckpointFormatError, OSError):
        return False
    return True


# ---- an export beside the checkpoint it was exported from ---------------------------------

#: What a llama2.c export holds beyond the model's parameters: the rotary tables (v0), which
#: llama2.c's ``model.py`` keeps in non-persistent buffers, absent from ``ckpt.pt``.
_EXPORT_ONLY = ("freqs_cos", "freqs_sin")
#: Training-checkpoint suffixes an export's source may have (``.bin`` is the export's own).
_TRAINING_SUFFIXES = (".pt", ".pth", ".ckpt")


def exported_from(export: str | Path) -> Path | None:
    """The training checkpoint beside llama2.c export ``export`` whose weights it holds, else None.

    llama2.c's ``export.py`` writes ``model.bin`` from the ``ckpt.pt`` its ``train.py`` saved
    (``load_checkpoint``: ``model_args`` and ``model`` with ``_orig_mod.`` stripped), every
    parameter under its ``model.py`` name as float32 (``serialize_fp32``), the names this
    module gives the export's tensors. So the two are the same weights exactly when every
    tensor of the export but the rotary tables equals the checkpoint's tensor of that name,
    cast to float32: compared one tensor at a time, bit for bit, after a header check (the
    seven ``ModelArgs`` fields against ``model_args``). A Q8_0 (v2) export is never the same
    weights (it is rounded), nor is a file of other content. Candidates: the folder's
    ``.pt``/``.pth``/``.ckpt`` files, in name order; one that cannot be read is no match
    (its own ingest says why)."""
    # here: a real import cycle (loaders.sources opens llama2.c files with this module)
    from loaders.sources import open_source

    export = Path(export)
    header = sniff(export)
    if header is None or header.version == 2:
        return None
    for cand in sorted(p for p in export.parent.iterdir() if p.suffix.lower() in _TRAINING_SUFFIXES):
        try:
            with open_source(export) as a, open_source(cand) as b:
                if _same_tensors(header, a, b):
                    return cand
        except (CheckpointFormatError, OSError):
            continue
    return None


def _same_tensors(header: Header, export: TensorSource, source: TensorSource) -> bool:
    conf = source.config or {}
    fields = {"dim": header.dim, "n_layers": header.n_layers, "n_heads": header.n_heads,
              "vocab_size": header.vocab_size, "max_seq_len": header.seq_len}
    if any(conf.get(k) is not None and conf.get(k) != v for k, v in fields.items()):
        return False
    have = set(source.keys())
    names = [k for k in export.keys() if k not in _EXPORT_ONLY]
    if any(k not in have or tuple(source.shape(k)) != tuple(export.shape(k)) for k in names):
        return False
    return all(torch.equal(export.get(k), source.get(k).to(torch.float32)) for k in names)
