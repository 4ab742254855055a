"""lm-evaluation-harness results (``lm_eval --output_path DIR``:
``DIR/<model_name_sanitized>/results_<timestamp>.json``; also the older
single-object ``{"results": ..., "versions": ...}`` files): benchmark scores
of one model or checkpoint.

How they are stored:

* one point per score at the evaluated checkpoint's step, named
  ``eval/<task>/<metric>``: ``"acc_norm,none"`` of ``hellaswag`` ->
  ``eval/hellaswag/acc_norm``; a filter other than ``none`` is kept,
  ``"exact_match,strict-match"`` -> ``eval/gsm8k/exact_match/strict-match``;
  the standard error beside it -> ``eval/hellaswag/acc_norm_stderr``
  (a stderr of ``"N/A"``, as groups report, and any other value that is no
  number is counted on the file's report line);
* the step is the checkpoint's, read from the model it names
  (``config.model_args`` ``pretrained=`` / ``revision=``, else
  ``model_name``): ``revision=step143000`` (Pythia), ``.../checkpoint-500``
  (Trainer), ``.../iter_0001000`` (Megatron), ``.../global_step300``
  (DeepSpeed), ``.../step_1000``; with none, step 0 and a note saying so;
* the run is the model without its checkpoint part (``pretrained=out/
  checkpoint-500`` -> ``out``, ``EleutherAI/pythia-160m,revision=step1000``
  -> ``EleutherAI/pythia-160m``): results files of several checkpoints of one
  model under one ``--output_path`` form one run whose points are its
  benchmark curve (``loaders.logs.run_identity``);
* the run's config keeps the harness's ``model``, ``model_args``,
  ``n-shot``, ``limit``, ``git_hash`` and its seeds as ``eval_*_seed`` (the
  evaluation's seeds, not the training's); ``model_num_parameters`` (when
  positive) is the model size.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from loaders.errors import LogFormatError
from loaders.logs.base import Parsed, RunData, is_text_head, points_frame

NAME = "lm_eval"
PRIORITY = 32
HELP = ("lm-evaluation-harness results_*.json: per-task scores ('acc_norm,none') and stderr "
        "-> eval/<task>/<metric> at the evaluated checkpoint's step")
APPENDABLE = False
EXAMPLE = "eval_out/EleutherAI__pythia-160m/results_2024-06-01T10-00-00.json"

#: Keys of a task's result that label it, not scores.
_LABELS = {"alias", "name", "sample_len", "sample_count", "samples", " "}
#: How a model path or revision names its checkpoint's step.
_STEP = re.compile(r"(?:revision=|[/_-])(?:step|checkpoint|global_step|iter)[-_]?0*(\d+)(?=$|[/,])")
_CKPT_PART = re.compile(r"/(?:step|checkpoint|global_step|iter)[-_]?\d+/?$")


def sniff(path: Path, head: bytes) -> bool:
    return (is_text_head(head) and head.lstrip().startswith(b"{") and b'"results"' in head
            and b"_stderr" in head and b'"log_history"' not in head)


def checkpoint_step(model: str) -> int | None:
    """The step a model argument names (``pretrained=out/checkpoint-500``,
    ``revision=step1000``), None if it names none."""
    m = _STEP.search(model)
    return int(m.group(1)) if m else None


def model_name(doc: dict, path: Path) -> tuple[str, str]:
    """(the run's name: the model without its checkpoint part, the text read for the step)."""
    cfg = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    args = str(cfg.get("model_args") or "")
    kv = dict(p.split("=", 1) for p in args.split(",") if "=" in p)
    model = kv.get("pretrained") or kv.get("model") or kv.get("path") or doc.get("model_name") or ""
    model = str(model).rstrip("/")
    step_text = f"{model},revision={kv['revision']}" if kv.get("revision") else model
    base = _CKPT_PART.sub("", model)
    if base.startswith(("/", ".", "~")):          # a folder: its last part names the model
        base = base.rstrip("/").rsplit("/", 1)[-1]
    return base or path.parent.name, step_text


def read(path: Path, *, start: int = 0, state: dict | None = None, complete: bool = False) -> Parsed:
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise LogFormatError(path, f"expected UTF-8 JSON, found invalid byte at offset {exc.start}") from None
    except ValueError as exc:
        raise LogFormatError(path, f"expected lm-evaluation-harness results (JSON), found invalid JSON ({exc})") \
            from None
    results = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(results, dict) or not results:
        raise LogFormatError(path, "expected lm-evaluation-harness results with a 'results' object of tasks, "
                                   f"found {'keys ' + str(sorted(doc)[:10]) if isinstance(doc, dict) else type(doc).__name__}")
    names, values, odd = [], [], []
    for task, scores in results.items():
        if not isinstance(scores, dict):
            odd.append(f"{task}: {type(scores).__name__}")
            continue
        for key, v in scores.items():
            if key in _LABELS:
                continue
            metric, _, filt = str(key).partition(",")
            stderr = metric.endswith("_stderr")
            base = metric[:-len("_stderr")] if stderr else metric
            name = f"eval/{task}/{base}" + (f"/{filt}" if filt and filt != "none" else "") + \
                ("_stderr" if stderr else "")
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                names.append(name)
                values.append(float(v))
            else:
                odd.append(f"{task} {key}={v!r}"[:80])
    if not values:
        raise LogFormatError(path, f"expected numeric scores in 'results', found none "
                                   f"({len(odd)} values that are no number{': ' + odd[0] if odd else ''})")
    run, step_text = model_name(doc, path)
    step = checkpoint_step(step_text)
    said = f"the model {step_text!r} names no checkpoint step" if step_text else "it names no model"
    notes = [] if step is not None else [f"{path.name}: {said}; its scores are stored at step 0"]
    cfg = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    config = {"eval_model": cfg.get("model"), "eval_model_args": cfg.get("model_args"),
              "eval_limit": cfg.get("limit"), "eval_n_shot": doc.get("n-shot"),
              "lm_eval_git_hash": doc.get("git_hash"), "eval_step_from": step_text,
              **{f"eval_{k}": cfg[k] for k in ("random_seed", "numpy_seed", "torch_seed", "fewshot_seed")
                 if k in cfg}}
    config = {k: v for k, v in config.items() if v is not None}
    if notes:
        config["metadata_notes"] = notes
    n_params = cfg.get("model_num_parameters")
    meta = {"model_size": int(n_params)} if isinstance(n_params, (int, float)) and n_params > 0 else {}
    report = [f"{len(odd)} value{'s' * (len(odd) != 1)} not numbers, not read (first: {odd[0]})"] if odd else []
    pts = points_frame([step or 0] * len(values), names, values)
    return Parsed(runs=[RunData(name=run, points=pts, config=config, meta=meta)],
                  read_bytes=path.stat().st_size, notes=report)
