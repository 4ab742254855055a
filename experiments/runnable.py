"""A stored checkpoint as a model that runs: loading it, finding its attention modules, and
feeding it inputs with a hook on each layer.

``load_runnable(ckpt) -> (model, tokenizer, vocab_size)`` (``NoForwardPass`` with the
reason when it cannot be run):

* Hugging Face folders (and zips of one, extracted by ``loaders.sources``) through
  ``transformers``: eager attention, float32, every ``from_pretrained`` (config, model,
  tokenizer) with ``trust_remote_code=False`` and ``local_files_only=True``; a folder
  that names model code (``auto_map`` in its configs, or ``.py`` files beside it) is
  not run at all (``model_code_reason``: weight metrics only, "model code beside the
  checkpoint is never run"). The tokenizer is loaded only when its files are there.
* this project's own checkpoints through ``experiments.train.load_checkpoint``;
* nanoGPT (LayerNorm or RMSNorm, GELU or SwiGLU), llama2.c / Meta Llama, the
  query-free and the projection-sharing papers' checkpoints, rebuilt as the project's
  GPT (``experiments.foreign.runnable``), with the vocabulary found beside them
  (``loaders.vocab``: llama2.c ``tokenizer.bin``, a ``stoi``, nanoGPT's ``meta.pkl``
  read without unpickling code), else None (UTF-8 bytes) for 256 ids or more, else
  ``SampledIds`` (and always for Llama vocabularies, whose ids are not bytes).

Structure: ``attention_modules`` (the outermost modules named ``*Attention``, one per
layer), ``hf_towers`` (a Hugging Face model's image and text stacks: ViT, DeiT, DINOv2,
CLIP/SigLIP vision models, the two towers of ``CLIPModel``/``SiglipModel``),
``model_context`` (positions a model takes). ``feed`` runs ``[N, T]`` token windows or
``[N, C, H, W]`` images through a model in batches of about ``BATCH_TOKENS`` tokens, a
forward pre-hook on each attention module handing its input ``x`` ``[b, T, d_model]``
(already normalised where the model normalises) to that layer's accumulator.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd
import torch

from analysis.above_chance import flag as flag_above_chance
from analysis.activations import ActivationAccumulator
from analysis.captures import MAX_WINDOW
from analysis.cross_layer import CacheSample
from analysis.notes import merge_notes, nonfinite_notes
from analysis.registry import RESULT_COLUMNS
from experiments.foreign import ForeignCheckpointError, runnable
from loaders.canonical import Checkpoint
from loaders.sources import open_source

Progress = Callable[[int, int, str], None]  # (done, total, what is being done)

#: Tokens per forward batch (windows of one batch go through the model together).
BATCH_TOKENS = 4096
#: Why a folder with model code is analysed from its weights alone.
REMOTE_CODE_NOTE = "model code beside the checkpoint is never run"
#: The biggest config.json read to look for model code (a real one is a few KB).
_CONFIG_BYTES = 4 * 2**20
_TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "tokenizer.model", "spiece.model")
#: Layouts ``experiments.foreign`` rebuilds as the project's GPT.
FOREIGN = ("nanogpt", "query_free", "projection_sharing", "llama_meta")


class NoForwardPass(Exception):
    """This checkpoint cannot be run; ``str()`` is the reason stored in the notes."""


# -- loading ---------------------------------------------------------------------------
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


def _check_embedding(path: Path, config) -> None:
    """``NoForwardPass`` when the config's ``vocab_size`` x ``hidden_size`` float32 embedding
    would not fit the reading process's ``QKVSCOPE_PARSE_MEMORY_MB`` (a config that says
    ``vocab_size`` 1e12): the activation metrics are skipped with that note, the weight
    metrics, which never build the model, are stored."""
    from loaders.budgets import budget   # here: only a forward pass builds an embedding

    vocab, width = getattr(config, "vocab_size", None), getattr(config, "hidden_size", None)
    if not isinstance(vocab, int) or not isinstance(width, int):
        return
    limit = budget("QKVSCOPE_PARSE_MEMORY_MB") << 20
    if vocab * width * 4 > limit:
        raise NoForwardPass(f"{path}: config.json's vocab_size {vocab:,} x hidden_size {width:,} makes a "
                            f"{vocab * width * 4 / 2**30:,.1f} GiB embedding, over QKVSCOPE_PARSE_MEMORY_MB "
                            f"({limit >> 20:,} MB); weight-level metrics only")


def hf_model(path: Path, *, causal_lm: bool = False, image_classifier: bool = False):
    """A Hugging Face folder's model (``AutoModel``, or with its output head
    ``AutoModelForCausalLM`` when ``causal_lm``, ``AutoModelForImageClassification`` when
    ``image_classifier``; eager attention, float32), its tokenizer (None without tokenizer
    files) and ``vocab_size`` (256 when the config has none)."""
    import transformers          # here: transformers loads only for a Hugging Face forward pass

    reason = model_code_reason(path)
    if reason is not None:
        raise NoForwardPass(reason)
    # Every from_pretrained says trust_remote_code=False: transformers would otherwise ask on
    # stdin whether to run code named by the config (and run it on "y").
    try:
        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True,
                                                         trust_remote_code=False)
        _check_embedding(path, config)
        auto = (transformers.AutoModelForCausalLM if causal_lm else transformers.AutoModelForImageClassification
                if image_classifier else transformers.AutoModel)
        model = auto.from_pretrained(
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


def own_model(path: Path):
    """This project's own checkpoint as its GPT (no tokenizer: UTF-8 bytes)."""
    from experiments.train import load_checkpoint     # here: the trainer loads only for a forward pass

    model = load_checkpoint(path)
    return model.eval(), None, int(model.cfg.vocab_size)


def _where(src, path: Path) -> Path:
    """The folder or file a source was read from: a zip's extracted member, else ``path``."""
    tmp = getattr(src, "extracted_to", None)
    if tmp is not None:
        return tmp / src.extras.get("zip_member", ".")
    return path


def _vocabulary(arch: str, where: Path, src, vocab: int):
    """The checkpoint's ``loaders.vocab`` vocabulary; else None (UTF-8 bytes) for a vocabulary
    of 256 ids or more, or ``SampledIds`` (Llama ids are not bytes; below 256 bytes do not fit)."""
    from loaders.vocab import SampledIds, find_vocabulary  # here: only a forward pass needs a vocabulary

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


def foreign_model(ckpt: Checkpoint):
    """nanoGPT / Llama / query-free / projection-sharing weights, re-read whole, as a GPT,
    with the vocabulary found beside them."""
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


def hf_zip_model(path: Path):
    """A zip of a Hugging Face folder: extracted (``loaders.sources.ZipSource``), run from
    the extracted folder (the model-code refusal included), the folder deleted after loading;
    None when the zip holds no Hugging Face folder."""

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
            return hf_model(root)
        except NoForwardPass as exc:
            raise NoForwardPass(str(exc).replace(str(root), str(path))) from exc
    finally:
        src.close()


def load_runnable(ckpt: Checkpoint):
    """``(model, tokenizer or vocabulary or None, vocab_size)`` of ``ckpt`` (module docstring)."""
    path = Path(ckpt.path)
    arch = ckpt.meta.architecture
    if arch in FOREIGN:
        return foreign_model(ckpt)
    if path.is_dir() and (path / "config.json").is_file():
        return hf_model(path)
    if path.suffix == ".safetensors" and arch == "qkvscope":
        return own_model(path)
    if path.is_file() and path.suffix.lower() == ".zip":
        loaded = hf_zip_model(path)
        if loaded is not None:
            return loaded
    raise NoForwardPass(
        f"{path}: no forward pass for a {arch} checkpoint (runnable: Hugging Face folders with "
        "config.json and zips of them, this project's own checkpoints, nanoGPT, llama2.c/Meta Llama, "
        "query-free and projection-sharing language models); weight-level metrics only")


# -- structure -------------------------------------------------------------------------
def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The outermost modules whose class name ends in 'Attention', in layer order."""
    found: list[tuple[str, torch.nn.Module]] = []
    for name, mod in model.named_modules():
        if not type(mod).__name__.endswith("Attention"):
            continue
        if any(name.startswith(p + ".") for p, _ in found):
            continue
        found.append((name, mod))
    return [m for _, m in found]


def stack_modules(module: torch.nn.Module) -> list[torch.nn.Module]:
    """A stack's per-layer attention modules: ``attention_modules`` without an
    ``nn.MultiheadAttention`` (SigLIP's attention-pooling head is no layer of the stack)."""
    return [m for m in attention_modules(module) if not isinstance(m, torch.nn.MultiheadAttention)]


def hf_towers(model) -> list[tuple[str | None, torch.nn.Module, str]] | None:
    """The attention stacks of a Hugging Face model that reads images, as ``(tower, module,
    inputs)`` with inputs ``"images"`` or ``"text"``: a model whose ``main_input_name`` is
    ``pixel_values`` (ViT, DeiT, DINOv2, CLIP / SigLIP vision models) is one image stack
    (tower None: all layers); a two-tower model (``vision_model`` and ``text_model``:
    ``CLIPModel``, ``SiglipModel``) is its vision tower on images, then its text tower on the
    text. None for every other model (they run on text)."""
    if not type(model).__module__.startswith("transformers"):
        return None
    if getattr(model, "main_input_name", None) == "pixel_values":
        return [(None, model, "images")]
    vision = getattr(model, "vision_model", None)
    if not isinstance(vision, torch.nn.Module):
        return None
    text = getattr(model, "text_model", None)
    return [("vision", vision, "images")] + ([("text", text, "text")] if isinstance(text, torch.nn.Module) else [])


def tower_layers(meta, tower: str | None) -> list[int]:
    """The checkpoint's layer indices of ``tower`` (None: every layer)."""
    if tower is None:
        return list(range(meta.n_layers))
    t = next((t for t in meta.towers if t.name == tower), None)
    if t is None:
        raise NoForwardPass(f"the model has a {tower} tower but the checkpoint's layout names no such tower")
    return list(range(t.first_layer, t.first_layer + t.n_layers))


def model_context(model) -> int:
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


# -- running ---------------------------------------------------------------------------
class _Fed(Exception):
    """Raised by a batch's last attention hook: the rest of the forward feeds no accumulator."""


def feed(model, mods, accs, inputs: torch.Tensor, t: int, dev, progress: Progress | None,
         what: str) -> tuple[pd.DataFrame, dict[str, str]]:
    """Run ``inputs`` (windows ``[N, T]`` of token ids, or images ``[N, C, H, W]``) through
    ``model`` in batches of about ``BATCH_TOKENS`` tokens (``t`` per input), a pre-hook on each
    attention module handing its input ``x`` ``[b, T, d_model]`` to that layer's accumulator;
    then every layer's rows and notes (``RESULT_COLUMNS``), and the rows of every pair of layers
    (``analysis.cross_layer.CacheSample``: the same sampled tokens of every layer's input).

    A batch's forward stops once every attention module has had its input: what follows the last
    one (that layer's attention and MLP, the final norm, the output head over the vocabulary)
    feeds nothing, and the head alone is most of a small model's forward (a nanoGPT of d_model
    288 and 32,000 tokens: 38 of its 66 G multiply-adds). A module called again after that in
    the same batch is not handed that input; a batch that never reaches one of them runs whole."""
    fired: set[int] = set()
    # the same sampled tokens of every layer's input, for the cross-layer metrics (analysis.cross_layer),
    # projected by the accumulators' K and V columns (an accumulator of another kind has none: no pairs)
    cross = (CacheSample([(a.layer, a.w[:, :2 * a.g * a.e], a.b[:2 * a.g * a.e] if a.has_bias else None,
                           a.g * a.e) for a in accs], int(inputs.shape[0]), t)
             if all(isinstance(a, ActivationAccumulator) for a in accs) else None)

    def hook_for(i):
        def hook(module, args, kwargs):
            if len(fired) == len(accs):                                  # a caller went on past _Fed
                raise _Fed
            x = args[0] if args else kwargs.get("hidden_states")
            accs[i].add(x.detach())                                      # [b, T, d_model]
            if cross is not None:
                cross.add(i, x.detach())
            fired.add(i)
            if len(fired) == len(accs):
                raise _Fed
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
                fired.clear()
                try:
                    model(inputs[lo:lo + per_batch].to(dev))
                except _Fed:
                    pass
    finally:
        for h in handles:
            h.remove()
    frames, notes = [], {}
    for df, nt in (acc.result() for acc in accs):                        # the layers in turn
        frames.append(df)
        merge_notes(notes, nt)
    if cross is not None:                                                # the pairs of layers
        cross_frame, cross_notes = cross.result()
        frames.append(cross_frame)
        merge_notes(notes, cross_notes)
    if progress:
        progress(n, n, "activations done")
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=RESULT_COLUMNS + ["p_null"])
    nonfinite_notes(frame, notes)
    return flag_above_chance(frame), notes          # "above chance" tested over each metric's heads
