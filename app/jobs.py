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

Forward passes (``capture_activations``): Hugging Face folders run through
``transformers`` (eager attention, ``output_attentions``), this project's own
checkpoints through ``experiments.train.load_checkpoint``, and nanoGPT, the
query-free paper's and the projection-sharing paper's checkpoints as the
project's GPT (``experiments.foreign.runnable``). A forward pre-hook
on each layer's attention module records the attention input ``x`` (already
normalised where the model normalises); the caches and logits are then
``x W_K + b_K``, ``x W_V + b_V`` and ``(x W_Q + b_Q)(x W_K + b_K)^T`` from the
canonical weights, so every layout gets the same definitions. The keys are the
un-rotated ones: for rotary or ALiBi positions the logits would not be the
model's, so ``logit_symmetry`` is left out with that reason. Sample text: the
checkpoint's own tokenizer when it has one, else UTF-8 bytes.
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

from analysis.activations import activation_metrics
from analysis.registry import BY_NAME, COLUMNS, METRIC_VERSION, RESULT_COLUMNS, names
from analysis.weights import default_device, weight_metrics
from loaders.canonical import Checkpoint
from loaders.errors import QkvscopeError, StoreError
from loaders.results import replace_results, stored_job
from loaders.store import Store

Progress = Callable[[int, int, str], None]  # (done, total, what is being done)
Opener = Callable[[str], Checkpoint]

#: Default sample text for forward passes (English prose, ~80 tokens of BERT's vocabulary).
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
    tokenizer: str                      # 'tokenizer' or 'bytes'
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
        df, nt = weight_metrics(layer, ckpt.meta, device=device)
        frames.append(df)
        _merge_notes(notes, nt)
    if progress:
        progress(n, n, "weights done")
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    if nonfinite_notes:
        _nonfinite_notes(frame, notes)
    return frame, notes


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
    try:
        from experiments.train import load_checkpoint
    except ImportError as exc:
        raise NoForwardPass(f"{path}: experiments.train is not available ({exc})") from exc
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
_FOREIGN = ("nanogpt", "query_free", "projection_sharing")


def _foreign_model(ckpt: Checkpoint):
    """nanoGPT / query-free / projection-sharing weights, re-read whole, as a GPT."""
    from experiments.foreign import ForeignCheckpointError, runnable
    from loaders.sources import open_source

    meta = ckpt.meta
    src = open_source(ckpt.path)
    try:
        sd, config = {k: src.get(k) for k in src.keys()}, dict(src.config or {})
    finally:
        src.close()
    try:
        model = runnable(meta.architecture, sd, config, variant=meta.variant, n_heads=meta.n_heads,
                         n_kv_heads=meta.n_kv_heads, attn_scale=meta.attn_scale)
    except ForeignCheckpointError as exc:
        raise NoForwardPass(f"{ckpt.path}: {exc}; weight-level metrics only") from exc
    return model.eval(), None, int(model.cfg.vocab_size)


def _load_runnable(ckpt: Checkpoint):
    path = Path(ckpt.path)
    arch = ckpt.meta.architecture
    if arch in _FOREIGN:
        return _foreign_model(ckpt)
    if path.is_dir() and (path / "config.json").is_file():
        return _hf_model(path)
    if path.suffix == ".safetensors" and arch == "qkvscope":
        return _own_model(path)
    raise NoForwardPass(
        f"{path}: no forward pass for a {arch} checkpoint (runnable: Hugging Face folders with "
        "config.json, this project's own checkpoints, nanoGPT, query-free and projection-sharing "
        "language models); weight-level metrics only")


def _tokens(text: str, tok, vocab: int, max_tokens: int) -> tuple[torch.Tensor, list[str], str]:
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
    if cfg is not None and getattr(cfg, "positions", None) == "learned":
        max_tokens = min(max_tokens, cfg.block_size)
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
            if not rope:
                if layer.W_Q is None:                                          # identity slices
                    q = x.view(x.shape[0], meta.n_heads, meta.d_head).permute(1, 0, 2)
                else:
                    q = torch.einsum("td,hde->hte", x, layer.W_Q.float().to(dev))
                if layer.b_Q is not None:
                    q = q + layer.b_Q.float().to(dev)[:, None, :]
                group = meta.n_heads // meta.n_kv_heads
                logits = q @ k.repeat_interleave(group, 0).mT                 # [H, T, T]
            if hf_attn is not None:
                attn = hf_attn[i][0].float()
            elif logits is not None:                                           # own causal model
                T = logits.shape[-1]
                mask = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
                attn = (logits * meta.attn_scale).masked_fill(~mask, float("-inf")).softmax(-1)
            layers.append(LayerCapture(i, k.cpu(), v.cpu(), None if logits is None else logits.cpu(),
                                       None if attn is None else attn.cpu()))
    return Capture(token_text, how, layers, reason)


def activation_frame(ckpt: Checkpoint, *, device: str | None = None, progress: Progress | None = None,
                     text: str = SAMPLE_TEXT) -> tuple[pd.DataFrame, dict[str, str]]:
    """Activation metrics of every layer, or an empty frame and the reason for each metric."""
    try:
        cap = capture_activations(ckpt, text=text, device=device)
    except NoForwardPass as exc:
        return pd.DataFrame(columns=COLUMNS), {m: str(exc) for m in names("activations")}
    frames, notes = [], {}
    n = len(cap.layers)
    for lc in cap.layers:
        if progress:
            progress(lc.layer, n, f"activations layer {lc.layer}")
        df, nt = activation_metrics(lc.layer, lc.k, lc.v, lc.logits, logits_reason=cap.logits_reason,
                                    device=device)
        frames.append(df)
        _merge_notes(notes, nt)
    if progress:
        progress(n, n, "activations done")
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    _nonfinite_notes(frame, notes)
    return frame, notes


# -- the store side ----------------------------------------------------------------
def checkpoint_row(store: Store, checkpoint_id: int) -> dict:
    with store.connect() as con:
        row = con.execute("SELECT id, path, architecture, variant FROM checkpoints WHERE id = ?",
                          [checkpoint_id]).fetchone()
        if row is None:
            ids = [r[0] for r in con.execute("SELECT id FROM checkpoints ORDER BY id").fetchall()]
            raise StoreError(f"{store.path}: no checkpoint with id {checkpoint_id} "
                             f"(stored ids: {ids if ids else 'none'})")
    return dict(zip(("id", "path", "architecture", "variant"), row))


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
                     seconds=job.seconds, device=job.device)


def _store_results(store: Store, results: list[JobResult]) -> None:
    with store.transaction() as con:
        for res in results:
            level = "weights" if res.kind == "weights" else "activations"
            replace_results(con, checkpoint_id=res.checkpoint_id, kind=res.kind, metrics=names(level),
                            metric_version=METRIC_VERSION, notes=res.notes, seconds=res.seconds,
                            device=res.device, frame=res.frame)


def analyze(store: Store, checkpoint_id: int, *, activations: bool = False, device: str | None = None,
            progress: Progress | None = None, force: bool = False,
            opener: Opener | None = None) -> list[JobResult]:
    """Weight-level (and with ``activations`` activation-level) metrics of one stored checkpoint.

    Cached kinds are read back (``cached=True``); the others are computed from
    the file at the checkpoint's stored path and stored together in one
    transaction. ``force`` recomputes. ``opener`` replaces
    ``loaders.checkpoints.open_checkpoint`` (tests build checkpoints in code).
    """
    info = checkpoint_row(store, checkpoint_id)
    kinds = ["weights"] + (["activations"] if activations else [])
    results: dict[str, JobResult] = {}
    if not force:
        for kind in kinds:
            hit = _cached(store, checkpoint_id, kind)
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
        fresh = []
        with opener(info["path"]) as ckpt:
            for kind in todo:
                t0 = time.perf_counter()
                fn = weight_frame if kind == "weights" else activation_frame
                frame, notes = fn(ckpt, device=dev, progress=progress)
                res = JobResult(checkpoint_id, info["path"], kind, frame, notes, cached=False,
                                seconds=time.perf_counter() - t0, device=str(dev))
                fresh.append(res)
                results[kind] = res
        _store_results(store, fresh)
    return [results[k] for k in kinds]


def resolve(store: Store, target: str) -> int:
    """A checkpoint id from ``target``: an existing path is ingested first, else an integer id."""
    path = Path(target).expanduser()
    if path.exists():
        from loaders.ingest import ingest_checkpoint

        rep = ingest_checkpoint(store, path)
        if rep.checkpoint_id is None:
            raise QkvscopeError(f"{path}: not analysable: {rep.reason or rep.status}")
        return int(rep.checkpoint_id)
    try:
        return int(target)
    except ValueError:
        raise StoreError(f"{target}: neither an existing file or folder nor a checkpoint id") from None
