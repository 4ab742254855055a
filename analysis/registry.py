"""Every metric qkvscope computes, one row each: name, level, axis, family, help, direction, chance rule.

The CLI (``analyze --list``, the JSON rows), the jobs (what is stored and read
back), the chance levels (``analysis.chance`` by each row's rule) and the
Inspector's and Compare's metric lists read their lists and facts from
``METRICS`` (``BY_NAME``); a metric that is computed but not registered is a
bug (a test checks it).

* ``level``: ``weights`` (from the checkpoint alone) or ``activations``
  (needs a forward pass on sample tokens).
* ``axis``: ``head`` (one value per query head), ``kv_head`` (per kv head),
  ``layer`` (``head`` is None: the whole layer) or ``head+layer`` (both). The
  K and V spectra (``erank_k``, ... ``energy_rank99_v``) are ``kv_head`` and
  also have a whole-layer row (``head`` None) for grouped-query models. Pairs:
  ``head_pair`` / ``kv_head_pair`` (a weight ``compute`` returns the layer's
  ``[n, n]`` matrix over its query / kv heads; rows ``(layer, head, head2)`` for
  ``head2 != head``: the diagonal is no pair) and ``layer_pair`` (one value per
  pair of layers, rows ``(layer, layer2)`` with ``head`` NA; computed over the
  whole model, not by the per-layer ``compute``).
* ``direction``: which way a value reads as *more redundant*, in the words of
  ``analysis.directions``: ``max`` (higher: K and V alike, M symmetric), ``min``
  (lower: fewer directions used, W_Q closer to absorbable), ``none`` (neither:
  a scale, or a signed asymmetry). ``directions.best(values, name,
  overrides={name: BY_NAME[name].direction})`` picks the most redundant.
* ``chance``: how ``analysis.chance`` (weights) or ``analysis.activations``
  gives the row's chance level: ``closed`` (a closed form where it exists for
  the geometry, else ``monte_carlo``), ``monte_carlo`` (the median over random
  Gaussian layers of the same shapes), ``random_projection`` (activations: the
  same captured input through random projections) or ``none`` (NaN);
  ``chance_help`` says it in one line, with the reason for ``none``.
* ``reads``: the projections (``Q``, ``K``, ``V``, ``O``) the value depends on (the
  loaders' notes on what a QK-norm or a composed map changes are keyed by them);
  ``fixed_by``: the ties (``q_identity``, ``q_eq_k``, ``k_eq_v``) that fix the value by
  construction (``analysis.degenerate`` flags those rows).

**Adding a metric** (docs/contributing.md, "Adding a metric"):
``register(Metric(...), compute)`` (or ``@register(Metric(...))`` on the
function) appends the row here; the built-in families of ``analysis/metrics/``
make the same call. ``weight_metrics`` then runs ``compute`` on every layer with
the layer's shared products (``analysis.products``), ``analysis.chance`` gives its
chance level by the row's rule, and the CLI, the store, the loaders' notes (by
``reads``), the degenerate flags (by ``fixed_by``) and the pages list it like every
other metric. ``QKVSCOPE_PLUGINS`` names the modules that register
metrics (comma-separated module names on the Python path, or ``.py`` files);
so do the entry points of the group ``qkvscope.metrics`` (``ENTRY_POINT_GROUP``)
of every installed distribution: a package whose ``pyproject.toml`` says
``[project.entry-points."qkvscope.metrics"] mine = "my_package.metrics"`` has
that module imported. Both are imported when this module is (so also in the
analysis child process and on Ray workers that inherit the environment). A module that fails to
import is reported by ``plugin_error()``, which the analysis and the CLI raise
as one line (``check_plugins``), instead of an import-time traceback.

``METRIC_VERSION`` is stored beside every value; bump it when any formula or
its numerics change, so stored results are recomputed instead of reused (a
plugin's formula is the plugin's: results stored before it was loaded lack its
rows until ``analyze --force``).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

import pandas as pd

from analysis.errors import AnalysisError
from analysis.tie_names import TIE_WORDS

METRIC_VERSION = 7

#: The columns of every tidy metric frame.
COLUMNS = ["layer", "head", "head_label", "metric", "value"]
#: What a stored or reported result row holds: the tidy columns plus its meaning.
#: ``chance``: the value independent projections of the same shapes give
#: (``analysis.chance``); ``n_tokens``: sample tokens behind an activation value
#: (NA for weight metrics); ``ci_low``/``ci_high``: 95% jackknife-t interval over
#: token windows (activation metrics; NA for weight metrics); ``chance_low``/``chance_high``: the
#: 2.5% and 97.5% quantiles of the null draws behind ``chance`` (the null band, ``analysis.chance``);
#: ``above_chance``: the value (weights) or its interval (activations) outside the null band at a
#: Benjamini-Hochberg false discovery rate of 5% over the metric's heads (``analysis.above_chance``;
#: NA where it is not tested); ``degenerate``: the value is fixed by construction, not measured
#: (``analysis.degenerate``; the notes say why).
#: ``layer2``/``head2``: the second member of a pair (axes ``layer_pair``, ``head_pair``,
#: ``kv_head_pair``; NA on every other row): a cross-layer value is the row ``(layer, layer2)``
#: with ``head`` NA, a cross-head value the row ``(layer, head, head2)``.
PAIR_COLUMNS = ["layer2", "head2"]
RESULT_COLUMNS = COLUMNS + ["chance", "n_tokens", "ci_low", "ci_high", "chance_low", "chance_high",
                            "above_chance", "degenerate"] + PAIR_COLUMNS

LEVELS = ("weights", "activations")
AXES = ("head", "kv_head", "layer", "head+layer", "head_pair", "kv_head_pair", "layer_pair")
#: The axes whose rows are pairs (``PAIR_COLUMNS``): ``head_pair`` (query heads ``h``, ``h2`` of one
#: layer), ``kv_head_pair`` (kv heads of one layer), ``layer_pair`` (layers ``l``, ``l2``).
PAIR_AXES = ("head_pair", "kv_head_pair", "layer_pair")
#: ``direction``: a higher (``max``) or lower (``min``) value is more redundant, or ``none``.
DIRECTIONS = ("max", "min", "none")
#: ``chance`` rules each level knows (module docstring).
CHANCE_RULES = {"weights": ("closed", "monte_carlo", "none"), "activations": ("random_projection", "none")}
#: The environment variable naming the modules that register metrics.
PLUGINS_ENV = "QKVSCOPE_PLUGINS"
#: The entry-point group whose entries installed packages register metrics through.
ENTRY_POINT_GROUP = "qkvscope.metrics"


#: The projections a metric can read (``Metric.reads``): the loaders' per-projection notes
#: (a QK-norm changes what the W_Q and W_K metrics describe) are keyed by them.
PROJECTIONS = ("Q", "K", "V", "O")
#: The ties of ``analysis.tied.tied_layer`` that can fix a metric's value (``Metric.fixed_by``):
#: all it detects but W_Q = W_V, which fixes no metric.
TIES = tuple(tie for tie in TIE_WORDS if tie != "q_eq_v")


@dataclass(frozen=True)
class Metric:
    """One registered metric (module docstring); the fields are checked when the row is built.

    ``reads``: the projections (``PROJECTIONS``) its value depends on; ``fixed_by``: the ties
    (``TIES``) that fix its value by construction (``analysis.degenerate.tie_fixed`` flags those rows).
    """

    name: str
    level: str
    axis: str
    family: str
    help: str
    direction: str
    chance: str
    chance_help: str
    reads: tuple[str, ...] = ()
    fixed_by: tuple[str, ...] = ()

    def __post_init__(self):
        for field, allowed in (("level", LEVELS), ("axis", AXES), ("direction", DIRECTIONS),
                               ("chance", CHANCE_RULES.get(self.level, ()))):
            if getattr(self, field) not in allowed:
                raise AnalysisError(f"metric {self.name!r}: {field} must be one of {', '.join(allowed)}, "
                                    f"found {getattr(self, field)!r}")
        for field, allowed in (("reads", PROJECTIONS), ("fixed_by", TIES)):
            bad = [x for x in getattr(self, field) if x not in allowed]
            if bad or isinstance(getattr(self, field), str):
                raise AnalysisError(f"metric {self.name!r}: {field} must be a tuple of {', '.join(allowed)}, "
                                    f"found {getattr(self, field)!r}")
        if not self.name.isidentifier() or not self.help or not self.chance_help:
            raise AnalysisError(f"metric {self.name!r}: needs a name that is an identifier, a help text and "
                                "a chance_help text")


class Values(NamedTuple):
    """What a weight metric's ``compute`` may return to give both a per-head and a per-layer value
    whatever its axis (e.g. the K and V spectra: per kv head, and per layer for grouped-query models);
    either may be None (no such row)."""

    per_head: object = None
    whole: object = None


class Absent(Exception):
    """Raised by a metric's ``compute`` where the metric does not exist for the layer; the message is the note."""


@dataclass(frozen=True)
class Plugin:
    """A registered metric and the functions behind it (built-in or not: ``register``).

    ``compute``: weights, ``compute(layer, meta, device)`` with the layer's
    ``analysis.products.LayerProducts`` (its canonical tensors as float32 on
    ``device``, ``W_Q`` ... ``b_V``, and the shared float64 Grams, cross
    products and decompositions, each formed once per layer for every metric
    that reads it) and its geometry, returning ``n_heads`` values (axis
    ``head``), ``n_kv_heads`` values (``kv_head``), one number (``layer``), the
    pair ``(per_head, whole)`` (``head+layer``) or ``Values(per_head, whole)``;
    raise ``Absent(reason)`` where the metric does not exist for the layer.
    Activations, ``compute(stats, d_head)`` on the accumulated float64 sums of
    ``analysis.activations`` with any leading batch dimensions, returning
    ``[..., n_kv_heads]``, ``[..., n_heads]`` or ``[...]`` (axis ``layer``); the
    built-in activation metrics are declared without one (``declare``): the
    estimator of ``analysis.activations`` computes them with their intervals.
    A ``layer_pair`` weight metric's ``compute(layer, rows)`` is the layer's part of every pair
    (``analysis.metrics.cross_layer``: its centred row-space Gram at the sampled input dimensions
    ``rows``), paired over the whole model by ``analysis.cross_layer.WeightPairs``.
    ``closed_form(geometry, query_free) -> float | None`` (rule ``closed``
    only): the chance level from the shapes, None where it has none (then
    Monte Carlo). ``null_draws(geometry, query_free, seed, batch) -> Tensor | None``
    (optional, per-layer weight metrics): the ``batch``-th batch of exact draws of the
    per-layer value on random layers of ``geometry``, deterministic in ``seed``, from
    something cheaper than a random layer through ``weight_metrics``; None where it has
    none (then random layers).
    """

    metric: Metric
    compute: Callable | None
    closed_form: Callable | None = None
    null_draws: Callable | None = None


#: Every registered metric in registration order: the built-in families of ``analysis.metrics`` first
#: (each module registers its own when the package is imported, at the end of this module), then plugins.
METRICS: list[Metric] = []
BY_NAME: dict[str, Metric] = {}
#: Every metric's functions by name, built-in and plugin alike, in registration order.
COMPUTE: dict[str, Plugin] = {}
#: The metrics registered from outside the built-in families (``analysis.metrics``), by name.
PLUGINS: dict[str, Plugin] = {}
#: The package whose modules declare the built-in metrics.
BUILTIN_PACKAGE = "analysis.metrics"
_state = {"generation": 0, "error": None}


def names(level: str | None = None, family: str | None = None) -> list[str]:
    """Registered metric names, optionally of one level and/or family, in registry order."""
    return [m.name for m in METRICS if (level is None or m.level == level)
            and (family is None or m.family == family)]


#: Axes with one value per (query or kv) head: what the pages' head heatmaps can show.
PER_HEAD_AXES = ("head", "kv_head", "head+layer")


def head_metrics() -> list[str]:
    """Metrics with a value per head (``PER_HEAD_AXES``), in registry order, plugins included
    (called when a page renders, so a metric registered after import is listed)."""
    return [m.name for m in METRICS if m.axis in PER_HEAD_AXES]


def with_pair_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with ``PAIR_COLUMNS`` as nullable Int64 (NA where it had none); a copy."""
    out = frame.copy()
    for col in PAIR_COLUMNS:
        out[col] = pd.array(out[col] if col in out.columns else [pd.NA] * len(out), dtype="Int64")
    return out


def describe() -> pd.DataFrame:
    """The registry as a table (name, level, axis, family, help) for pages and docs."""
    return pd.DataFrame([m.__dict__ for m in METRICS], columns=["name", "level", "axis", "family", "help"])


def register(metric: Metric, compute: Callable | None = None, *, closed_form: Callable | None = None,
             null_draws: Callable | None = None):
    """Add ``metric``'s row and its ``compute`` function (``Plugin`` gives both signatures).

    Returns ``compute``; without it, a decorator that registers the function it
    decorates: ``@register(Metric(...))``. ``closed_form`` goes with the rule
    ``closed`` and only with it; ``null_draws`` (``Plugin``) is optional. A name already registered is refused. The built-in
    families (modules of ``analysis.metrics``) register theirs with this same call;
    every other caller's metric is a plugin (``PLUGINS``).
    """
    if compute is None:
        return lambda fn: register(metric, fn, closed_form=closed_form, null_draws=null_draws)
    if not callable(compute):
        raise AnalysisError(f"metric {getattr(metric, 'name', metric)!r}: compute must be a function, "
                            f"found {type(compute).__name__}")
    _add(metric, compute, closed_form, null_draws)
    return compute


def declare(metric: Metric, *, closed_form: Callable | None = None) -> None:
    """Add a built-in activation metric's row: ``analysis.activations``' estimator computes its
    values (with their intervals and chance levels), so it has no ``compute`` of its own."""
    if metric.level != "activations":
        raise AnalysisError(f"metric {metric.name!r}: only activation metrics are declared without compute")
    _add(metric, None, closed_form)


def _add(metric: Metric, compute: Callable | None, closed_form: Callable | None,
         null_draws: Callable | None = None) -> None:
    if not isinstance(metric, Metric):
        raise AnalysisError(f"register: expected an analysis.registry.Metric, found {type(metric).__name__}")
    if metric.name in BY_NAME:
        raise AnalysisError(f"metric {metric.name!r}: already registered (family {BY_NAME[metric.name].family})")
    if (metric.chance == "closed") != (closed_form is not None):
        raise AnalysisError(f"metric {metric.name!r}: the chance rule 'closed' needs closed_form= "
                            f"(and only it takes one); found rule {metric.chance!r}"
                            + (" with" if closed_form is not None else " without") + " closed_form")
    if metric.level == "activations" and metric.axis == "head+layer" and compute is not None:
        raise AnalysisError(f"metric {metric.name!r}: an activation plugin has axis head, kv_head or layer "
                            "(register the per-layer value as a metric of its own)")
    entry = Plugin(metric, compute, closed_form, null_draws)
    METRICS.append(metric)
    BY_NAME[metric.name] = metric
    COMPUTE[metric.name] = entry
    builtin = compute is None or (getattr(compute, "__module__", "") or "").startswith(BUILTIN_PACKAGE + ".")
    if not builtin:
        PLUGINS[metric.name] = entry
    _state["generation"] += 1


def unregister(name: str) -> None:
    """Remove a plugin's row (tests; a built-in metric cannot be removed)."""
    if name not in PLUGINS:
        raise AnalysisError(f"metric {name!r}: not a registered plugin")
    del PLUGINS[name], COMPUTE[name]
    METRICS.remove(BY_NAME.pop(name))
    _state["generation"] += 1


def plugins(level: str) -> list[Plugin]:
    """The plugins of ``level``, in registration order."""
    return [p for p in PLUGINS.values() if p.metric.level == level]


def computed(level: str = "weights") -> list[Plugin]:
    """Every metric of ``level`` with a ``compute``, built-in and plugin alike, in registration order."""
    return [p for p in COMPUTE.values() if p.metric.level == level and p.compute is not None]


def reading(projection: str) -> tuple[str, ...]:
    """The names of the metrics that read ``projection`` (``PROJECTIONS``), in registration order."""
    return tuple(m.name for m in METRICS if projection in m.reads)


def closed_form(name: str, geometry, query_free: bool) -> float | None:
    """The closed-form chance level of ``name`` (rule ``closed``) for ``geometry``, or None where
    its family's formula does not hold there (then Monte Carlo)."""
    entry = COMPUTE[name]
    if entry.closed_form is None:
        raise AnalysisError(f"metric {name!r}: its registry rule is {entry.metric.chance!r}, not 'closed'")
    got = entry.closed_form(geometry, query_free)
    return None if got is None else float(got)


def null_draws(name: str, geometry, query_free: bool, seed: int, batch: int):
    """``name``'s ``batch``-th batch of exact null draws for ``geometry`` (float64 tensor), or None
    where it has no such sampler there (``Plugin.null_draws``)."""
    fn = COMPUTE[name].null_draws
    return None if fn is None else fn(geometry, query_free, seed, batch)


def generation() -> int:
    """Changes whenever a plugin is registered or removed (keys the caches of chance levels)."""
    return _state["generation"]


def load_plugins(spec: str | None = None) -> list[str]:
    """Import the modules named in ``spec`` (default: ``$QKVSCOPE_PLUGINS``), comma-separated:
    module names on the Python path, or paths of ``.py`` files. Each module registers its
    metrics when imported; one already imported is not imported again. Returns the modules
    imported; a module that fails raises ``AnalysisError`` naming it."""
    spec = os.environ.get(PLUGINS_ENV, "") if spec is None else spec
    loaded = []
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            continue
        try:
            if entry.endswith(".py"):
                path = Path(entry).expanduser().resolve()
                name = f"qkvscope_plugin_{path.stem}"
                if name not in sys.modules:
                    spec_ = importlib.util.spec_from_file_location(name, path)
                    if spec_ is None or not path.is_file():
                        raise FileNotFoundError(f"no such file {path}")
                    module = importlib.util.module_from_spec(spec_)
                    sys.modules[name] = module
                    try:
                        spec_.loader.exec_module(module)
                    except BaseException:
                        del sys.modules[name]
                        raise
            else:
                importlib.import_module(entry)
        except Exception as exc:          # the plugin's own error, whatever it is, named with the plugin
            raise AnalysisError(f"{PLUGINS_ENV}: {entry}: {type(exc).__name__}: {exc}") from exc
        loaded.append(entry)
    return loaded


def load_entry_point_plugins() -> list[str]:
    """Load every entry point of the group ``qkvscope.metrics`` (``importlib.metadata``): each names
    a module (or an object in one), which registers its metrics when imported. Returns the entry
    points' names; one that fails raises ``AnalysisError`` naming it."""
    from importlib.metadata import entry_points  # here: read once, when the registry loads its plugins

    loaded = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            ep.load()
        except Exception as exc:          # the plugin's own error, whatever it is, named with the plugin
            raise AnalysisError(f"entry point {ENTRY_POINT_GROUP}: {ep.name} = {ep.value}: "
                                f"{type(exc).__name__}: {exc}") from exc
        loaded.append(ep.name)
    return loaded


def plugin_error() -> str | None:
    """Why a module named in ``$QKVSCOPE_PLUGINS`` or an entry point failed to load when this
    module was imported."""
    return _state["error"]


def check_plugins() -> None:
    """Raise the plugin loading error (``plugin_error``) as an ``AnalysisError``, if there was one."""
    if _state["error"]:
        raise AnalysisError(_state["error"])


# The built-in families register theirs first, then the plugins, when every name above exists
# (a family or plugin module imports this module while it loads).
import analysis.metrics  # noqa: E402,F401

try:
    load_entry_point_plugins()
    load_plugins()
except AnalysisError as _exc:
    _state["error"] = str(_exc)
