"""The metric registry: its rows' facts, and metrics registered as plugins run like the built-in ones.

Every plugin registered here is removed again by its fixture, so the registry other tests see is the
built-in one. The plugin seen through the CLI and the Inspector: tests/app/test_plugin_metric.py.
"""
from __future__ import annotations

import math
import sys
import textwrap
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from analysis import chance, directions, registry
from analysis.activations import ActivationAccumulator
from analysis.chance import attach_weight_chance, weight_chance
from analysis.errors import AnalysisError
from analysis.plugins import Absent
from analysis.registry import Metric
from analysis.weights import weight_metrics
from tests.analysis._threads import one_thread  # noqa: F401  (autouse: one torch thread)


def meta(h=4, g=2, d=32, e=8, norm="layernorm"):
    return SimpleNamespace(n_heads=h, n_kv_heads=g, d_model=d, d_head=e, norm=norm, variant="qkv")


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def layer(m, *, index=0, seed=0, query_free=False):
    h, g, d, e = m.n_heads, m.n_kv_heads, m.d_model, m.d_head
    return SimpleNamespace(layer=index, W_Q=None if query_free else rand(h, d, e, seed=seed),
                           W_K=rand(g, d, e, seed=seed + 1), W_V=rand(g, d, e, seed=seed + 2),
                           W_O=rand(h, e, d, seed=seed + 3), b_Q=None, b_K=None, b_V=None)


def row(name="toy", level="weights", axis="kv_head", direction="none", rule="monte_carlo", **kw):
    return Metric(name, level, axis, kw.pop("family", "toy"), kw.pop("help", "a toy"), direction, rule,
                  kw.pop("chance_help", "median of random layers"))


@pytest.fixture
def plugged():
    """``plugged(metric, compute, **kw)`` registers a plugin for one test and removes it after."""
    added = []

    def add(metric, compute, **kw):
        registry.register(metric, compute, **kw)
        added.append(metric.name)
        return metric
    yield add
    for name in added:
        registry.unregister(name)


# -- the built-in rows -----------------------------------------------------------------------
def test_every_row_declares_direction_and_chance_rule():
    for m in registry.METRICS:
        assert m.direction in registry.DIRECTIONS and m.chance in registry.CHANCE_RULES[m.level], m
        assert m.chance_help
    assert registry.BY_NAME["kv_cka"].direction == "max" and registry.BY_NAME["erank_k"].direction == "min"
    assert {m.name for m in registry.METRICS if m.chance == "none"} == {"norm_q", "norm_k", "norm_v", "norm_o"}
    assert registry.names(family="norms") == ["norm_q", "norm_k", "norm_v", "norm_o"]
    assert registry.names("activations", "spectra") == ["erank_kcache", "erank_vcache", "erank_kcache_layer",
                                                         "erank_vcache_layer"]
    assert registry.PLUGINS == {}


def test_chance_follows_each_rows_rule():
    """A square layer: every 'closed' row reads 'closed form', 'none' rows NaN, the rest Monte Carlo."""
    t = weight_chance(meta(h=4, g=4, d=32, e=8), query_free=False, device="cpu")
    for metric, whole, value, how, *_band in t.itertuples(index=False):
        rule = registry.BY_NAME[metric].chance
        expect = {"closed": "closed form", "none": "none"}.get(rule, "median of")
        assert how.startswith(expect), (metric, rule, how)
        assert math.isnan(value) == (rule == "none"), metric
    # non-square stacked W_Q: wq_condition's closed form does not hold, so Monte Carlo
    t = weight_chance(meta(h=4, g=4, d=32, e=4), query_free=False, device="cpu").set_index(["metric", "whole"])
    assert t.loc[("wq_condition", True), "how"].startswith("median of ")
    assert t.loc[("kv_share_r2", False), "chance"] == 4 / 32


def test_weight_chance_texts_are_the_rows_chance_help():
    assert dict(chance.WEIGHT_CHANCE) == {m.name: m.chance_help for m in registry.METRICS
                                          if m.level == "weights"}
    with pytest.raises(KeyError):
        chance.WEIGHT_CHANCE["kv_cka_act"]


def test_direction_picks_the_most_redundant_value():
    overrides = {m.name: m.direction for m in registry.METRICS}
    assert directions.best([0.2, 0.9, 0.5], "kv_cka", overrides) == 0.9
    assert directions.best([3.0, 1.5, 7.0], "erank_k", overrides) == 1.5


# -- the rows are checked ----------------------------------------------------------------------
@pytest.mark.parametrize("kw, message", [
    (dict(level="weight"), "metric 'toy': level must be one of weights, activations, found 'weight'"),
    (dict(axis="heads"), "metric 'toy': axis must be one of head, kv_head, layer, head+layer, head_pair, kv_head_pair, layer_pair, found 'heads'"),
    (dict(direction="higher"), "metric 'toy': direction must be one of max, min, none, found 'higher'"),
    (dict(rule="random_projection"),
     "metric 'toy': chance must be one of closed, monte_carlo, none, found 'random_projection'"),
    (dict(level="activations", rule="closed"),
     "metric 'toy': chance must be one of random_projection, none, found 'closed'"),
    (dict(name="toy metric"), "metric 'toy metric': needs a name that is an identifier, a help text and a "
                              "chance_help text"),
    (dict(chance_help=""), "metric 'toy': needs a name that is an identifier, a help text and a chance_help "
                           "text"),
])
def test_a_bad_row_is_refused_with_its_reason(kw, message):
    with pytest.raises(AnalysisError) as exc:
        row(**kw)
    assert str(exc.value) == message


def test_register_refusals():
    with pytest.raises(AnalysisError) as exc:
        registry.register(row(name="kv_cka"), lambda *a: None)
    assert str(exc.value) == "metric 'kv_cka': already registered (family kv_similarity)"
    with pytest.raises(AnalysisError) as exc:
        registry.register(row(rule="closed"), lambda *a: None)
    assert str(exc.value) == ("metric 'toy': the chance rule 'closed' needs closed_form= (and only it takes "
                              "one); found rule 'closed' without closed_form")
    with pytest.raises(AnalysisError) as exc:
        registry.register(row(), lambda *a: None, closed_form=lambda geo, qf: 0.0)
    assert str(exc.value).endswith("found rule 'monte_carlo' with closed_form")
    with pytest.raises(AnalysisError) as exc:
        registry.register(row(level="activations", axis="head+layer", rule="none"), lambda *a: None)
    assert str(exc.value).startswith("metric 'toy': an activation plugin has axis head, kv_head or layer")
    with pytest.raises(AnalysisError) as exc:
        registry.unregister("kv_cka")
    assert str(exc.value) == "metric 'kv_cka': not a registered plugin"
    assert "toy" not in registry.BY_NAME and registry.PLUGINS == {}


# -- weight plugins --------------------------------------------------------------------------
def test_weight_plugin_rows_values_and_monte_carlo_chance(plugged):
    """mean |W_V[g]| per kv head (docs/contributing.md's example): float64 reference; chance E|N(0, 1/d)|."""
    before = registry.generation()
    m = meta(h=4, g=4, d=32, e=8)
    warm = weight_chance(m, query_free=False, device="cpu")        # cached before the plugin exists
    assert "toy" not in set(warm["metric"])
    plugged(row("toy", axis="kv_head"), lambda lay, meta_, dev: lay.W_V.abs().mean(dim=(1, 2)))
    assert registry.generation() == before + 1 and registry.names("weights")[-1] == "toy"
    lay = layer(m, index=3)
    frame, notes = weight_metrics(lay, m, device="cpu")
    toy = frame[frame["metric"] == "toy"]
    assert toy["head_label"].tolist() == ["L3KV0", "L3KV1", "L3KV2", "L3KV3"] and toy["head"].tolist() == [0, 1, 2, 3]
    ref = lay.W_V.double().abs().mean(dim=(1, 2)).tolist()
    assert toy["value"].tolist() == pytest.approx(ref, rel=1e-6)
    assert "toy" not in notes
    rows = attach_weight_chance(frame, m, query_free=False, device="cpu")
    ch = rows.loc[rows["metric"] == "toy", "chance"]
    # 8 draws x 4 kv heads of 256 entries each: the median of the means of |N(0, 1/32)| scatters by ~1%
    assert ch.nunique() == 1 and ch.iloc[0] == pytest.approx(math.sqrt(2 / (math.pi * 32)), rel=0.03)
    assert chance.WEIGHT_CHANCE["toy"] == "median of random layers"


@pytest.mark.parametrize("axis, got, rows", [
    ("head", lambda lay, m, dev: torch.arange(4.0), [(0, "L0H0", 0.0), (3, "L0H3", 3.0)]),
    ("layer", lambda lay, m, dev: 2.5, [(None, "L0", 2.5)]),
    ("head+layer", lambda lay, m, dev: ([1.0, 2.0, 3.0, 4.0], torch.tensor(10.0)),
     [(0, "L0H0", 1.0), (3, "L0H3", 4.0), (None, "L0", 10.0)]),
])
def test_weight_plugin_axes(plugged, axis, got, rows):
    plugged(row("toy", axis=axis, rule="none", chance_help="none: a toy"), got)
    frame, _ = weight_metrics(layer(meta()), meta(), device="cpu")
    toy = frame[frame["metric"] == "toy"]
    assert len(toy) == {"head": 4, "layer": 1, "head+layer": 5}[axis]
    for head, label, value in rows:
        hit = toy[toy["head_label"] == label]
        assert len(hit) == 1 and hit["value"].iloc[0] == value
        assert (pd.isna(hit["head"].iloc[0]) if head is None else hit["head"].iloc[0] == head)


def test_weight_plugin_head_pairs_are_rows_with_head2_and_layer_pairs_are_not_per_layer(plugged):
    """A head_pair compute returns the layer's [n, n] matrix: rows (layer, head, head2); a kv_head_pair
    one [g, g]; a layer_pair metric is not computed layer by layer (the model-level pass does)."""
    m = meta(h=4, g=2)
    plugged(row("toy_pairs", axis="head_pair", rule="none", chance_help="none: a toy"),
            lambda lay, meta_, dev: torch.arange(16.0).reshape(4, 4))
    plugged(row("toy_kv_pairs", axis="kv_head_pair", rule="none", chance_help="none: a toy"),
            lambda lay, meta_, dev: torch.eye(2))
    plugged(row("toy_layers", axis="layer_pair", rule="none", chance_help="none: a toy"),
            lambda lay, meta_, dev: pytest.fail("a layer_pair metric ran per layer"))
    frame, _ = weight_metrics(layer(m, index=2), m, device="cpu")
    toy = frame[frame["metric"] == "toy_pairs"]
    assert len(toy) == 12 and toy["layer2"].isna().all() and (toy["head"] != toy["head2"]).all()  # no diagonal
    hit = toy[toy["head_label"] == "L2H1-H3"]
    assert (hit["head"].iloc[0], hit["head2"].iloc[0], hit["value"].iloc[0]) == (1, 3, 7.0)
    kv = frame[frame["metric"] == "toy_kv_pairs"]
    assert kv["head_label"].tolist() == ["L2KV0-KV1", "L2KV1-KV0"] and kv["value"].tolist() == [0.0, 0.0]
    assert "toy_layers" not in set(frame["metric"])
    pairs = {x.name for x in registry.METRICS if x.axis in registry.PAIR_AXES}
    assert frame.loc[~frame["metric"].isin(pairs), "head2"].isna().all()          # only pair rows have a head2
    rows = attach_weight_chance(frame, m, query_free=False, device="cpu")
    assert rows.loc[rows["metric"] == "toy_pairs", "head2"].tolist() == [1, 2, 3, 0, 2, 3, 0, 1, 3, 0, 1, 2]


def test_weight_plugin_closed_form_and_absent_and_wrong_count(plugged):
    m = meta(h=4, g=4, d=32, e=8)
    plugged(row("toy_closed", axis="layer", rule="closed", chance_help="d_head / d_model (closed form)"),
            lambda lay, meta_, dev: 0.5, closed_form=lambda geo, query_free: geo.d_head / geo.d_model)
    plugged(row("toy_absent"), lambda lay, meta_, dev: (_ for _ in ()).throw(Absent("no toy here: MHA")))
    plugged(row("toy_none", axis="head+layer", rule="none", chance_help="none: a toy"),
            lambda lay, meta_, dev: (torch.ones(4), 1.0))
    frame, notes = weight_metrics(layer(m), m, device="cpu")
    assert notes["toy_absent"] == "no toy here: MHA" and "toy_absent" not in set(frame["metric"])
    t = weight_chance(m, query_free=False, device="cpu").set_index(["metric", "whole"])
    assert t.loc[("toy_closed", True), "chance"] == 0.25 and t.loc[("toy_closed", True), "how"].startswith("closed form")
    for whole in (False, True):
        assert math.isnan(t.loc[("toy_none", whole), "chance"]) and t.loc[("toy_none", whole), "how"] == "none"
    plugged(row("toy_bad"), lambda lay, meta_, dev: [1.0, 2.0, 3.0])
    with pytest.raises(AnalysisError) as exc:
        weight_metrics(layer(m), m, device="cpu")
    assert str(exc.value) == "metric 'toy_bad': compute returned 3 values, expected 4 (one per kv head)"


def test_weight_plugin_sees_float32_tensors_on_the_device_and_none_for_identity_queries(plugged):
    seen = {}

    def look(lay, meta_, dev):
        seen.update(q=lay.W_Q, k=lay.W_K, o=lay.W_O, dev=dev, bias=lay.b_V)
        return 0.0
    plugged(row("toy", axis="layer", rule="none", chance_help="none: a toy"), look)
    m = meta(h=4, g=4, d=32, e=8)
    src = layer(m, query_free=True)
    src.W_K = src.W_K.double()
    weight_metrics(src, m, device="cpu")
    assert seen["q"] is None and seen["bias"] is None and seen["dev"] == torch.device("cpu")
    assert seen["k"].dtype == torch.float32 and seen["k"].shape == (4, 32, 8) and seen["o"].shape == (4, 8, 32)
    assert src.W_K.dtype == torch.float64                     # the caller's tensors are not changed


# -- activation plugins ----------------------------------------------------------------------
def test_activation_plugin_from_the_sums_with_chance_and_interval(plugged):
    """Mean square of the K cache per kv head, tr(K^T K) / (n d_head): against the caches themselves."""
    plugged(row("toy_k2_act", level="activations", axis="kv_head", rule="random_projection",
                chance_help="random projections"),
            lambda st, e: torch.diagonal(st["kk"], dim1=-2, dim2=-1).sum(-1) / (st["n"][..., None] * e))
    plugged(row("toy_n_act", level="activations", axis="layer", rule="none", chance_help="none: a count"),
            lambda st, e: st["n"])
    m = meta(h=4, g=2, d=16, e=4)
    lay = layer(m)
    acc = ActivationAccumulator(lay, m, logits=True, device="cpu")
    x = rand(3, 10, 16, seed=9)
    acc.add(x)
    df, _ = acc.result()
    toy = df[df["metric"] == "toy_k2_act"]
    k = torch.einsum("btd,gde->gbte", x.double(), lay.W_K.double()).reshape(2, 30, 4)     # [g, n, e]
    assert toy["head_label"].tolist() == ["L0KV0", "L0KV1"]
    assert toy["value"].tolist() == pytest.approx(k.square().mean((1, 2)).tolist(), rel=1e-5)
    # chance: the same sums of x through random N(0, 1/d) columns r, E (x r)^2 = mean_t ||x_t||^2 / d
    # (3 draws x 2 kv heads of 4 columns: the median scatters by ~11%)
    assert toy["chance"].nunique() == 1
    assert toy["chance"].iloc[0] == pytest.approx(float(x.double().square().sum(-1).mean()) / 16, rel=0.35)
    assert (toy["ci_low"] <= toy["value"]).all()
    assert (toy["value"] <= toy["ci_high"]).all() and (toy["n_tokens"] == 30).all()
    count = df[df["metric"] == "toy_n_act"]
    assert len(count) == 1 and count["head_label"].iloc[0] == "L0" and count["value"].iloc[0] == 30
    assert math.isnan(count["chance"].iloc[0])


# -- loading plugins -------------------------------------------------------------------------
def test_load_plugins_by_file_and_by_module_name(tmp_path, monkeypatch):
    src = textwrap.dedent('''
        from analysis.registry import Metric, register

        @register(Metric("{name}", "weights", "layer", "toy", "a toy", "none", "none", "none: a toy"))
        def toy(layer, meta, device):
            return 1.0
    ''')
    (tmp_path / "toy_by_file.py").write_text(src.format(name="toy_by_file"))
    (tmp_path / "toy_by_name.py").write_text(src.format(name="toy_by_name"))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert registry.load_plugins(f"{tmp_path / 'toy_by_file.py'}, toy_by_name,") == [
            str(tmp_path / "toy_by_file.py"), "toy_by_name"]
        assert {"toy_by_file", "toy_by_name"} <= set(registry.names("weights"))
        registry.load_plugins(f"{tmp_path / 'toy_by_file.py'},toy_by_name")   # loaded once: no second row
    finally:
        for name in ("toy_by_file", "toy_by_name"):
            if name in registry.PLUGINS:
                registry.unregister(name)
        sys.modules.pop("toy_by_name", None)
        sys.modules.pop("qkvscope_plugin_toy_by_file", None)


def _installed_plugin(root, entry: str) -> None:
    """A distribution on the path of ``root`` whose entry point of ``qkvscope.metrics`` is ``entry``
    (the files ``pip install`` writes: a ``.dist-info`` folder with ``METADATA`` and ``entry_points.txt``)."""
    info = root / "toy_metrics_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-metrics-pkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[qkvscope.metrics]\n{entry}\n")


def test_an_installed_package_registers_a_metric_through_its_entry_point(tmp_path, monkeypatch):
    (tmp_path / "toy_by_entry_point.py").write_text(textwrap.dedent('''
        from analysis.registry import Metric, register

        @register(Metric("toy_by_entry_point", "weights", "layer", "toy", "a toy", "none", "none", "none: a toy"))
        def toy(layer, meta, device):
            return 1.0
    '''))
    _installed_plugin(tmp_path, "toy = toy_by_entry_point")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert "toy" in registry.load_entry_point_plugins()
        assert "toy_by_entry_point" in registry.names("weights")
    finally:
        if "toy_by_entry_point" in registry.PLUGINS:
            registry.unregister("toy_by_entry_point")
        sys.modules.pop("toy_by_entry_point", None)


def test_an_entry_point_that_fails_to_load_is_one_line(tmp_path, monkeypatch):
    _installed_plugin(tmp_path, "broken = no_such_metrics_module")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AnalysisError) as exc:
        registry.load_entry_point_plugins()
    assert str(exc.value) == ("entry point qkvscope.metrics: broken = no_such_metrics_module: "
                              "ModuleNotFoundError: No module named 'no_such_metrics_module'")


def test_a_plugin_that_fails_to_load_is_one_line(tmp_path, monkeypatch):
    with pytest.raises(AnalysisError) as exc:
        registry.load_plugins("no_such_plugin_module")
    assert str(exc.value) == ("QKVSCOPE_PLUGINS: no_such_plugin_module: ModuleNotFoundError: "
                              "No module named 'no_such_plugin_module'")
    with pytest.raises(AnalysisError) as exc:
        registry.load_plugins(str(tmp_path / "missing.py"))
    assert str(exc.value) == (f"QKVSCOPE_PLUGINS: {tmp_path / 'missing.py'}: FileNotFoundError: "
                              f"no such file {tmp_path / 'missing.py'}")
    # at import time the error is kept and raised where metrics are computed
    monkeypatch.setitem(registry._state, "error", "QKVSCOPE_PLUGINS: x: ModuleNotFoundError: No module named 'x'")
    with pytest.raises(AnalysisError) as exc:
        weight_metrics(layer(meta()), meta(), device="cpu")
    assert str(exc.value) == "QKVSCOPE_PLUGINS: x: ModuleNotFoundError: No module named 'x'"


def test_the_stores_norm_list_is_the_registry_norms_family():
    """``loaders.wd.NORM_METRICS`` is the registry's norms family, read from the declarations."""
    from loaders.wd import NORM_METRICS

    assert list(NORM_METRICS) == registry.names(family="norms")
