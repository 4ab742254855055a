"""Describe one checkpoint: architecture, variant, geometry, parameters, KV bytes.

Examples:
  python -m app info runs/kv-mqa/checkpoints/final.safetensors
  python -m app info path/to/hf-folder --json
  python -m app info openai-community/gpt2           # a Hugging Face name, from the local cache
  python -m app info BrainChip-AI/qkv-fineweb-300m --download

Reads metadata and one layer at a time (safetensors are memory-mapped), so it
is cheap for files larger than memory. Nothing is written to the database.
The file is read in a child process (``loaders.sandbox``, job ``info``) under an
memory limit (``QKVSCOPE_PARSE_MEMORY_MB`` plus the file's size) and a
time limit (``QKVSCOPE_PARSE_TIMEOUT_S``).

``variant`` is what the layout's tensor names say; ``tied`` is what the
tensors themselves show (``app.jobs.read_ties``, ``analysis.tied``: W_Q equal to the identity slice,
equal projections to float tolerance, per layer). The text output says when
the two disagree (a Hugging Face Llama trained with ``q_proj = I`` reads as
``qkv`` from its names).
"""
from __future__ import annotations

import argparse

from analysis.kv_layers import LayerType
from analysis.kv_layers import describe as describe_layer_types
from app.commands._common import add_download_argument, checkpoint_path, print_json
from loaders.report import shown

NAME = "info"
HELP = "what is this checkpoint? (architecture, variant, geometry, parameters)"

_ORDER = ("architecture", "variant", "n_layers", "n_heads", "n_kv_heads", "d_model", "d_head",
          "norm", "positions", "attn_scale", "dtype", "kv_bytes_per_token", "nonfinite")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="checkpoint file, Hugging Face folder or zip, or a Hugging Face name "
                                     "(org/name, models--org--name) in the local cache")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_download_argument(parser)


def tensor_ties(path: str) -> dict:
    """``{"variant", "layers": [{"layer", "q_identity", "q_eq_k", "k_eq_v", "q_eq_v"}, ...]}``
    from the tensors (``app.jobs.read_ties``, the one reader of a checkpoint's ties)."""
    # here: torch loads where tensors are read, not at CLI start
    from analysis.tie_names import tied_variant
    from app.jobs import read_ties

    layers = read_ties(path)
    return {"variant": tied_variant(layers), "layers": layers}


def disagreement(layout_variant: str, ties: dict) -> str | None:
    """The note printed when the layout's variant and the tensors' ties differ, else None
    (``analysis.tie_names.disagreement``, the one wording)."""
    from analysis.tie_names import disagreement as worded   # here: as the CLI's other analysis imports

    return worded(layout_variant, ties["layers"])


def _extra_lines(info: dict) -> list[str]:
    """Towers, latent attention (MLA), layer types (sliding windows, per-type heads, shared
    caches), QK-norm, soft-capping, a nonlinear query module and how the norm was read,
    where the checkpoint has them."""
    lines = []
    for t in info.get("towers") or []:
        last = t["first_layer"] + t["n_layers"] - 1
        lines.append(f"{'tower ' + t['name']:<20} layers {t['first_layer']}-{last}: {t['n_heads']} heads "
                     f"({t['n_kv_heads']} kv) of d_head {t['d_head']}, d_model {t['d_model']}")
    lat = info.get("latent")
    if lat:
        lines.append(f"{'latent (MLA)':<20} kv_lora_rank {lat['kv_lora_rank']} + rotary {lat['rope_dim']} = "
                     f"{lat['cache_width']} cached per token and layer; q_lora_rank {lat['q_lora_rank']}; "
                     f"W_K, W_V are composed maps")
    types = info.get("kv_layer_types") or []
    if types:
        lines.append(f"{'layer types':<20} {describe_layer_types(tuple(LayerType(**t) for t in types))}; kv_bytes_per_token "
                     f"sums over them (a sliding layer caps the tokens, not the bytes a token adds)")
    if info.get("qk_norm", "none") != "none":
        lines.append(f"{'qk_norm':<20} RMSNorm on q and k per {info['qk_norm']} (gains in the canonical layer)")
    if info.get("logit_softcap") is not None:
        lines.append(f"{'logit_softcap':<20} {info['logit_softcap']}")
    if info.get("query_module"):
        lines.append(f"{'query_module':<20} {info['query_module']}; no W_Q metrics")
    if (info.get("notes") or {}).get("norm"):
        lines.append(f"{'norm read as':<20} {info['notes']['norm']}")
    return lines


def describe(path: str) -> dict:
    """``inspect_checkpoint`` plus ``tied``; whatever reading the file raises
    (``RecursionError`` on deep nesting, ``MemoryError``, ``OSError``, torch's
    ``RuntimeError``, ...) becomes a ``FileError`` naming it: one line, exit 2."""
    from loaders.checkpoints import inspect_checkpoint  # here: torch loads in the reading child, not at CLI start
    from loaders.errors import FileError, QkvscopeError
    from loaders.filecheck import failure

    try:
        info = inspect_checkpoint(path)
        info["tied"] = tensor_ties(path)
    except QkvscopeError:
        raise
    except Exception as exc:    # noqa: BLE001 -- an untrusted file's content, see the docstring
        raise FileError(path, failure(exc)) from exc
    return info


def read_info(path: str) -> dict:
    """``describe(path)`` (what ``info --json`` prints), read in a child process under a memory and
    a time limit (loaders/sandbox.py): a bomb no reader's budget catches ends that process with
    one line, not this one. Pooled: a caller that reads several (``main([...])``, a notebook) starts
    one child."""
    from app.sandbox_jobs import call  # here: only when a checkpoint is read
    from loaders.filecheck import check_openable

    # what ``stat`` alone refuses (a FIFO, a socket, a device, links that loop) is refused here,
    # with the reader's own line, before a child is started for it (2-3 s of imports)
    check_openable(path)
    return call("info", str(path), pooled=True)


def run(args: argparse.Namespace) -> int:
    path = checkpoint_path(args.path, args.download)     # a Hugging Face name: its cached snapshot
    info = read_info(path)
    if args.json:
        print_json(info)
        return 0
    print(shown(path) if path == args.path else f"{shown(args.path)}: {shown(path)}")
    for key in _ORDER:
        if key in info:
            print(f"  {key:<20} {info[key]}")
    for line in _extra_lines(info):
        print(f"  {line}")
    params = info["params"]
    share = params["attention"] / params["total"] if params["total"] else 0.0
    print(f"  {'params':<20} {params['total']:,} total, {params['attention']:,} attention ({share:.1%})")
    print(f"  {'tied':<20} {info['tied']['variant'] or 'none of the variants'}")
    note = disagreement(info["variant"], info["tied"])
    if note:
        print(f"  note: {note}")
    return 0
