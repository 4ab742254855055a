"""Jobs: run an analysis over a stored checkpoint and store its results.

``analyze(store, checkpoint_id, activations=False, device=None, progress=None)``
opens the checkpoint (``loaders.checkpoints.open_checkpoint``), runs the
weight-level metrics layer by layer (``weight_frame``: ``analysis.weights`` with
the chance levels of ``analysis.chance``, and, from the same layer while it is
read, which projections are tied: ``layer_ties``, summed up by
``tied_summary``), optionally the activation metrics of a forward pass
(``experiments.activation_runs.corpus_activations``), and writes
``analysis_results`` rows plus one ``analysis_jobs`` row per kind (``weights`` /
``activations``) in one transaction (``loaders.results``). The job row is the
cache key: the same checkpoint, kind and ``analysis.registry.METRIC_VERSION``
again (for activations also the same ``SampleSpec.key``) is a cache hit that
reads the stored rows and computes nothing. Its ``notes`` JSON says why each
absent metric is absent.

A stored file is someone's file: ``analyze`` computes in the sandbox
(``loaders.sandbox``, job ``analyze`` of ``app.sandbox_jobs``: ``compute_jobs``, under the memory budget and
``QKVSCOPE_ANALYSIS_TIMEOUT_S``), the rows coming back as JSON; ``resolve``
ingests a path that is not stored yet in such a child too. The parent only resolves, checks
and stores: this module loads no torch when imported, and the functions that read tensors
(``weight_frame``, ``layer_ties``, ``_compute``, ``compute_jobs``) import the metric code when
they run, in the child.

Where the rest lives (callers import it from there):

* ``experiments.runnable``: loading a checkpoint as a model that runs
  (``NoForwardPass``, ``model_code_reason``, ``load_runnable``, ``feed``);
* ``experiments.activation_runs``: the activation metrics on a corpus or image
  sample (``ActivationRun``, ``corpus_activations``; the sample, ``SampleSpec``, is
  ``experiments.sample_text``'s);
* ``experiments.attention_maps``: the Inspector's maps (``capture_activations``,
  ``SAMPLE_TEXT``, ``MAX_TOKENS``);
* ``analysis.captures``: the pure math on captured tensors;
* ``analysis.notes``: the notes beside result rows.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pandas as pd

from analysis.registry import BY_NAME, METRIC_VERSION, RESULT_COLUMNS, names
from analysis.result_rows import json_rows, rows_frame
from analysis.tie_names import tied_variant
from experiments.sample_text import SampleSpec
from loaders.errors import CheckpointFormatError, FileError, QkvscopeError, StoreError
from loaders.results import current_job, replace_results
from loaders.store import Store

if TYPE_CHECKING:
    from loaders.canonical import Checkpoint

Progress = Callable[[int, int, str], None]  # (done, total, what is being done)
Opener = Callable[[str], "Checkpoint"]


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


# -- computation over an opened checkpoint ------------------------------------------
def weight_frame(ckpt: Checkpoint, *, device: str | None = None, progress: Progress | None = None,
                 layers: range | None = None, nonfinite_notes: bool = True,
                 ties: list[dict] | None = None) -> tuple[pd.DataFrame, dict[str, str]]:
    """Every weight-level metric of every layer of ``ckpt``; one layer in memory at a time.

    ``layers`` (a ``range`` of layer indices) computes only those layers, reading
    only their tensors; the rows are the same as the whole checkpoint's rows of
    those layers, but for the pairs of layers (``analysis.cross_layer``), computed
    only over all the layers (a note says so otherwise). ``nonfinite_notes=False`` leaves out the notes that name the
    heads with undefined values: a caller that joins several layer ranges adds
    them once over the joined frame (``app.batch``), so its notes equal the
    whole checkpoint's. ``ties``: a list that gets each layer's ties (``layer_ties``)
    from the tensors already read for its metrics, so the file is read once, not again for them.
    """
    # here, not at the top: torch loads where tensors are read (the reading child), never in the
    # parent that only reads and stores results
    from analysis.above_chance import flag as flag_above_chance
    from analysis.chance import attach_weight_chance
    from analysis.cross_layer import WeightPairs
    from analysis.degenerate import tie_fixed
    from analysis.finite import nonfinite, unfit_dtype, widened, zeroed
    from analysis.notes import layout_notes, merge_notes
    from analysis.notes import nonfinite_notes as heads_nonfinite   # the parameter holds the name
    from analysis.registry import COLUMNS
    from analysis.weights import weight_metrics

    ties = [] if ties is None else ties        # every layer's ties: the values they fix are degenerate
    frames, notes = [], {}
    unfinite: dict[int, str] = {}           # layer -> its non-finite values
    todo = range(ckpt.meta.n_layers) if layers is None else layers
    n = len(todo)
    query_free = ckpt.meta.variant == "wq_identity"
    pairs = zip(todo, ckpt.layers()) if layers is None else ((i, ckpt.layer(i)) for i in todo)
    # the layer_pair metrics pair every layer with every other: over the whole model only (a batch's
    # one group of all the layers included)
    cross = WeightPairs() if list(todo) == list(range(ckpt.meta.n_layers)) else None
    for done, (i, layer) in enumerate(pairs):
        if progress:
            progress(done, n, f"weights layer {i}")
        # each layer with its own tower's geometry (a CLIP's vision and text towers differ)
        lm = ckpt.meta.layer_meta(i)
        tensors = layer.tensors()
        unfit = unfit_dtype(tensors)
        if unfit is not None:
            raise CheckpointFormatError(ckpt.path, f"expected floating-point attention weights, found layer {i}'s "
                                                   f"{unfit}: no metric is computed from such weights")
        layer = replace(layer, **widened(tensors))
        bad = nonfinite(tensors)
        if bad is None:
            df, nt = weight_metrics(layer, lm, device=device)
        else:       # the rows of a finite layer of this shape, every value null
            df, nt = weight_metrics(replace(layer, **zeroed(tensors)), lm, device=device)
            df["value"] = float("nan")
            unfinite[i] = bad
        ties.append(layer_ties(layer, lm, device=device))
        if cross is not None:
            cross.add(layer, lm, finite=bad is None)
        # dropped before the chance levels' random layers (as large as this one; made for the first
        # layer of each shape) and before the next layer is read: one layer in memory at a time. The
        # first layer is read before any chance level, so a file that cannot be read says so first.
        del layer
        # chance levels: the same metrics of independent Gaussian projections of these shapes
        # (computed once per shape and process, see analysis.chance)
        frames.append(attach_weight_chance(df, lm, query_free=query_free, device=device, notes=nt))
        merge_notes(notes, nt)
    if cross is not None:
        if progress:
            progress(n, n, "weights: pairs of layers")
        cross_frame, cross_notes = cross.result()
        frames.append(cross_frame)
        merge_notes(notes, cross_notes)
    else:
        for metric in names("weights"):
            if BY_NAME[metric].axis == "layer_pair":
                notes[metric] = "computed over all of the model's layers together, not over a range of layers"
    if progress:
        progress(n, n, "weights done")
    frame = pd.concat(frames, ignore_index=True) if frames else \
        attach_weight_chance(pd.DataFrame(columns=COLUMNS), ckpt.meta, query_free=False, device=device)
    # values a tie fixes are degenerate; then "above chance" is tested over each metric's heads
    frame = flag_above_chance(tie_fixed(frame, ties, notes))
    # layout notes first, undefined-value notes after: a batch's layer groups join to the same text
    layout_notes(notes, ckpt.meta, frame)
    if nonfinite_notes:   # the heads of non-finite layers are said once, below
        heads_nonfinite(frame[~frame["layer"].isin(list(unfinite))], notes)
    if unfinite:
        said = "null at layers with non-finite weights: " + "; ".join(
            f"layer {i} ({bad})" for i, bad in unfinite.items())
        for metric in sorted(set(frame["metric"])):
            notes[metric] = f"{notes[metric]}; {said}" if metric in notes else said
    return frame, notes


def layer_ties(layer, meta, *, device=None) -> dict:
    """One layer's ties (``analysis.tied.tied_layer``) as every surface reads them: ``meta`` is the
    layer's own geometry (``ModelMeta.layer_meta``: a CLIP's towers differ), float8 tensors are
    compared as float32 (torch has no norm in float8). ``weight_frame`` calls it on the layers its
    metrics read, ``read_ties`` on every layer of a file."""
    from analysis.finite import widened     # here: torch loads where tensors are read
    from analysis.tied import tied_layer

    return tied_layer(replace(layer, **widened(layer.tensors())), meta, device=device)


def read_ties(path: str, *, device=None) -> list[dict]:
    """Every layer's ties (``layer_ties``) of the checkpoint at ``path``, one layer in memory at a
    time: what ``info`` prints under ``tied`` and what the Inspector checks for an analysis stored
    without ties (the sandbox's job ``ties``); ``analyze`` reads the same from the layers its
    metrics read (``weight_frame``), and ``tests/app/test_ties_agree.py`` holds the three to it."""
    from loaders.checkpoints import open_checkpoint   # here: torch loads when a checkpoint is opened

    with open_checkpoint(path) as ckpt:
        return [layer_ties(layer, ckpt.meta.layer_meta(i), device=device) for i, layer in enumerate(ckpt.layers())]


def tied_summary(layers: list[dict], layout_variant: str) -> dict:
    """Which projections are tied, from each layer's ties (``layer_ties``, collected
    by ``weight_frame``): ``{"variant": tied variant, "layout_variant": the layout's, "agree": bool,
    "layers": [...]}``."""
    variant = tied_variant(layers)
    return {"variant": variant, "layout_variant": layout_variant, "agree": variant == layout_variant,
            "layers": layers}


# -- the store side ----------------------------------------------------------------
def checkpoint_row(store: Store, checkpoint_id: int) -> dict:
    """``id, path, architecture, variant`` of a stored checkpoint (``Store.checkpoint``)."""
    return store.checkpoint(checkpoint_id)


def _label(layer, head, metric: str, layer2=None, head2=None) -> str:
    """A stored row's label as ``weight_metrics`` and ``analysis.cross_layer`` give it: ``L{l}``,
    ``L{l}H{h}`` / ``L{l}KV{g}``, a pair of layers ``L{l}-L{l2}``, a pair of heads ``L{l}H{h}-H{h2}``."""
    if not _missing(layer2):
        return f"L{layer}-L{int(layer2)}"
    if _missing(head):
        return f"L{layer}"
    tag = "KV" if BY_NAME[metric].axis in ("kv_head", "kv_head_pair") else "H"
    return f"L{layer}{tag}{int(head)}" + ("" if _missing(head2) else f"-{tag}{int(head2)}")


def _missing(v) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def _cached(store: Store, checkpoint_id: int, kind: str, sample: dict | None = None) -> JobResult | None:
    """The stored job of ``kind`` when it is current (``loaders.results.current_job``, the one
    staleness rule), as a ``JobResult`` with ``cached=True``; None when it has to run."""
    job = current_job(store, checkpoint_id=checkpoint_id, kind=kind, metrics=names(_level(kind)),
                      metric_version=METRIC_VERSION, sample=sample)
    if job is None:
        return None
    frame = job.rows.copy()
    pair = [frame[c] if c in frame.columns else [None] * len(frame) for c in ("layer2", "head2")]
    frame.insert(2, "head_label", [_label(l, h, m, l2, h2) for l, h, m, l2, h2 in
                                   zip(frame["layer"], frame["head"], frame["metric"], *pair)])
    frame["layer"] = frame["layer"].astype(int)
    return JobResult(checkpoint_id, "", kind, frame[RESULT_COLUMNS], job.notes, cached=True,
                     seconds=job.seconds, device=job.device, sample=job.sample, tied=job.tied)


def _level(kind: str) -> str:
    """The registry level of a job ``kind`` (``weights`` or ``activations``)."""
    return "weights" if kind == "weights" else "activations"


def _store_results(store: Store, results: list[JobResult]) -> None:
    with store.transaction() as con:
        for res in results:
            replace_results(con, checkpoint_id=res.checkpoint_id, kind=res.kind, metrics=names(_level(res.kind)),
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
            hit = _cached(store, checkpoint_id, kind, sample.key() if kind == "activations" else None)
            if hit is not None:
                hit.path = info["path"]
                results[kind] = hit
    todo = [k for k in kinds if k not in results]
    # a stored weights job's ties flag the activation values they fix (computed weights bring their own)
    stored = results.get("weights")
    known_ties = (stored.tied or {}).get("layers") if stored is not None else None
    if todo:
        if opener is None:
            if not Path(info["path"]).exists():
                raise StoreError(f"{info['path']}: checkpoint {checkpoint_id} is stored but its file is gone; "
                                 "re-ingest it from its new place")
            # a stored file is someone's file: analysed in a child process under the memory budget
            # and QKVSCOPE_ANALYSIS_TIMEOUT_S (loaders/sandbox.py), so a bomb ends that process;
            # the child is pooled (as batch tasks' are): a page analysing 23 checkpoints one after
            # another pays the child's 2-3 s of imports once, and a child that died is replaced.
            # The child picks the default device: this process never loads torch.
            from app.sandbox_jobs import call

            if progress:
                progress(0, 1, "analysing in a child process")
            got = call("analyze", info["path"], pooled=True, timeout="QKVSCOPE_ANALYSIS_TIMEOUT_S",
                       kinds=todo, device=device, text=sample.text, tokens=sample.tokens, images=sample.images,
                       ties=known_ties)
            fresh = [_job_from_json(checkpoint_id, info["path"], g) for g in got]
        else:
            from analysis.weights import default_device  # here: torch, for a checkpoint opened in this process

            dev = device or default_device()
            with opener(info["path"]) as ckpt:
                fresh = [_job_from_json(checkpoint_id, info["path"], g) for g in
                         _compute(ckpt, todo, dev, sample, progress, ties=known_ties)]
        for res in fresh:
            results[res.kind] = res
        _store_results(store, fresh)
    return [results[k] for k in kinds]


def _compute(ckpt: Checkpoint, kinds: list[str], device, sample: SampleSpec,
             progress: Progress | None = None, ties: list[dict] | None = None,
             layers: tuple[int, int] | None = None) -> list[dict]:
    """The metrics of ``kinds`` of an opened checkpoint, each as a JSON-able job
    (``kind, rows, notes, seconds, device, sample, tied``): what ``analyze`` stores, and
    what every batch task computes (``compute_jobs``), so both store the same job rows.

    ``ties``: each layer's ties (``analysis.tied``) when the weights are not among ``kinds`` (a
    stored weights job's): the activation values they fix are flagged ``degenerate``.
    ``layers`` ``(first, stop)``: the weight metrics of those layers only (a batch's layer
    group), without the undefined-value notes, its ``tied`` summing up those layers only: the
    batch driver joins the groups (``app.batch.register.finalise_groups``)."""
    out, known = [], list(ties or [])
    from loaders import chance_cache  # here: it imports analysis.chance (torch); the parent stays torch-free

    chance_cache.install()                   # chance levels of a geometry met before are read, not drawn
    for kind in kinds:
        t0 = time.perf_counter()
        used = tied = None
        if kind == "weights":
            per_layer: list[dict] = []
            frame, notes = weight_frame(ckpt, device=device, progress=progress, ties=per_layer,
                                        layers=None if layers is None else range(*layers),
                                        nonfinite_notes=layers is None)
            tied, known = tied_summary(per_layer, ckpt.meta.variant), per_layer
        else:
            # here: a weights job never loads the forward pass (the model classes, tokenizers, images)
            from experiments.activation_runs import corpus_activations
            from experiments.runnable import NoForwardPass

            try:
                run = corpus_activations(ckpt, sample=sample, device=device, progress=progress)
                frame, notes, used = run.frame, dict(run.notes), run.sample
                # values a tie fixes are degenerate (and untested)
                from analysis.degenerate import tie_fixed  # here: torch, as the forward pass above

                frame = tie_fixed(frame, known, notes)
            except NoForwardPass as exc:
                frame = pd.DataFrame(columns=RESULT_COLUMNS)
                notes, used = {m: str(exc) for m in names("activations")}, sample.key()
        out.append({"kind": kind, "rows": json_rows(frame), "notes": notes,
                    "seconds": time.perf_counter() - t0, "device": str(device), "sample": used, "tied": tied})
    return out


def compute_jobs(path: str, *, kinds: list[str], device: str | None, text: str | None = None,
                 tokens: int | None = None, images: str | None = None,
                 ties: list[dict] | None = None, layers: list[int] | None = None) -> list[dict]:
    """``_compute`` on the checkpoint at ``path``: the body ``analyze`` and every batch task
    (``app.batch.task``) run in the child process. ``device`` None: cuda when available, else cpu
    (resolved here, where a batch task runs). ``layers`` ``[first, stop)``: a batch's layer group; a
    range outside the file's layers is a ``FileError`` (the file changed since it was ingested)."""
    from analysis.weights import default_device  # here: torch loads when a checkpoint is opened
    from loaders.checkpoints import open_checkpoint

    with open_checkpoint(path) as ckpt:
        if layers is not None and not 0 <= layers[0] < layers[1] <= ckpt.meta.n_layers:
            raise FileError(path, f"layers {layers[0]}-{layers[1] - 1} do not exist: the file has "
                                  f"{ckpt.meta.n_layers} layers (it changed since it was ingested; ingest it again)")
        return _compute(ckpt, list(kinds), device or default_device(), SampleSpec(text, tokens, images), ties=ties,
                        layers=None if layers is None else (layers[0], layers[1]))


def _job_from_json(checkpoint_id: int, path: str, job: dict) -> JobResult:
    """A ``JobResult`` from ``_compute``'s JSON-able job (rows in ``RESULT_COLUMNS`` order)."""
    return JobResult(checkpoint_id, path, job["kind"], rows_frame(job["rows"]), job["notes"], cached=False,
                     seconds=job["seconds"], device=job["device"], sample=job["sample"], tied=job["tied"])


def resolve(store: Store, target: str, *, reader=None) -> int:
    """A checkpoint id from ``target``: an existing path is ingested first, else an integer id.

    A path the ingest journal knows at its current size and mtime (``loaders.ingest.journalled``)
    is its stored id, nothing of the file read; one that is not a regular file is refused from its
    ``stat`` (``FileError``), as the child would refuse it. Any other path is someone's file: it is read and
    stored by the child process of the sandbox (``loaders.sandbox``, under the memory and time budgets), never in this
    process, so a bomb ends that child with one line ``PATH: what`` (``FileError``).
    ``reader`` (a ``loaders.sandbox.Sandbox`` of ``app.sandbox_jobs``) reuses one child over
    several targets; None borrows the pooled child of ``app.sandbox_jobs``, the one the analysis
    that follows runs in (one child for both).
    """
    path = Path(target).expanduser()
    if path.exists():
        # here: a path only (an id needs neither); both stay torch-free
        from app.sandbox_jobs import pooled
        from loaders.ingest import journalled
        from loaders.sandbox import ingest_checkpoint

        try:
            known = journalled(store, path)       # a stat and a query: no child for a file stored unchanged
        except FileError:
            # not a regular file (a FIFO, a device, a dangling link: ``loaders.filecheck``, by
            # ``stat`` alone): the child's ingest would stop at the same check, so no child starts
            raise
        except QkvscopeError:
            known = None                           # the child says what is wrong with it, as for any file
        if known is not None:
            return known
        if reader is None:
            with pooled() as box:
                rep = ingest_checkpoint(store, path, reader=box)
        else:
            rep = ingest_checkpoint(store, path, reader=reader)
        if rep.checkpoint_id is None:
            raise QkvscopeError(f"{path}: not analysable: {rep.reason or rep.status}")
        return int(rep.checkpoint_id)
    try:
        return int(target)
    except ValueError:
        raise StoreError(f"{target}: neither an existing file or folder nor a checkpoint id") from None
