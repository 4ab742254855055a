"""Run metadata: variant, n_kv_heads, weight decay, learning rate, seed, model size.

Where it comes from, first found wins:

1. what the log itself states (nanoGPT ``Overriding:`` lines and parameter
   count, a modded-nanogpt code header, a checkpoint's ``train_config``);
2. config files in the run's folder: ``config.json`` (this project's trainer,
   or a Hugging Face model config), ``hparams.yaml`` (Lightning), any other
   ``*.yaml`` / ``*.yml`` (e.g. ``model_config.yaml``, ``train_config.yaml``),
   ``args.json``, ``config*.py`` (only literal ``name = value`` assignments
   are read, nothing is executed), the ``config`` dict of a nanoGPT
   ``ckpt.pt`` (``torch.load(weights_only=True)``), and a Hugging Face
   Trainer's ``training_args.json`` or ``training_args.bin`` (its pickle's
   opcodes listed, never unpickled: ``loaders.logs.training_args``), whose
   ``learning_rate`` is the configured peak, not a logged scheduled value;
3. the run's and its folders' names: ``wd0.03``, ``lr6e-4``, ``seed1``,
   ``kv2`` / ``mqa``, ``k_eq_v``, ``query_free``, paper B's file tags
   (``vit_s16_imagenet_Q__K_V``), ...; and the task (``config["task"]``),
   where no config file states it: ``"image"`` for a name with ``vit``,
   ``imagenet``, ``cifar10``, ``mnist``, ... (``task_from_name``).

Numbers in names follow the usual encodings: ``3e-4``, ``1em2`` (= 1e-2, ``m``
for minus), ``0p1`` (= 0.1, ``p`` for the point) and a leading zero that stands
for the point (``wd010`` = 0.10, ``wd001`` = 0.01). A value outside a plausible
range (lr in (0, 10], weight decay in [0, 10]) is refused from any source, with
a note in the run's ``config["metadata_notes"]``; a name that disagrees with
the file's own content is noted too, and the content wins.
"""
from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

import yaml

from analysis import variants as _variants
from loaders.budgets import BudgetExceeded, SideBudget, load_yaml, walk_plain
from loaders.errors import LogFormatError
from loaders.logs.training_args import read_training_args

FIELDS = ("variant", "n_kv_heads", "weight_decay", "lr", "seed", "model_size")
#: Stored variant names, paper B's "+" variants included (``analysis.variants``).
VARIANTS = _variants.ALL_VARIANTS
#: Plausible ranges; a value outside is refused with a note: (low, high, low included).
RANGES = {"lr": (0.0, 10.0, False), "weight_decay": (0.0, 10.0, True)}

_KEYS = {
    "variant": ("variant", "attention_variant", "qkv_variant", "projection_sharing", "attn_variant"),
    "n_kv_heads": ("n_kv_heads", "num_key_value_heads", "n_kv_head", "num_kv_heads", "kv_heads",
                   "n_head_kv", "multi_query_group_num"),
    "weight_decay": ("weight_decay", "wd"),
    "lr": ("lr", "learning_rate", "max_lr", "base_lr"),
    "seed": ("seed", "random_seed"),
    "model_size": ("model_size", "n_params", "num_params", "num_parameters", "params_total"),
}
# Strings that name runs (searched for variant/wd/lr tokens like a folder name).
_NAME_KEYS = ("clearml_task", "output_dir", "out_dir", "run_name", "wandb_run_name",
              "experiment_name", "name")

_VARIANT_ALIASES = [
    # The "+" spellings first: "q=k=v+" also contains "q=k=v".
    ("q_eq_k_eq_v_plus", ("q_eq_k_eq_v_plus", "(q=k=v)+", "q=k=v+", "qkv_shared_plus")),
    ("q_eq_k_plus", ("q_eq_k_plus", "(q=k-v)+", "q=k-v+", "(q=k!=v)+")),
    ("q_eq_k_eq_v", ("q_eq_k_eq_v", "q=k=v", "qkv_shared", "qeqkeqv", "qkequalsv", "qequalskequalsv",
                     "shared_qkv", "single_projection")),
    ("k_eq_v", ("k_eq_v", "q-k=v", "q!=k=v", "k=v", "keqv", "kequalsv", "kv_shared", "shared_kv", "qkk",
                "kv_tied", "tied_kv")),
    ("q_eq_k", ("q_eq_k", "q=k-v", "q=k!=v", "q=k", "qeqk", "qequalsk", "qk_shared", "shared_qk", "qk_tied",
                "tied_qk", "symmetric")),
    ("wq_identity", ("wq_identity", "query_free", "queryfree", "query-free", "no_wq", "noq",
                     "identity_query", "identity")),
    ("qkv", ("qkv", "q-k-v", "baseline", "standard", "full", "separate")),
]


def normalise_variant(value) -> str | None:
    """One of VARIANTS for the spellings used by the two papers and trainers, else None."""
    if value is None:
        return None
    text = str(value).strip().lower().replace(" ", "_")
    for canon, aliases in _VARIANT_ALIASES:
        if text in aliases:
            return canon
    return None


def _variant_in_text(text: str) -> str | None:
    low = text.lower()
    for canon, aliases in _VARIANT_ALIASES:
        for a in aliases:
            if a in ("full", "separate", "standard", "identity", "symmetric"):
                continue  # too common inside other words to trust in a name
            if re.search(rf"(?:^|[^a-z0-9]){re.escape(a)}(?:$|[^a-z0-9])", low):
                return canon
    return None


# A number as names write it: 6e-4, 1em2 (m = minus), 0p1 (p = point), 0.03, .5, 010.
_NUMBER = r"(\d+(?:[.p]\d+)?(?:e[-+m]?\d+)?|\.\d+)"
_NAME_PATTERNS = {
    "weight_decay": re.compile(rf"(?:^|[^a-z])(?:wd|weight_decay|weightdecay)[-_=]?{_NUMBER}"),
    "lr": re.compile(rf"(?:^|[^a-z])(?:lr|learning_rate)[-_=]?{_NUMBER}"),
    "seed": re.compile(r"(?:^|[^a-z])seed[-_=]?(\d+)"),
    "n_kv_heads": re.compile(r"(?:^|[^a-z])(?:n_kv|kv|gqa)[-_=]?(\d+)(?:$|[^0-9a-z.])"),
}


def name_number(token: str) -> float:
    """A number as run names encode it: ``3e-4``, ``1em2`` = 1e-2, ``0p1`` = 0.1,
    ``010`` = 0.10 (a leading zero stands for the point), ``.5``, ``2``."""
    t = token.lower().replace("p", ".")
    t = re.sub(r"e(m)(\d)", r"e-\2", t)
    mant, _, exp = t.partition("e")
    if len(mant) > 1 and mant[0] == "0" and mant.isdigit():
        mant = "0." + mant[1:]                      # 010 -> 0.10, 0003 -> 0.003
    return float(mant + ("e" + exp if exp else ""))


def plausible(key: str, value) -> bool:
    """Whether ``value`` is in the plausible range of ``key`` (``RANGES``); other keys always are."""
    if key not in RANGES or value is None:
        return True
    lo, hi, lo_in = RANGES[key]
    return (value >= lo if lo_in else value > lo) and value <= hi


def range_text(key: str) -> str:
    lo, hi, lo_in = RANGES[key]
    return f"{'[' if lo_in else '('}{lo:g}, {hi:g}]"


# Paper B's run files (Brainchip-Inc/Do-Transformers-Need-3-Projections,
# imagenet_experiment.py): ``vit_s16_imagenet_<tag>.csv`` / ``.pt``, the tag
# being the condition with every non-alphanumeric character replaced by "_"
# and "_" stripped from the ends; the two conditions without "+" get an explicit
# "_noplus" tag, since stripping would give them the tag of their "+" form.
# Longest first: Q_K__V_noplus before Q_K__V.
PAPER_B_TAGS = {
    "Q_K__V_noplus": ("q_eq_k", "Q=K!=V"),            # Q=K-V without the + correction
    "Q_K_V_noplus": ("q_eq_k_eq_v", "Q=K=V"),         # Q=K=V without the + correction
    "Q__K_V": ("k_eq_v", "Q!=K=V"),                   # Q-K=V
    "Q_K__V": ("q_eq_k_plus", "(Q=K!=V)+"),           # (Q=K-V)+
    "Q_K_V": ("q_eq_k_eq_v_plus", "(Q=K=V)+"),        # (Q=K=V)+
    "QVV_3": ("k_eq_v", "QVV(3)"),                    # K=V with a depth-2 factored Q
    "QKV": ("qkv", "QKV"),
}
_PAPER_B_TAG = re.compile(r"(?:^|_)(" + "|".join(PAPER_B_TAGS) + r")$")


def paper_b_condition(stem: str) -> tuple[str, str] | None:
    """(stored variant, paper B's condition) for a file stem ending in one of
    paper B's tags (case as written), else None: ``vit_s16_imagenet_Q__K_V`` ->
    ``("k_eq_v", "Q!=K=V")``."""
    m = _PAPER_B_TAG.search(stem)
    return PAPER_B_TAGS[m.group(1)] if m else None


#: Words of a run or folder name that make it an image run (paper B's
#: ``checkpoints_imagenet/vit_s16_imagenet_QKV.csv``, its MNIST/CIFAR/TinyImageNet ViTs).
_IMAGE_WORDS = {"vit", "deit", "imagenet", "tinyimagenet", "mnist", "fmnist", "fashionmnist", "cifar",
                "cifar10", "cifar100"}


def task_from_name(text: str) -> str | None:
    """``"image"`` when a word of ``text`` (split at anything not a letter or digit)
    names a vision model or data set (``_IMAGE_WORDS``), else None."""
    words = set(re.split(r"[^a-z0-9]+", text.lower()))
    return "image" if words & _IMAGE_WORDS else None


def from_name(text: str, notes: list[str] | None = None) -> dict:
    """Metadata stated in a run or folder name (``wd0.03_lr6e-4_seed1_k_eq_v``).

    An lr or weight decay outside its plausible range is left out, with a line
    in ``notes`` when a list is given.
    """
    out: dict = {}
    low = text.lower()
    for key, pat in _NAME_PATTERNS.items():
        m = pat.search(low)
        if m:
            try:
                value = int(m.group(1)) if key in ("seed", "n_kv_heads") else name_number(m.group(1))
            except ValueError:
                continue
            if not plausible(key, value):
                if notes is not None:
                    notes.append(f"{key} {value:g} read from the name {text!r} refused: outside "
                                 f"{range_text(key)}")
                continue
            out[key] = value
    if re.search(r"(?:^|[^a-z])mqa(?:$|[^a-z])", low):
        out.setdefault("n_kv_heads", 1)
    paper_b = paper_b_condition(text)
    v = paper_b[0] if paper_b else _variant_in_text(low)
    if v:
        out["variant"] = v
    return out


def _flatten(cfg: dict, out: dict | None = None) -> dict:
    """Nested config dicts (model_args, model_config, train_config, ...) to one level;
    the first occurrence of a key wins."""
    out = {} if out is None else out
    nested = []
    for k, v in cfg.items():
        if isinstance(v, dict):
            nested.append(v)
        elif k not in out:
            out[k] = v
    for v in nested:
        _flatten(v, out)
    return out


def _number(v, kind):
    if isinstance(v, bool) or v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(x):
        return None
    return int(x) if kind is int else x


def from_config(cfg: dict) -> dict:
    """Metadata fields found in a (possibly nested) config dict."""
    flat = _flatten(cfg)
    low = {str(k).lower(): v for k, v in flat.items()}
    out: dict = {}
    for key in ("weight_decay", "lr"):
        for name in _KEYS[key]:
            if name in low and _number(low[name], float) is not None:
                out[key] = _number(low[name], float)
                break
    for key in ("n_kv_heads", "seed", "model_size"):
        for name in _KEYS[key]:
            if name in low and _number(low[name], int) is not None:
                out[key] = _number(low[name], int)
                break
    for name in _KEYS["variant"]:
        if name in low and normalise_variant(low[name]):
            out["variant"] = normalise_variant(low[name])
            break
    if "variant" not in out:
        # The query-free paper: use_query_weights False / query_mode "identity".
        if low.get("use_query_weights") is False or str(low.get("query_mode", "")).lower() == "identity":
            out["variant"] = "wq_identity"
    if "n_kv_heads" not in out and low.get("multi_query") is True:
        out["n_kv_heads"] = 1
    for name in _NAME_KEYS:
        if isinstance(low.get(name), str):
            hint = from_name(low[name])
            for k, v in hint.items():
                out.setdefault(k, v)
    return out


def _read_yaml(path: Path) -> dict | None:
    """A YAML config's mapping, ``None`` if it does not parse. Read within the
    budgets (``loaders.budgets.load_yaml``: file size, aliases counted in full,
    depth); a file over one raises ``LogFormatError`` naming it and the budget."""
    try:
        doc = load_yaml(path)
        if isinstance(doc, dict):
            walk_plain(doc, SideBudget().spend)      # text bytes, counted per occurrence
    except BudgetExceeded as exc:
        raise LogFormatError(path, f"config {exc}; refused") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return doc if isinstance(doc, dict) else None


def _read_json(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _read_py_literals(path: Path) -> dict | None:
    """``name = <literal>`` assignments of a Python config file; nothing is executed."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except (ValueError, SyntaxError, TypeError):
                if isinstance(node.value, ast.Dict):  # keep the literal entries of a dict
                    d = {}
                    for k, v in zip(node.value.keys, node.value.values):
                        try:
                            d[ast.literal_eval(k)] = ast.literal_eval(v)
                        except (ValueError, SyntaxError, TypeError):
                            continue
                    out[node.targets[0].id] = d
    return out or None


def _read_nanogpt_ckpt_config(path: Path) -> dict | None:
    import torch  # here, not at the top: importing loaders.logs (pages, `runs`) needs no torch

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # unsafe or unreadable checkpoint: its config is simply not used
        return None
    if not isinstance(ckpt, dict):
        return None
    out = {}
    for key in ("config", "model_args"):
        if isinstance(ckpt.get(key), dict):
            out[key] = {k: v for k, v in ckpt[key].items()
                        if isinstance(v, (int, float, str, bool)) or v is None}
    return out or None


def config_files(folder: Path, *, exclude: Path | None = None) -> dict[str, dict]:
    """Every config file in ``folder`` that parses, by file name (sorted)."""
    found: dict[str, dict] = {}
    if not folder.is_dir():
        return found
    for p in sorted(folder.iterdir()):
        if not p.is_file() or p == exclude or p.name.startswith("."):
            continue
        name = p.name
        doc = None
        if name in ("config.json", "args.json", "hparams.json", "training_args.json", "run_config.json"):
            doc = _read_json(p)
        elif p.suffix in (".yaml", ".yml"):
            doc = _read_yaml(p)
        elif p.suffix == ".py" and name.startswith("config"):
            doc = _read_py_literals(p)
        elif name == "ckpt.pt" and p.stat().st_size > 0:
            doc = _read_nanogpt_ckpt_config(p)
        elif name == "training_args.bin":
            doc = read_training_args(p)
        if doc:
            found[name] = doc
    return found


def gather(run_dir: Path, run_name: str, *, stated: dict, reader_config: dict,
           exclude: Path | None = None) -> tuple[dict, dict]:
    """(fields, config) for one run: ``fields`` has every key of FIELDS.

    ``stated`` is what the log itself says; ``reader_config`` what its reader
    kept as config. ``config`` gets ``run_dir``, the reader's config and each
    config file's content under ``files``.
    """
    files = config_files(run_dir, exclude=exclude)
    fields: dict = {}
    sources: dict = {}
    notes: list[str] = list(reader_config.get("metadata_notes", []))   # the reader's own first

    def take(found: dict, source: str) -> None:
        for k, v in found.items():
            if k not in FIELDS or v is None:
                continue
            if not plausible(k, v):
                notes.append(f"{k} {v:g} from {source} refused: outside {range_text(k)}")
                continue
            if k not in fields:
                fields[k] = v
                sources[k] = source
            elif source == "name" and k in RANGES and sources[k] != "name" \
                    and not math.isclose(v, fields[k], rel_tol=1e-9):
                notes.append(f"the name says {k} {v:g}, {sources[k]} says {fields[k]:g}: "
                             f"the file's value is kept")

    take({k: v for k, v in stated.items() if k in FIELDS}, "log")
    # a Trainer's arguments that its reader found beside the state (hf_trainer: ``training_args``)
    args = reader_config.get("training_args") if isinstance(reader_config.get("training_args"), dict) else {}
    take(from_config({k: v for k, v in reader_config.items() if k != "training_args"}), "log")
    take(from_config({k: v for k, v in args.items() if k not in ("file", "output_dir", "run_name")}),
         "training_args.bin")
    # This project's trainer and HF write config.json; it is the most specific file.
    for name in sorted(files, key=lambda n: (n != "config.json", n != "hparams.yaml", n)):
        take(from_config(files[name]), name)
    parts = [run_name, run_dir.name, run_dir.parent.name]
    for part in parts:
        take(from_name(part, notes), "name")
    variant = normalise_variant(fields.get("variant")) or "unknown"
    fields["variant"] = variant
    for k in FIELDS:
        fields.setdefault(k, None)
    config = {"run_dir": str(run_dir), **reader_config}
    paper_b = paper_b_condition(run_name)
    if paper_b:
        config["paper_condition"] = paper_b[1]
    if files:
        config["files"] = files
        # the task (language / image) a trainer's config states, lifted to the top level so the
        # pages and the Papers comparison read it in one place (this project's config.json first)
        task = next((f["task"] for n, f in sorted(files.items(), key=lambda kv: kv[0] != "config.json")
                     if isinstance(f, dict) and isinstance(f.get("task"), str) and f["task"].strip()), None)
        if task and "task" not in config:
            config["task"] = task.strip()
    if "task" not in config:
        # no config states it: a name that says ViT or ImageNet is an image run (no perplexity)
        task = next((t for t in map(task_from_name, parts[:2]) if t), None)   # the run and its folder
        if task:
            config["task"] = task
            sources["task"] = "name"
    config["metadata_sources"] = sources
    if notes:
        config["metadata_notes"] = list(dict.fromkeys(notes))
    return fields, config
