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
  also have a whole-layer row (``head`` None) for grouped-query models.
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

**Adding a metric** without editing qkvscope (docs/contributing.md, "Adding a metric"):
``register(Metric(...), compute)`` (or ``@register(Metric(...))`` on the
function) appends the row here; ``weight_metrics`` then runs ``compute`` on
every layer (``analysis.plugins``), ``analysis.chance`` gives its chance level
by the row's rule, and the CLI, the store and the pages list it like the
built-in metrics. ``QKVSCOPE_PLUGINS`` names the modules that register
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
Version 5: every row carries ``chance_low``/``chance_high`` (the null band), ``above_chance``
(a Benjamini-Hochberg test against the null draws) and ``degenerate`` (a value fixed by a tie,
by rank deficiency or by too few tokens); the chance levels' draws grow until their median is
stable; a singular stacked W_Q reads ``wq_condition`` inf.
Version 3: every row carries ``chance`` (and activation rows ``n_tokens``,
``ci_low``, ``ci_high``); spectra in float64; activation metrics on a corpus
sample; ``qk_directionality`` as its authors compute it.
Version 2: ``wq_basis_orth_defect`` is ``log(mean sigma^2 / geometric mean sigma^2)``
(was ``sqrt(mean (sigma_i^2 / mean sigma^2 - 1)^2)``); per-layer K and V spectra.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from analysis.errors import AnalysisError

METRIC_VERSION = 6

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
RESULT_COLUMNS = COLUMNS + ["chance", "n_tokens", "ci_low", "ci_high", "chance_low", "chance_high",
                            "above_chance", "degenerate"]

LEVELS = ("weights", "activations")
AXES = ("head", "kv_head", "layer", "head+layer")
#: ``direction``: a higher (``max``) or lower (``min``) value is more redundant, or ``none``.
DIRECTIONS = ("max", "min", "none")
#: ``chance`` rules each level knows (module docstring).
CHANCE_RULES = {"weights": ("closed", "monte_carlo", "none"), "activations": ("random_projection", "none")}
#: The environment variable naming the modules that register metrics.
PLUGINS_ENV = "QKVSCOPE_PLUGINS"
#: The entry-point group whose entries installed packages register metrics through.
ENTRY_POINT_GROUP = "qkvscope.metrics"


@dataclass(frozen=True)
class Metric:
    """One registered metric (module docstring); the fields are checked when the row is built."""

    name: str
    level: str
    axis: str
    family: str
    help: str
    direction: str
    chance: str
    chance_help: str

    def __post_init__(self):
        for field, allowed in (("level", LEVELS), ("axis", AXES), ("direction", DIRECTIONS),
                               ("chance", CHANCE_RULES.get(self.level, ()))):
            if getattr(self, field) not in allowed:
                raise AnalysisError(f"metric {self.name!r}: {field} must be one of {', '.join(allowed)}, "
                                    f"found {getattr(self, field)!r}")
        if not self.name.isidentifier() or not self.help or not self.chance_help:
            raise AnalysisError(f"metric {self.name!r}: needs a name that is an identifier, a help text and "
                                "a chance_help text")


@dataclass(frozen=True)
class Plugin:
    """A metric registered from outside the built-in families, and the functions behind it.

    ``compute``: weights, ``compute(layer, meta, device)`` with the layer's
    canonical float32 tensors on ``device`` (``analysis.plugins.PluginLayer``)
    and its geometry, returning ``n_heads`` values (axis ``head``),
    ``n_kv_heads`` values (``kv_head``), one number (``layer``) or the pair
    ``(per_head, whole)`` (``head+layer``); raise ``analysis.plugins.Absent(reason)``
    where the metric does not exist for the layer. Activations,
    ``compute(stats, d_head)`` on the accumulated float64 sums of
    ``analysis.activations`` with any leading batch dimensions, returning
    ``[..., n_kv_heads]``, ``[..., n_heads]`` or ``[...]`` (axis ``layer``).
    ``closed_form(geometry, query_free) -> float | None`` (rule ``closed``
    only): the chance level from the shapes, None where it has none (then
    Monte Carlo).
    """

    metric: Metric
    compute: Callable
    closed_form: Callable | None = None


_MC = "median of random Gaussian layers of the same shapes (over draws and heads)"
_RANDOM_PROJECTION = ("the same metric of the same captured layer input projected through random Gaussian "
                      "matrices of the head's shapes (median over draws and heads): it keeps the input's "
                      "anisotropy and the token count")
_SPECTRAL = {
    "q": ("head", "W_Q[h] (d_model x d_head)"),
    "k": ("kv_head", "W_K[g] (d_model x d_head; head empty: the layer's stacked W_K, "
                     "d_model x n_kv_heads*d_head, grouped-query models only)"),
    "v": ("kv_head", "W_V[g] (d_model x d_head; head empty: the layer's stacked W_V, "
                     "d_model x n_kv_heads*d_head, grouped-query models only)"),
    "o": ("head", "W_O[h] (d_head x d_model)"),
    "qk": ("head", "M_h = W_Q[h] W_K[g(h)]^T"),
}


def _spectral() -> list[Metric]:
    """The spectra family: four statistics of five matrices, fewer directions = more redundant."""
    out = []
    for p, (axis, what) in _SPECTRAL.items():
        out += [Metric(name, "weights", axis, "spectra", text, "min", "monte_carlo", _MC) for name, text in (
            (f"erank_{p}", f"effective rank (Roy & Vetterli 2007) of {what}: exp of the entropy of "
                           "sigma_i / sum sigma"),
            (f"stable_rank_{p}", f"stable rank ||A||_F^2 / ||A||_2^2 of {what}"),
            (f"energy_rank90_{p}", f"fewest singular values of {what} holding 90% of sum sigma_i^2"),
            (f"energy_rank99_{p}", f"fewest singular values of {what} holding 99% of sum sigma_i^2"))]
    return out


METRICS: list[Metric] = [
    Metric("kv_cosine_flat", "weights", "kv_head", "kv_similarity",
           "cosine of the flattened W_K and W_V (what papers quote; NOT invariant to a rotation of the head basis)",
           "max", "closed", "0: independent K and V have a flat cosine symmetric about 0 (closed form)"),
    Metric("kv_cka", "weights", "kv_head", "kv_similarity",
           "linear CKA of W_K and W_V: ||K^T V||_F^2 / (||K^T K||_F ||V^T V||_F); rotation-invariant",
           "max", "monte_carlo", f"{_MC}; about d_head / (d_model + d_head + 1)"),
    Metric("kv_share_r2", "weights", "kv_head", "kv_similarity",
           "K=V sharing fit: 1 - min_T ||V - K T||^2 / ||V||^2 (V regressed on K)",
           "max", "closed", "d_head / d_model: the exact mean of R^2 for V independent of K, "
                            "Beta(e^2/2, e(d-e)/2) (closed form)"),
    Metric("qk_symmetry", "weights", "head+layer", "qk_geometry",
           "symmetry score of M = W_Q W_K^T: ||sym(M)||^2/||M||^2; 1 symmetric, (1 + 1/d_model)/2 random, 0 antisymmetric "
           "(per head; head empty: M summed over heads; Saponati et al. 2025)",
           "max", "closed", "(1 + 1/d_model)/2, not 1/2 (tr(M^2) is even in Q): E tr(M^2) / E ||M||_F^2 = "
                            "1/d_model for random Q, K; query-free (identity Q) the exact mean (closed form)"),
    Metric("qk_directionality", "weights", "layer", "qk_geometry",
           "directionality of the layer's M as Saponati et al. 2025 compute it: (e_c - e_r)/(e_c + e_r), e the "
           "summed excess of the outlier column/row norms over mean + 2 std; >0 key-side dominance",
           "none", "closed", "0: transposing M swaps row and column outliers, and random Q, K are exchangeable "
                             f"(closed form); query-free grouped-query layers: {_MC}"),
    *_spectral(),
    *[Metric(f"norm_{p}", "weights", "layer", "norms",
             f"Frobenius norm of the layer's {w} (all heads); plotted against weight decay",
             "none", "none", "none: a norm measures the scale itself, which random matrices of any scale match")
      for p, w in (("q", "W_Q"), ("k", "W_K"), ("v", "W_V"), ("o", "W_O"))],
    Metric("wq_condition", "weights", "layer", "query_absorb",
           "condition number sigma_max/sigma_min of the stacked W_Q (d_model x n_heads*d_head)",
           "min", "closed", "square stacked W_Q: the median condition number of a d_model x d_model Gaussian "
                            "matrix, about 3.67 d_model (Edelman 1988, Tracy-Widom edge; closed form); "
                            f"non-square: {_MC}"),
    Metric("wq_basis_orth_defect", "weights", "layer", "query_absorb",
           "normalised models: how far the stacked W_Q (the change of basis a query-free model needs) is from "
           "a scaled orthogonal matrix, log(arithmetic / geometric mean of sigma_i^2) = "
           "log(||A||_F^2/n) - (2/n) log|det A|; 0 = absorbable through the norm, inf = singular",
           "min", "closed", "psi(d^2/2) - ln d - (1/d) sum_k psi(k/2), d = d_model: the exact mean "
                            "defect of a square Gaussian W_Q, about 1 (closed form)"),
    Metric("wq_absorb_error", "weights", "layer", "query_absorb",
           "models without normalisation: max |logit error| / max |logit| after converting to identity queries",
           "min", "monte_carlo", f"{_MC}: the conversion's float32 round-off on random W_Q and W_K"),
    Metric("kv_cka_act", "activations", "kv_head", "kv_similarity",
           "linear CKA of the K and V caches over sample tokens (tokens centred; Kornblith et al. 2019)",
           "max", "random_projection", _RANDOM_PROJECTION),
    Metric("kv_cosine_act", "activations", "kv_head", "kv_similarity",
           "cosine of the flattened K and V caches on sample tokens",
           "max", "random_projection", _RANDOM_PROJECTION),
    Metric("kv_share_r2_act", "activations", "kv_head", "kv_similarity",
           "K=V sharing fit on the caches: 1 - min_T ||V - K T||^2 / ||V||^2 over sample tokens",
           "max", "random_projection", _RANDOM_PROJECTION),
    Metric("logit_symmetry", "activations", "head+layer", "qk_geometry",
           "symmetry score of the pre-softmax logit matrix on sample tokens, before the causal mask "
           "(head empty: logits summed over heads)",
           "max", "random_projection", _RANDOM_PROJECTION),
    Metric("erank_kcache", "activations", "kv_head", "spectra",
           "effective rank of the K cache (tokens x d_head) on sample tokens",
           "min", "random_projection", _RANDOM_PROJECTION),
    Metric("erank_vcache", "activations", "kv_head", "spectra",
           "effective rank of the V cache (tokens x d_head) on sample tokens",
           "min", "random_projection", _RANDOM_PROJECTION),
]

BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}
#: Registered plugins by metric name, in registration order (``register``).
PLUGINS: dict[str, Plugin] = {}
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


def describe() -> pd.DataFrame:
    """The registry as a table (name, level, axis, family, help) for pages and docs."""
    return pd.DataFrame([m.__dict__ for m in METRICS], columns=["name", "level", "axis", "family", "help"])


def register(metric: Metric, compute: Callable | None = None, *, closed_form: Callable | None = None):
    """Add ``metric``'s row and its ``compute`` function (``Plugin`` gives both signatures).

    Returns ``compute``; without it, a decorator that registers the function it
    decorates: ``@register(Metric(...))``. ``closed_form`` goes with the rule
    ``closed`` and only with it. A name already registered is refused.
    """
    if compute is None:
        return lambda fn: register(metric, fn, closed_form=closed_form)
    if not isinstance(metric, Metric):
        raise AnalysisError(f"register: expected an analysis.registry.Metric, found {type(metric).__name__}")
    if metric.name in BY_NAME:
        raise AnalysisError(f"metric {metric.name!r}: already registered (family {BY_NAME[metric.name].family})")
    if not callable(compute):
        raise AnalysisError(f"metric {metric.name!r}: compute must be a function, found {type(compute).__name__}")
    if (metric.chance == "closed") != (closed_form is not None):
        raise AnalysisError(f"metric {metric.name!r}: the chance rule 'closed' needs closed_form= "
                            f"(and only it takes one); found rule {metric.chance!r}"
                            + (" with" if closed_form is not None else " without") + " closed_form")
    if metric.level == "activations" and metric.axis == "head+layer":
        raise AnalysisError(f"metric {metric.name!r}: an activation plugin has axis head, kv_head or layer "
                            "(register the per-layer value as a metric of its own)")
    METRICS.append(metric)
    BY_NAME[metric.name] = metric
    PLUGINS[metric.name] = Plugin(metric, compute, closed_form)
    _state["generation"] += 1
    return compute


def unregister(name: str) -> None:
    """Remove a plugin's row (tests; a built-in metric cannot be removed)."""
    if name not in PLUGINS:
        raise AnalysisError(f"metric {name!r}: not a registered plugin")
    del PLUGINS[name]
    METRICS.remove(BY_NAME.pop(name))
    _state["generation"] += 1


def plugins(level: str) -> list[Plugin]:
    """The plugins of ``level``, in registration order."""
    return [p for p in PLUGINS.values() if p.metric.level == level]


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


# Plugins load last, when every name above exists (a plugin imports this module while it loads).
try:
    load_entry_point_plugins()
    load_plugins()
except AnalysisError as _exc:
    _state["error"] = str(_exc)
