"""Jobs: run an analysis over a stored checkpoint and store its results.

``analyze(store, checkpoint_id, activations=False, device=None, progress=None)``
opens the checkpoint (``loaders.checkpoints.open_checkpoint``), runs the
weight-level metrics layer by layer (``analysis.weights``), optionally a
forward pass for the activation metrics (``analysis.activations``), and
writes ``analysis_results`` rows plus one ``analysis_jobs`` row per kind
(``weights`` / ``activations``) in one transaction. The job row is the cache
key: the same checkpoint, kind and ``analysis.registry.METRIC_VERSION`` again
is a cache hit that reads the stored rows and computes nothing. Its ``notes``
JSON says why each absent metric is absent.

Forward passes: Hugging Face folders (and zips of one, extracted by
``loaders.sources``) run through ``transformers`` (eager
attention; every ``from_pretrained`` with ``trust_remote_code=False``, and a
folder that names model code, ``auto_map`` or ``.py`` files, is not run at
all: weight metrics only, with the note "model code beside the checkpoint is
never run"), this project's own checkpoints through
``experiments.train.load_checkpoint``, and nanoGPT (with LayerNorm or RMSNorm,
GELU or SwiGLU MLPs), llama2.c / Meta Llama (``ckpt.pt`` and llama2.c ``.bin``
exports), the query-free paper's and the projection-sharing paper's
checkpoints as the project's GPT (``experiments.foreign.runnable``). Their
text goes through the vocabulary found beside them (``loaders.vocab``: a
llama2.c ``tokenizer.bin``, a ``stoi`` in the checkpoint, nanoGPT's
``meta.pkl`` read without unpickling code), else UTF-8 bytes when the
vocabulary has 256 ids or more, else (and always for Llama vocabularies, whose
ids are not bytes) token ids sampled uniformly with a fixed seed, which every
activation note then says. A forward pre-hook on each layer's
attention module records the attention input ``x`` (already normalised where
the model normalises); the caches and logits are then ``x W_K + b_K``,
``x W_V + b_V`` and ``(x W_Q + b_Q)(x W_K + b_K)^T`` from the canonical
weights, so every layout gets the same definitions. The keys are the
un-rotated ones: for rotary or ALiBi positions the logits would not be the
model's, so ``logit_symmetry`` is left out with that reason.

The activation metrics (``corpus_activations``) run on a corpus: the bundled
one (``data/corpus``) or ``SampleSpec.text``, cut into windows of the model's
context, ``DEFAULT_TOKENS`` (at least ``TOKENS_PER_COLUMN * d_head``) tokens
in total, batched; every row carries its chance level, ``n_tokens`` and a
bootstrap interval over windows (``analysis.activations``). The Inspector's
attention maps (``capture_activations``) still run on one short editable
sample text (``SAMPLE_TEXT``, at most ``MAX_TOKENS`` tokens).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd
import torch

from analysis.chance import attach_weight_chance
from analysis.registry import BY_NAME, COLUMNS, METRIC_VERSION, RESULT_COLUMNS, names
from analysis.variants import PLUS
from analysis.weights import default_device, weight_metrics
from loaders.canonical import Checkpoint
from loaders.errors import QkvscopeError, StoreError
from loaders.results import replace_results, stored_job
from loaders.store import Store

Progress = Callable[[int, int, str], None]  # (done, total, what is being done)
Opener = Callable[[str], Checkpoint]

#: Default sample text of the Inspector's attention maps (English prose, ~80 tokens of BERT's vocabulary).
SAMPLE_TEXT = (
    "The quick brown fox jumps over the lazy dog while the researcher asks whether "
    "attention needs separate queries, keys and values. Each layer reads the residual "
    "stream, compares every token with every earlier token and mixes their values; "
    "if keys and values carry the same information, one of them could be dropped."
)
MAX_TOKENS = 64


class NoForwardPass(Exception):
    """This checkpoint cannot be run; ``str()`` is the reason stored in the notes."""


@dataclass
class LayerCapture:
    """What one layer saw on the sample tokens (batch of one)."""

    layer: int
    k: torch.Tensor                     # [n_kv_heads, T, d_head], un-rotated keys
    v: torch.Tensor                     # [n_kv_heads, T, d_head]
    logits: torch.Tensor | None         # [n_heads, T, T], pre-softmax, before the mask, unscaled
    attn: torch.Tensor | None           # [n_heads, T, T], the model's attention probabilities


@dataclass
class Capture:
    tokens: list[str]                   # the sample tokens as text, for plot axes
    tokenizer: str                      # 'tokenizer', 'bytes', 'sampled ids' or a vocabulary's name
    layers: list[LayerCapture]
    logits_reason: str | None = None    # why logits are None, if they are


@dataclass
class JobResult:
    checkpoint_id: int
    path: str
    kind: str                           # 'weights' or 'activations'
    frame: pd.DataFrame                 # columns analysis.registry.COLUMNS
    notes: dict[str, str] = field(default_factory=dict)
    cached: bool = False
    seconds: float = 0.0
    device: str | None = None
    sample: dict | None = None          # activations: what they ran on (SampleSpec.key() and counts)
    tied: dict | None = None            # weights: {"variant", "layers"} read from the tensors (analysis.tied)


# -- pure computation over an opened checkpoint --------------------------------------
def _merge_notes(into: dict[str, str], new: dict[str, str]) -> None:
    for k, v in new.items():
        into.setdefault(k, v)


def _nonfinite_notes(frame: pd.DataFrame, notes: dict[str, str]) -> None:
    bad = frame[~frame["value"].map(lambda x: x is not None and math.isfinite(x))]
    for metric, grp in bad.groupby("metric", sort=True):
        labels = ", ".join(grp["head_label"].tolist()[:8]) + (" ..." if len(grp) > 8 else "")
        msg = f"undefined (zero norm or singular matrix) at {labels}"
        # a metric can already carry a note about rows that are absent (e.g. the
        # per-layer erank_o); keep both rather than hide the undefined heads
        notes[metric] = f"{notes[metric]}; {msg}" if metric in notes else msg


def weight_frame(ckpt: Checkpoint, *, device: str | None = None, progress: Progress | None = None,
                 layers: range | None = None,
                 nonfinite_notes: bool = True) -> tuple[pd.DataFrame, dict[str, str]]:
    """Every weight-level metric of every layer of ``ckpt``; one layer in memory at a time.

    ``layers`` (a ``range`` of layer indices) computes only those layers, reading
    only their tensors; the rows are the same as the whole checkpoint's rows of
    those layers. ``nonfinite_notes=False`` leaves out the notes that name the
    heads with undefined values: a caller that joins several layer ranges adds
    them once over the joined frame (``app.batch``), so its notes equal the
    whole checkpoint's.
    """
    frames, notes = [], {}
    todo = range(ckpt.meta.n_layers) if layers is None else layers
    n = len(todo)
    pairs = zip(todo, ckpt.layers()) if layers is None else ((i, ckpt.layer(i)) for i in todo)
    for done, (i, layer) in enumerate(pairs):
        if progress:
            progress(done, n, f"weights layer {i}")
        # each layer with its own tower's geometry (a CLIP's vision and text towers differ)
        lm = ckpt.meta.layer_meta(i)
        df, nt = weight_metrics(layer, lm, device=device)
        # chance levels: the same metrics of independent Gaussian projections of these shapes
        # (computed once per shape and process, see analysis.chance)
        frames.append(attach_weight_chance(df, lm, query_free=ckpt.meta.variant == "wq_identity",
                                           device=device))
        _merge_notes(notes, nt)
    if progress:
        progress(n, n, "weights done")
    frame = pd.concat(frames, ignore_index=True) if frames else \
        attach_weight_chance(pd.DataFrame(columns=COLUMNS), ckpt.meta, query_free=False, device=device)
    # layout notes first, undefined-value notes after: a batch's layer groups join to the same text
    _layout_notes(notes, ckpt.meta, frame)
    if nonfinite_notes:
        _nonfinite_notes(frame, notes)
    return frame, notes


def _layout_notes(notes: dict[str, str], meta, frame: pd.DataFrame) -> None:
    """The layout's notes on metrics its conventions change (QK-norm gains applied after W_Q/W_K,
    MLA's composed K/V maps), for the metrics present in ``frame``."""
    present = set(frame["metric"]) if len(frame) else set()
    for metric, text in (getattr(meta, "notes", None) or {}).items():
        if metric in present and text not in notes.get(metric, ""):
            notes[metric] = f"{notes[metric]}; {text}" if metric in notes else text


_TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "tokenizer.model", "spiece.model")


#: Why a folder with model code is analysed from its weights alone.
REMOTE_CODE_NOTE = "model code beside the checkpoint is never run"
#: The biggest config.json read to look for model code (a real one is a few KB).
_CONFIG_BYTES = 4 * 2**20


def model_code_reason(path: Path) -> str | None:
    """Why ``path`` (a Hugging Face folder) must not go through ``transformers``: its
    ``config.json``/``tokenizer_config.json`` names model code (``auto_map``), or ``.py``
    files lie beside the checkpoint; None when neither. Nothing of it is imported."""
    found = []
    for name in ("config.json", "tokenizer_config.json"):
        f = path / name
        try:
            if f.is_file() and f.stat().st_size <= _CONFIG_BYTES and '"auto_map"' in f.read_text(
                    encoding="utf-8", errors="replace"):
                found.append(f"{name} has auto_map")
        except OSError:
            continue
    py = sorted(p.name for p in path.iterdir() if p.suffix == ".py") if path.is_dir() else []
    if py:
        found.append(f"{', '.join(py[:3])}{' ...' if len(py) > 3 else ''} beside it")
    if not found:
        return None
    return f"{path}: {REMOTE_CODE_NOTE} ({'; '.join(found)}); weight-level metrics only"


def _hf_model(path: Path):
    import transformers

    reason = model_code_reason(path)
    if reason is not None:
        raise NoForwardPass(reason)
    # Every from_pretrained says trust_remote_code=False: transformers would otherwise ask on
    # stdin whether to run code named by the config (and run it on "y").
    try:
        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True,
                                                         trust_remote_code=False)
        model = transformers.AutoModel.from_pretrained(
            str(path), config=config, local_files_only=True, trust_remote_code=False,
            attn_implementation="eager", dtype=torch.float32)
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise NoForwardPass(f"{path}: transformers cannot build this model ({exc}); "
                            "weight-level metrics only") from exc
    tok = None
    # AutoTokenizer builds an empty tokenizer from config.json alone: require its files.
    if any((path / f).is_file() for f in _TOKENIZER_FILES):
        try:
            tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True,
                                                             trust_remote_code=False)
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            tok = None
    return model.eval(), tok, int(getattr(config, "vocab_size", 256) or 256)


def _own_model(path: Path):
    from experiments.train import load_checkpoint     # here: torch and the trainer load only for a forward pass

    model = load_checkpoint(path)
    return model.eval(), None, int(model.cfg.vocab_size)


def _attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The outermost modules whose class name ends in 'Attention', in layer order."""
    found: list[tuple[str, torch.nn.Module]] = []
    for name, mod in model.named_modules():
        if not type(mod).__name__.endswith("Attention"):
            continue
        if any(name.startswith(p + ".") for p, _ in found):
            continue
        found.append((name, mod))
    return [m for _, m in found]


#: Layouts ``experiments.foreign`` rebuilds as the project's GPT.
_FOREIGN = ("nanogpt", "query_free", "projection_sharing", "llama_meta")


def _where(src, path: Path) -> Path:
    """The folder or file a source was read from: a zip's extracted member, else ``path``."""
    tmp = getattr(src, "extracted_to", None)
    if tmp is not None:
        return tmp / src.extras.get("zip_member", ".")
    return path


def _vocabulary(arch: str, where: Path, src, vocab: int):
    """The checkpoint's ``loaders.vocab`` vocabulary; else None (UTF-8 bytes) for a vocabulary
    of 256 ids or more, or ``SampledIds`` (Llama ids are not bytes; below 256 bytes do not fit)."""
    from loaders.vocab import SampledIds, find_vocabulary

    found, why = find_vocabulary(where, extras=dict(src.extras or {}), config=dict(src.config or {}),
                                 vocab_size=vocab, llama2c=arch == "llama_meta")
    if found is not None:
        return found
    if arch != "llama_meta" and vocab >= 256:
        return None
    looked = ("a llama2.c tokenizer.bin / tok{vocab}.bin, a stoi or a meta.pkl" if arch == "llama_meta"
              else "a stoi in the checkpoint or a meta.pkl beside it")
    reason = f"no vocabulary found ({looked}{': ' + '; '.join(why) if why else ''})"
    return SampledIds(vocab, reason)


def _foreign_model(ckpt: Checkpoint):
    """nanoGPT / Llama / query-free / projection-sharing weights, re-read whole, as a GPT,
    with the vocabulary found beside them."""
    from experiments.foreign import ForeignCheckpointError, runnable
    from loaders.sources import open_source

    meta = ckpt.meta
    src = open_source(ckpt.path)
    try:
        sd, config = {k: src.get(k) for k in src.keys()}, dict(src.config or {})
        try:
            model = runnable(meta.architecture, sd, config, variant=meta.variant, n_heads=meta.n_heads,
                             n_kv_heads=meta.n_kv_heads, attn_scale=meta.attn_scale, norm=meta.norm)
        except ForeignCheckpointError as exc:
            raise NoForwardPass(f"{ckpt.path}: {exc}; weight-level metrics only") from exc
        vocab = int(model.cfg.vocab_size)
        tok = _vocabulary(meta.architecture, _where(src, Path(ckpt.path)), src, vocab)
    finally:
        src.close()
    return model.eval(), tok, vocab


def _hf_zip_model(path: Path):
    """A zip of a Hugging Face folder: extracted (``loaders.sources.ZipSource``), run from
    the extracted folder (the model-code refusal included), the folder deleted after loading."""
    from loaders.sources import open_source

    src = open_source(path)
    try:
        root = _where(src, path)
        if not (root.is_dir() and (root / "config.json").is_file()):
            return None
        reason = model_code_reason(root)
        if reason is not None:
            member = src.extras.get("zip_member", ".")
            raise NoForwardPass(reason.replace(str(root), f"{path} (member {member})", 1))
        try:
            return _hf_model(root)
        except NoForwardPass as exc:
            raise NoForwardPass(str(exc).replace(str(root), str(path))) from exc
    finally:
        src.close()


def _load_runnable(ckpt: Checkpoint):
    path = Path(ckpt.path)
    arch = ckpt.meta.architecture
    if arch in _FOREIGN:
        return _foreign_model(ckpt)
    if path.is_dir() and (path / "config.json").is_file():
        return _hf_model(path)
    if path.suffix == ".safetensors" and arch == "qkvscope":
        return _own_model(path)
    if path.is_file() and path.suffix.lower() == ".zip":
        loaded = _hf_zip_model(path)
        if loaded is not None:
            return loaded
    raise NoForwardPass(
        f"{path}: no forward pass for a {arch} checkpoint (runnable: Hugging Face folders with "
        "config.json and zips of them, this project's own checkpoints, nanoGPT, llama2.c/Meta Llama, "
        "query-free and projection-sharing language models); weight-level metrics only")


def _tokens(text: str, tok, vocab: int, max_tokens: int) -> tuple[torch.Tensor, list[str], str]:
    from loaders.vocab import SampledIds, Vocabulary

    if isinstance(tok, Vocabulary):
        ids = tok.sample(max_tokens) if isinstance(tok, SampledIds) else tok.encode(text)[:max_tokens]
        if len(ids) < 2:
            raise NoForwardPass(f"the {tok.how} vocabulary turned the sample text into {len(ids)} tokens")
        return torch.tensor(ids, dtype=torch.long), tok.pieces(ids), tok.how
    if tok is not None:
        enc = tok(text, return_tensors="pt", truncation=True, max_length=max_tokens)
        ids = enc["input_ids"][0]
        if ids.numel() < 2:
            raise NoForwardPass(f"the tokenizer turned the sample text into {ids.numel()} tokens")
        return ids, tok.convert_ids_to_tokens(ids.tolist()), "tokenizer"
    raw = list(text.encode("utf-8"))[:max_tokens]
    if vocab < 256:
        raise NoForwardPass(f"no tokenizer and vocab_size {vocab} < 256: cannot feed UTF-8 bytes")
    return torch.tensor(raw), [bytes([b]).decode("latin-1") for b in raw], "bytes"


def capture_activations(ckpt: Checkpoint, *, text: str = SAMPLE_TEXT, max_tokens: int = MAX_TOKENS,
                        device: str | None = None) -> Capture:
    """Run ``ckpt`` on ``text`` and capture, per layer, K, V, logits and attention maps.

    Raises ``NoForwardPass`` with the reason when the checkpoint cannot be run.
    """
    meta = ckpt.meta
    dev = torch.device(device or default_device())
    model, tok, vocab = _load_runnable(ckpt)
    mods = _attention_modules(model)
    if len(mods) != meta.n_layers:
        raise NoForwardPass(f"{ckpt.path}: found {len(mods)} attention modules in the model, "
                            f"expected {meta.n_layers} (one per layer)")
    cfg = getattr(model, "cfg", None)          # the project's GPT: learned positions cap the sample
    if getattr(cfg, "task", "language") == "image":
        raise NoForwardPass(f"{ckpt.path}: a vision model reads images, not text: its attention maps over a "
                            "sample text do not exist (its activation metrics run on images: "
                            "python -m app analyze PATH --activations)")
    if cfg is not None and getattr(cfg, "positions", None) == "learned":
        max_tokens = min(max_tokens, cfg.block_size)
    max_tokens = min(max_tokens, _context(model))
    # the project's GPT with rotary positions (llama2.c / Meta Llama, own rotary runs): its
    # attention is softmax(rot(q) rot(k)^T * scale) with experiments.model.rotary on the
    # canonical q and k (same interleaved pair order), so the maps are the model's own
    own_rotary = cfg is not None and getattr(cfg, "positions", None) == "rotary"
    ids, token_text, how = _tokens(text, tok, vocab, max_tokens)
    inputs: dict[int, torch.Tensor] = {}

    def hook_for(i):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs.get("hidden_states")
            inputs[i] = x.detach()
        return hook

    handles = [m.register_forward_pre_hook(hook_for(i), with_kwargs=True) for i, m in enumerate(mods)]
    model = model.to(dev)
    try:
        with torch.inference_mode():
            hf = type(model).__module__.startswith("transformers")   # also transformers_modules.*
            kwargs = {"output_attentions": True} if hf else {}
            out = model(ids[None, :].to(dev), **kwargs)
    finally:
        for h in handles:
            h.remove()
    hf_attn = getattr(out, "attentions", None)
    rope = meta.positions not in ("learned", "none")
    reason = (f"positions are {meta.positions}: logits of the un-rotated q and k are not the "
              "model's logits") if rope else None
    layers = []
    with torch.inference_mode():
        for i, layer in enumerate(ckpt.layers()):
            x = inputs[i][0].float().to(dev)                                  # [T, d_model]
            k = torch.einsum("td,gde->gte", x, layer.W_K.float().to(dev))     # [G, T, d_head]
            v = torch.einsum("td,gde->gte", x, layer.W_V.float().to(dev))
            if layer.b_K is not None:
                k = k + layer.b_K.float().to(dev)[:, None, :]
            if layer.b_V is not None:
                v = v + layer.b_V.float().to(dev)[:, None, :]
            logits = attn = None
            if not rope or own_rotary:
                if layer.W_Q is None:                                          # identity slices
                    q = x.view(x.shape[0], meta.n_heads, meta.d_head).permute(1, 0, 2)
                else:
                    q = torch.einsum("td,hde->hte", x, layer.W_Q.float().to(dev))
                if layer.b_Q is not None:
                    q = q + layer.b_Q.float().to(dev)[:, None, :]
                group = meta.n_heads // meta.n_kv_heads
                if not rope:
                    logits = q @ k.repeat_interleave(group, 0).mT             # [H, T, T]
                else:
                    from experiments.model import rotary

                    qr = rotary(q[None], 0, cfg.rope_base)[0]                  # [H, T, d_head]
                    kr = rotary(k[None], 0, cfg.rope_base)[0]                  # [G, T, d_head]
                    T = qr.shape[1]
                    mask = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
                    rot = (qr @ kr.repeat_interleave(group, 0).mT) * cfg.attn_scale   # [H, T, T]
                    attn = rot.masked_fill(~mask, float("-inf")).softmax(-1)
            if hf_attn is not None:
                attn = hf_attn[i][0].float()
            elif logits is not None and attn is None:                          # own causal model
                T = logits.shape[-1]
                mask = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
                attn = (logits * meta.attn_scale).masked_fill(~mask, float("-inf")).softmax(-1)
            layers.append(LayerCapture(i, k.cpu(), v.cpu(), None if logits is None else logits.cpu(),
                                       None if attn is None else attn.cpu()))
    return Capture(token_text, how, layers, reason)


def tied_checkpoint(ckpt: Checkpoint, *, device: str | None = None) -> dict:
    """Which projections are tied, read from the tensors layer by layer (``analysis.tied``):
    ``{"variant": tied variant, "layout_variant": the layout's, "agree": bool, "layers": [...]}``."""
    from analysis.tied import tied_layer, tied_variant

    layers = [tied_layer(layer, ckpt.meta.layer_meta(layer.layer), device=device) for layer in ckpt.layers()]
    variant = tied_variant(layers)
    return {"variant": variant, "layout_variant": ckpt.meta.variant,
            "agree": variant == ckpt.meta.variant, "layers": layers}


# -- activation metrics on a corpus sample ------------------------------------------
#: Tokens behind the activation metrics by default (at least TOKENS_PER_COLUMN * d_head).
DEFAULT_TOKENS = 4096
#: A fit or a rank of d_head columns needs this many samples per column to mean anything.
TOKENS_PER_COLUMN = 8
#: Longest window fed to a model (its own context caps it further).
MAX_WINDOW = 512
#: Tokens per forward batch (windows of one batch go through the model together).
BATCH_TOKENS = 4096


@dataclass(frozen=True)
class SampleSpec:
    """What the activation metrics run on: a text (None: the bundled corpus) and a token count
    (None: ``max(DEFAULT_TOKENS, TOKENS_PER_COLUMN * d_head)``); for a vision model the images
    (``images``: ``digits``, an .npz or a class-folder dataset; None: the dataset the run trained
    on, else ``digits``), whose patches are the tokens."""

    text: str | None = None
    tokens: int | None = None
    images: str | None = None

    def key(self) -> dict:
        """The cache key of an activation job: the same key again reads the stored rows."""
        if self.text is None:
            source = "bundled"
        else:
            import hashlib
            source = "sha256:" + hashlib.sha256(self.read().text.encode("utf-8")).hexdigest()
        key = {"text": source, "tokens": self.tokens if self.tokens is not None else "default"}
        if self.images is not None:
            key["images"] = self.images
        return key

    def read(self):
        from loaders.text_corpus import read_text_sample

        return read_text_sample(self.text)


@dataclass
class ActivationRun:
    frame: pd.DataFrame                 # RESULT_COLUMNS
    notes: dict[str, str]
    sample: dict                        # the key plus what was fed: tokens, windows, context, tokenizer


def _context(model) -> int:
    """How many positions the model takes: its learned-position table, else its config's limit."""
    limit = getattr(model, "context_limit", None)            # experiments.foreign: trained positions
    if isinstance(limit, int) and limit > 0:
        return limit
    cfg = getattr(model, "cfg", None)
    if cfg is not None:                                      # the project's GPT
        return int(cfg.block_size) if getattr(cfg, "positions", None) == "learned" else MAX_WINDOW
    conf = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        n = getattr(conf, name, None)
        if isinstance(n, int) and n > 0:
            return n
    return MAX_WINDOW


def sample_windows(ids: torch.Tensor, *, context: int, n_tokens: int) -> torch.Tensor:
    """``[B, T]`` windows of the token stream ``ids: [N]``: ``T = min(context, MAX_WINDOW, N)``,
    ``B = ceil(n_tokens / T)`` (at most ``N // T``), non-overlapping, spread evenly over the text."""
    n = int(ids.numel())
    t = max(1, min(context, MAX_WINDOW, n))
    b = max(1, min(-(-n_tokens // t), n // t))
    starts = torch.linspace(0, n - t, b).round().long() if b > 1 else torch.zeros(1, dtype=torch.long)
    return torch.stack([ids[s:s + t] for s in starts.tolist()])          # [B, T]


def _token_stream(text: str, tok, vocab: int, n: int | None = None) -> tuple[torch.Tensor, str]:
    """Token ids of ``text``; ``n``: how many a ``SampledIds`` stand-in draws."""
    from loaders.vocab import SampledIds, Vocabulary

    if isinstance(tok, SampledIds):
        return torch.tensor(tok.sample(n if n is not None else len(text)), dtype=torch.long), tok.how
    if isinstance(tok, Vocabulary):
        return torch.tensor(tok.encode(text), dtype=torch.long), tok.how
    if tok is not None:
        ids = tok(text, add_special_tokens=False, verbose=False)["input_ids"]
        return torch.tensor(ids, dtype=torch.long), "tokenizer"
    if vocab < 256:
        raise NoForwardPass(f"no tokenizer and vocab_size {vocab} < 256: cannot feed UTF-8 bytes")
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long), "bytes"


def corpus_activations(ckpt: Checkpoint, *, sample: SampleSpec | None = None, device: str | None = None,
                       progress: Progress | None = None) -> ActivationRun:
    """Activation metrics of every layer on a corpus sample, with chance, n_tokens and intervals.

    The text (``sample.text``, else the bundled corpus) is tokenised (the checkpoint's tokenizer,
    else UTF-8 bytes) and cut into windows of the model's context (at most ``MAX_WINDOW``) spread
    over it, ``sample.tokens`` in total; the windows go through the model in batches of about
    ``BATCH_TOKENS`` tokens. A pre-hook on each attention module hands the layer input ``x``
    ``[B, T, d_model]`` to that layer's ``analysis.activations.ActivationAccumulator``, which keeps
    per-window statistics only. Raises ``NoForwardPass`` when the checkpoint cannot be run.
    """
    from analysis.activations import ActivationAccumulator

    sample = sample or SampleSpec()
    meta = ckpt.meta
    dev = torch.device(device or default_device())
    want = sample.tokens if sample.tokens is not None else max(DEFAULT_TOKENS, TOKENS_PER_COLUMN * meta.d_head)
    model, tok, vocab = _load_runnable(ckpt)
    mods = _attention_modules(model)
    if len(mods) != meta.n_layers:
        raise NoForwardPass(f"{ckpt.path}: found {len(mods)} attention modules in the model, "
                            f"expected {meta.n_layers} (one per layer)")
    if getattr(getattr(model, "cfg", None), "task", "language") == "image":
        return _image_activations(ckpt, model, mods, sample, want, dev, progress)
    text = sample.read().text
    context = _context(model)
    # tokenise only as much text as the sample needs (with margin), all of it if that falls short
    n_draw = want + min(context, MAX_WINDOW)                             # SampledIds only
    ids, how = _token_stream(text[: want * 16], tok, vocab, n_draw)
    if ids.numel() < want and len(text) > want * 16:
        ids, how = _token_stream(text, tok, vocab, n_draw)
    if ids.numel() < 2:
        raise NoForwardPass(f"the sample text gave {ids.numel()} tokens")
    windows = sample_windows(ids, context=context, n_tokens=want)        # [B, T]
    n_win, t = windows.shape
    rope = meta.positions not in ("learned", "none")
    reason = (f"positions are {meta.positions}: logits of the un-rotated q and k are not the "
              "model's logits") if rope else _plus_reason(meta)
    accs = [ActivationAccumulator(layer, meta, logits=reason is None, logits_reason=reason, device=dev)
            for layer in ckpt.layers()]

    frame, notes = _feed(model, mods, accs, windows, t, dev, progress, "windows")
    fed = n_win * t
    if fed < want:
        short = (f"the sample text holds {ids.numel()} tokens: {fed} fed in {n_win} windows of {t}, "
                 f"fewer than the {want} asked for")
        for m in names("activations"):
            notes[m] = f"{notes[m]}; {short}" if m in notes else short
    from loaders.vocab import CharVocabulary, SampledIds

    if isinstance(tok, CharVocabulary) and tok.dropped:
        said = f"{tok.dropped} characters of the text are not in the {tok.how} vocabulary and were left out"
        for m in names("activations"):
            notes[m] = f"{notes[m]}; {said}" if m in notes else said
    if isinstance(tok, SampledIds):
        said = (f"inputs are token ids drawn uniformly from the vocabulary of {vocab}, not the text: "
                f"{tok.reason}")
        for m in names("activations"):
            notes[m] = f"{notes[m]}; {said}" if m in notes else said
    info = {**sample.key(), "n_tokens": fed, "windows": n_win, "window": t, "tokenizer": how}
    return ActivationRun(frame[RESULT_COLUMNS], notes, info)


def _feed(model, mods, accs, inputs: torch.Tensor, t: int, dev, progress: Progress | None,
          what: str) -> tuple[pd.DataFrame, dict[str, str]]:
    """Run ``inputs`` (windows ``[N, T]`` of token ids, or images ``[N, C, H, W]``) through
    ``model`` in batches of about ``BATCH_TOKENS`` tokens (``t`` per input), a pre-hook on each
    attention module handing its input ``x`` ``[b, T, d_model]`` to that layer's accumulator;
    then every layer's rows and notes (``RESULT_COLUMNS``)."""
    def hook_for(i):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs.get("hidden_states")
            accs[i].add(x.detach())                                      # [b, T, d_model]
        return hook

    n = int(inputs.shape[0])
    handles = [m.register_forward_pre_hook(hook_for(i), with_kwargs=True) for i, m in enumerate(mods)]
    model = model.to(dev)
    per_batch = max(1, BATCH_TOKENS // t)
    try:
        with torch.inference_mode():
            for lo in range(0, n, per_batch):
                if progress:
                    progress(lo, n, f"activations: {what} {lo + 1}-{min(lo + per_batch, n)} of {n}")
                model(inputs[lo:lo + per_batch].to(dev))
    finally:
        for h in handles:
            h.remove()
    frames, notes = [], {}
    for acc in accs:
        df, nt = acc.result()
        frames.append(df)
        _merge_notes(notes, nt)
    if progress:
        progress(n, n, "activations done")
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=RESULT_COLUMNS)
    _nonfinite_notes(frame, notes)
    return frame, notes


def _plus_reason(meta) -> str | None:
    """Why q k^T is not the model's logit for paper B's "+" variants (None for the others)."""
    if meta.variant in PLUS:
        return ("a '+' variant adds a 2D positional correction to q k^T (scores * sum(w) + P w + b): "
                "logits of q and k alone are not the model's logits")
    return None


def _image_activations(ckpt: Checkpoint, model, mods, sample: SampleSpec, want: int, dev,
                       progress: Progress | None) -> ActivationRun:
    """The activation metrics of a vision model: validation images of ``sample.images`` (else
    the dataset the run trained on, else ``digits``) as windows, each image's patches plus its
    class token as the tokens (``block_size`` per image); as many images as ``want`` tokens need."""
    from analysis.activations import ActivationAccumulator
    from experiments.vision import load_images

    meta = ckpt.meta
    run = (meta.config or {}).get("run") or {}
    dataset = sample.images or run.get("dataset") or "digits"
    try:
        data = load_images(dataset)
    except QkvscopeError as exc:
        if sample.images:                       # the user's own --images: their error to see
            raise
        raise NoForwardPass(f"the images this run trained on cannot be read ({exc}); give --images") from None
    cfg = model.cfg
    if (data.image_size, data.channels) != (cfg.image_size, cfg.channels):
        raise NoForwardPass(f"{dataset}: images of {data.image_size}x{data.image_size}x{data.channels} do not fit "
                            f"this model ({cfg.image_size}x{cfg.image_size}x{cfg.channels})")
    t = int(cfg.block_size)
    n_img = min(len(data.val_y), -(-want // t))
    images = data.val_x[:n_img]                                          # [N, C, H, W]
    reason = _plus_reason(meta)
    accs = [ActivationAccumulator(layer, meta, logits=reason is None, logits_reason=reason, device=dev)
            for layer in ckpt.layers()]

    frame, notes = _feed(model, mods, accs, images, t, dev, progress, "images")
    fed = n_img * t
    said = f"inputs: {n_img} validation images of {dataset}, {t} tokens each (patches and the class token)"
    if fed < want:
        said += f", fewer than the {want} tokens asked for (the validation split holds {len(data.val_y)} images)"
    for m in names("activations"):
        notes[m] = f"{notes[m]}; {said}" if m in notes else said
    info = {**sample.key(), "images": dataset, "n_tokens": fed, "windows": n_img, "window": t,
            "tokenizer": "image patches"}
    return ActivationRun(frame[RESULT_COLUMNS], notes, info)


def activation_frame(ckpt: Checkpoint, *, device: str | None = None, progress: Progress | None = None,
                     sample: SampleSpec | None = None) -> tuple[pd.DataFrame, dict[str, str]]:
    """``corpus_activations`` as ``(frame, notes)``, or an empty frame and the reason for each metric."""
    try:
        run = corpus_activations(ckpt, sample=sample, device=device, progress=progress)
    except NoForwardPass as exc:
        return pd.DataFrame(columns=RESULT_COLUMNS), {m: str(exc) for m in names("activations")}
    return run.frame, run.notes


# -- the store side ----------------------------------------------------------------
def checkpoint_row(store: Store, checkpoint_id: int) -> dict:
    """``id, path, architecture, variant`` of a stored checkpoint (``Store.checkpoint``)."""
    return store.checkpoint(checkpoint_id)


def _label(layer, head, metric: str) -> str:
    if head is None or (isinstance(head, float) and math.isnan(head)) or head is pd.NA:
        return f"L{layer}"
    tag = "KV" if BY_NAME[metric].axis == "kv_head" else "H"
    return f"L{layer}{tag}{int(head)}"


def _cached(store: Store, checkpoint_id: int, kind: str) -> JobResult | None:
    level = "weights" if kind == "weights" else "activations"
    job = stored_job(store, checkpoint_id=checkpoint_id, kind=kind, metrics=names(level),
                     metric_version=METRIC_VERSION)
    if job is None:
        return None
    frame = job.rows.copy()
    frame.insert(2, "head_label", [_label(l, h, m) for l, h, m in zip(frame["layer"], frame["head"],
                                                                      frame["metric"])])
    frame["layer"] = frame["layer"].astype(int)
    return JobResult(checkpoint_id, "", kind, frame[RESULT_COLUMNS], job.notes, cached=True,
                     seconds=job.seconds, device=job.device, sample=job.sample, tied=job.tied)


def _store_results(store: Store, results: list[JobResult]) -> None:
    with store.transaction() as con:
        for res in results:
            level = "weights" if res.kind == "weights" else "activations"
            replace_results(con, checkpoint_id=res.checkpoint_id, kind=res.kind, metrics=names(level),
                            metric_version=METRIC_VERSION, notes=res.notes, seconds=res.seconds,
                            device=res.device, frame=res.frame, sample=res.sample, tied=res.tied)


def analyze(store: Store, checkpoint_id: int, *, activations: bool = False, device: str | None = None,
            progress: Progress | None = None, force: bool = False,
            opener: Opener | None = None, sample: SampleSpec | None = None) -> list[JobResult]:
    """Weight-level (and with ``activations`` activation-level) metrics of one stored checkpoint.

    Cached kinds are read back (``cached=True``); the others are computed from
    the file at the checkpoint's stored path and stored together in one
    transaction. Activation results are reused only for the same ``sample``
    (text and token count, ``SampleSpec.key``). ``force`` recomputes. ``opener``
    replaces ``loaders.checkpoints.open_checkpoint`` (tests build checkpoints in code).
    """
    info = checkpoint_row(store, checkpoint_id)
    sample = sample or SampleSpec()
    kinds = ["weights"] + (["activations"] if activations else [])
    results: dict[str, JobResult] = {}
    if not force:
        for kind in kinds:
            hit = _cached(store, checkpoint_id, kind)
            if hit is not None and kind == "activations" and not _same_sample(hit.sample, sample.key()):
                hit = None
            if hit is not None:
                hit.path = info["path"]
                results[kind] = hit
    todo = [k for k in kinds if k not in results]
    if todo:
        dev = device or default_device()
        if opener is None:
            from loaders.checkpoints import open_checkpoint as opener
        if not Path(info["path"]).exists() and opener.__module__ == "loaders.checkpoints":
            raise StoreError(f"{info['path']}: checkpoint {checkpoint_id} is stored but its file is gone; "
                             "re-ingest it from its new place")
        if opener.__module__ == "loaders.checkpoints":
            # a stored file is someone's file: analysed in a child process under the memory budget
            # and QKVSCOPE_ANALYSIS_TIMEOUT_S (loaders/parse_child.py), so a bomb ends that process
            from loaders.parse_child import call

            if progress:
                progress(0, 1, "analysing in a child process")
            got = call("app.jobs:compute_jobs", info["path"], timeout="QKVSCOPE_ANALYSIS_TIMEOUT_S",
                       kinds=todo, device=str(dev), text=sample.text, tokens=sample.tokens, images=sample.images)
            fresh = [_job_from_json(checkpoint_id, info["path"], g) for g in got]
        else:
            with opener(info["path"]) as ckpt:
                fresh = [_job_from_json(checkpoint_id, info["path"], g) for g in
                         _compute(ckpt, todo, dev, sample, progress)]
        for res in fresh:
            results[res.kind] = res
        _store_results(store, fresh)
    return [results[k] for k in kinds]


def _compute(ckpt: Checkpoint, kinds: list[str], device, sample: SampleSpec,
             progress: Progress | None = None) -> list[dict]:
    """The metrics of ``kinds`` of an opened checkpoint, each as a JSON-able job
    (``kind, rows, notes, seconds, device, sample, tied``): what ``analyze`` stores."""
    out = []
    for kind in kinds:
        t0 = time.perf_counter()
        used = ties = None
        if kind == "weights":
            frame, notes = weight_frame(ckpt, device=device, progress=progress)
            ties = tied_checkpoint(ckpt, device=device)
        else:
            try:
                run = corpus_activations(ckpt, sample=sample, device=device, progress=progress)
                frame, notes, used = run.frame, run.notes, run.sample
            except NoForwardPass as exc:
                frame = pd.DataFrame(columns=RESULT_COLUMNS)
                notes, used = {m: str(exc) for m in names("activations")}, sample.key()
        rows = frame[RESULT_COLUMNS].astype(object).where(frame[RESULT_COLUMNS].notna(), None)
        out.append({"kind": kind, "rows": rows.values.tolist(), "notes": notes,
                    "seconds": time.perf_counter() - t0, "device": str(device), "sample": used, "tied": ties})
    return out


def compute_jobs(path: str, *, kinds: list[str], device: str, text: str | None = None,
                 tokens: int | None = None, images: str | None = None) -> list[dict]:
    """``_compute`` on the checkpoint at ``path``: the body ``analyze`` runs in the child process."""
    from loaders.checkpoints import open_checkpoint

    with open_checkpoint(path) as ckpt:
        return _compute(ckpt, list(kinds), device, SampleSpec(text, tokens, images))


def _job_from_json(checkpoint_id: int, path: str, job: dict) -> JobResult:
    """A ``JobResult`` from ``_compute``'s JSON-able job (rows in ``RESULT_COLUMNS`` order)."""
    frame = pd.DataFrame(job["rows"], columns=RESULT_COLUMNS)
    frame["layer"] = frame["layer"].astype("int64")
    frame["head"] = pd.array(frame["head"], dtype="Int64")
    frame["n_tokens"] = pd.array(frame["n_tokens"], dtype="Int64")
    for col in ("value", "chance", "ci_low", "ci_high"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
    return JobResult(checkpoint_id, path, job["kind"], frame, job["notes"], cached=False,
                     seconds=job["seconds"], device=job["device"], sample=job["sample"], tied=job["tied"])


def _same_sample(stored: dict | None, wanted: dict) -> bool:
    """Whether a stored activation job ran on the sample ``wanted`` (``SampleSpec.key``)."""
    return stored is not None and all(stored.get(k) == v for k, v in wanted.items())


def resolve(store: Store, target: str, *, reader=None) -> int:
    """A checkpoint id from ``target``: an existing path is ingested first, else an integer id.

    The path is someone's file: it is read and stored by the child process of
    ``loaders.parse_child`` (under the memory and time budgets), never in this
    process, so a bomb ends that child with one line ``PATH: what`` (``FileError``).
    ``reader`` (a ``loaders.parse_child.Reader``) reuses one child over several
    targets (a glob's matches); None starts one for this target.
    """
    path = Path(target).expanduser()
    if path.exists():
        from loaders import parse_child
        from loaders.report import FileReport

        if reader is None:
            rep = parse_child.ingest_checkpoint(store, path)
        else:
            rep = FileReport(**reader.request(path, "ingest_checkpoint", db=str(store.path),
                                              busy_timeout=store.busy_timeout))
        if rep.checkpoint_id is None:
            raise QkvscopeError(f"{path}: not analysable: {rep.reason or rep.status}")
        return int(rep.checkpoint_id)
    try:
        return int(target)
    except ValueError:
        raise StoreError(f"{target}: neither an existing file or folder nor a checkpoint id") from None
