"""Chance levels kept on disk (``loaders/chance_cache.py``): read back exactly as drawn, keyed by
the code and the registered metrics, a damaged entry drawn again, an unwritable folder harmless."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pandas as pd
import pytest

from analysis import chance, registry
from loaders import chance_cache
from loaders.chance_cache import DiskStore

CODE_DIGEST = chance_cache.code_digest


def meta():
    return SimpleNamespace(n_heads=4, n_kv_heads=2, d_model=64, d_head=16, norm="rmsnorm")


#: Rows of the form ``_chance_rows`` gives, for the tests of the store itself (drawing costs seconds).
FAKE = (("kv_cosine_flat", False, 0.0, "closed form", -0.1, 0.1, (-0.2, 0.0, 0.3)),
        ("norm_k", True, math.nan, "none", math.nan, math.nan, ()))


@pytest.fixture
def fake(monkeypatch):
    """``_draw_rows`` counted and answered with ``FAKE``."""
    calls = []
    monkeypatch.setattr(chance, "_draw_rows", lambda *a: calls.append(a) or FAKE)
    return calls


@pytest.fixture
def store(tmp_path):
    s = DiskStore(tmp_path / "chance")
    chance.use_store(s)
    yield s
    chance.use_store(None)


def _draw():
    return chance.weight_chance(meta(), query_free=False, device="cpu", seed=3)


def test_rows_read_back_are_the_rows_drawn_to_the_bit(store, monkeypatch):
    drawn = _draw()
    assert len(list(store.root.glob("*.json"))) == 1
    chance.use_store(store)                                  # a new process's memo: empty
    monkeypatch.setattr(chance, "_draw_rows", lambda *a: pytest.fail("drawn again"))
    again = _draw()
    pd.testing.assert_frame_equal(again, drawn, check_exact=True)
    assert any(math.isnan(v) for v in drawn["chance"])      # NaN (rule none) survives the file
    assert all(isinstance(n, tuple) for n in again["null"])


def test_a_damaged_or_foreign_entry_is_drawn_again_and_rewritten(store, fake):
    drawn = _draw()
    (entry,) = store.root.glob("*.json")
    for damage in ["{not json", json.dumps({"key": ["other"], "rows": []}),
                   json.dumps({"key": json.loads(entry.read_text())["key"], "rows": [["x", True]]})]:
        entry.write_text(damage)
        chance.use_store(store)
        pd.testing.assert_frame_equal(_draw(), drawn, check_exact=True)
        assert json.loads(entry.read_text())["rows"][0][0] == drawn["metric"][0]
    assert len(fake) == 4                                    # the first draw and one per damage


def test_changed_code_or_a_plugin_switched_on_is_another_entry(store, fake, tmp_path, monkeypatch):
    _draw()
    monkeypatch.setattr(chance_cache, "code_digest", lambda: "other code")
    chance.use_store(DiskStore(store.root))
    _draw()
    assert len(list(store.root.glob("*.json"))) == 2
    monkeypatch.setattr(chance_cache, "code_digest", CODE_DIGEST)
    plugin = tmp_path / "chance_cache_toy.py"
    plugin.write_text(
        "from analysis import registry\n"
        "registry.register(registry.Metric('toy_cc', 'weights', 'kv_head', 'toy', 'a toy', 'none', 'monte_carlo',\n"
        "                                  'median of random layers', reads=('V',)),\n"
        "                  lambda lay, meta, dev: lay.W_V.abs().mean(dim=(1, 2)))\n")
    base = chance_cache.code_digest()
    try:
        registry.load_plugins(str(plugin))
        with_plugin = chance_cache.code_digest()
        assert with_plugin != base
        plugin.write_text(plugin.read_text() + "# changed\n")
        assert chance_cache.code_digest() != with_plugin                 # the plugin's file is read
        chance.use_store(DiskStore(store.root))
        _draw()
        assert len(list(store.root.glob("*.json"))) == 3 and len(fake) == 3
        keys = [json.loads(f.read_text())["key"] for f in store.root.glob("*.json")]
        assert sum("toy_cc" in k[-1] for k in keys) == 1          # the registered metrics are in the key
    finally:
        registry.unregister("toy_cc")


def test_an_unwritable_folder_leaves_the_analysis_as_it_was(tmp_path, fake):
    blocker = tmp_path / "file"
    blocker.write_text("")
    s = DiskStore(blocker / "chance")                      # a folder under a file: cannot exist
    chance.use_store(s)
    try:
        assert _draw()["metric"].tolist() == ["kv_cosine_flat", "norm_k"] and len(fake) == 1
    finally:
        chance.use_store(None)


def test_the_folder_setting(monkeypatch, tmp_path):
    monkeypatch.setenv("QKVSCOPE_CHANCE_CACHE", str(tmp_path))
    assert chance_cache.folder() == tmp_path
    monkeypatch.setenv("QKVSCOPE_CHANCE_CACHE", "")
    assert chance_cache.folder() is None
    monkeypatch.delenv("QKVSCOPE_CHANCE_CACHE")
    assert chance_cache.folder().parts[-2:] == ("qkvscope", "chance")
