"""The Inspector's spectra, tie check and attention maps read the stored file in a child
process (``app.inspect_child`` through the sandbox, ``loaders.sandbox``), never in the server: a file
that turned into a bomb after it was stored is one line per section and the page goes on."""
from __future__ import annotations

import os
import resource
import shutil

import numpy as np
import pytest

from app import inspect_child
from app.jobs import analyze
from loaders.checkpoints import open_checkpoint
from loaders.ingest import ingest_checkpoint
from loaders.store import Store
from tests.app.apptest import page_test, shown
from tests.app.test_page_experiments import figures
from tests.app.test_page_inspector import tiny_gpt2
from tests.hostile.test_sandbox import _sparse_gpt2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_gpt2(tmp_path_factory.mktemp("m") / "gpt2-tiny")


def test_spectra_equal_the_float64_svd_of_the_heads_matrices(model_dir):
    rows = inspect_child.spectra(str(model_dir), layer=1, head=3)
    with open_checkpoint(model_dir) as ckpt:
        w = ckpt.layer(1)
    g = 3 // (4 // 4)
    for name, a in {"W_Q": w.W_Q[3], "W_K": w.W_K[g], "W_V": w.W_V[g], "W_O": w.W_O[3].mT}.items():
        want = np.linalg.svd(a.double().numpy(), compute_uv=False)          # float64 reference, [d_head]
        got = [s for p, _, s in rows if p == name]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * want[0])
        assert [i for p, i, _ in rows if p == name] == list(range(8))


def test_attention_maps_come_back_through_an_npy_file_exactly(model_dir, tmp_path):
    from experiments.attention_maps import capture_activations

    got = inspect_child.attention(str(model_dir), text="Hello there, world.", max_tokens=12, out=str(tmp_path))
    maps = inspect_child.read_maps(tmp_path, got)
    with open_checkpoint(model_dir) as ckpt:
        cap = capture_activations(ckpt, text="Hello there, world.", max_tokens=12)
    want = np.stack([lc.attn.numpy() for lc in cap.layers])                # [n_layers, n_heads, T, T]
    assert got["tokens"] == cap.tokens and maps.shape == (2, 4, 12, 12) and got["shape"] == [2, 4, 12, 12]
    np.testing.assert_array_equal(maps, want)
    with pytest.raises(FileExistsError):                                    # never writes through a planted file
        inspect_child.attention(str(model_dir), text="Hello", max_tokens=4, out=str(tmp_path))
    with pytest.raises(ValueError, match=r"attention maps of shape \(2, 4, 12, 12\) \(float32\) where the "
                                         r"reading process described \[2, 4, 12, 13\] for 12 tokens"):
        inspect_child.read_maps(tmp_path, {**got, "shape": [2, 4, 12, 13]})


def test_a_stored_checkpoint_turned_bomb_is_one_line_per_section(tmp_path, monkeypatch, model_dir):
    """Stored and analysed, then its folder replaced by an 11 GB sparse GPT-2 (its own sparse check
    off: only the child's limit is left). Before: spectra, ties and the forward pass read it in
    the server process (a layer read whole: 6 GB RSS). The ties are the ones stored with the
    analysis, so the tie check reads nothing and says nothing; spectra, maps and the cross-head
    section's kv head groupings fail in the child, each once."""
    folder = tmp_path / "gpt2"
    shutil.copytree(model_dir, folder)
    db = tmp_path / "db.duckdb"
    store = Store(db)
    store.migrate()
    cid = ingest_checkpoint(store, folder).checkpoint_id
    analyze(store, cid, opener=lambda p: open_checkpoint(p))                # stored, in this process
    shutil.rmtree(folder)
    bomb = _sparse_gpt2(folder)                                             # same path, 1 layer of d 15,360
    for name, value in {"QKVSCOPE_DB": str(db), "QKVSCOPE_ALLOW_SPARSE": "1",
                        "QKVSCOPE_PARSE_MEMORY_MB": "1024"}.items():
        monkeypatch.setenv(name, value)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    at = page_test("inspector", {"ckpt": str(cid), "layer": "0", "head": "0"}, timeout=240).run()
    assert not at.exception, at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 3, errors                         # spectra, attention maps, head groupings
    assert all("\n" not in e for e in errors), errors
    spectra, attention, groupings = errors
    need = "safetensors tensor 'h.0.attn.c_attn.weight' needs 2.83 GB, more memory than this process may use"
    assert spectra == f"{bomb}: {need}" and groupings == spectra, errors
    assert not [w for w in at.warning if w.value.startswith("The layout reads")]   # stored ties: qkv
    assert attention == (f"{folder}: reading it needed more than 1.0 GiB of memory (limit QKVSCOPE_PARSE_MEMORY_MB"
                         "=1,024 plus the file's size; set it in the environment to raise it)"), attention
    assert "insp_heatmap" in figures(at)                                    # the stored metrics still show
    assert "insp_spectra" not in figures(at) and "insp_attention" not in figures(at)
    grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10) - before
    assert grew < 512 << 20, grew


def test_the_readers_children_are_pooled_across_reruns(model_dir, tmp_path, monkeypatch):
    """A layer or head picked in the spectra controls reuses the pool's child (a fresh one costs
    2-3 s of imports); other budgets in the environment get another child."""
    from loaders.sandbox import POOL
    from tests.hostile.light_targets import call             # the pool's machinery, not what a child imports

    POOL.close()
    first = call("pid", model_dir, pooled=True)
    assert call("pid", model_dir, pooled=True) == first
    monkeypatch.setenv("QKVSCOPE_SIDE_ITEMS", "123")
    assert call("pid", model_dir, pooled=True) != first
    POOL.close()


@pytest.mark.parametrize("make, problem", [
    (lambda p: os.mkfifo(p), "is a FIFO, not a regular file"),
    (lambda p: p.symlink_to("/dev/zero"), "is a link to /dev/zero, a character device, not a regular file"),
], ids=["fifo", "dev_zero_link"])
def test_a_server_path_to_a_fifo_or_dev_zero_is_one_line_not_a_hang(tmp_path, monkeypatch, make, problem):
    """Issue 14: a FIFO named model.pt, or model.pt -> /dev/zero, given in the server path field
    hung the server for ever; now one line and nothing stored."""
    db = tmp_path / "p.duckdb"
    Store(db).migrate()
    monkeypatch.setenv("QKVSCOPE_DB", str(db))
    target = tmp_path / "model.pt"
    make(target)
    at = page_test("inspector", {"src": "path", "path": str(target)}, timeout=120).run()
    at.button[0].click().run()                                            # Open
    assert not at.exception, at.exception
    errors = [shown(e.value) for e in at.error]
    assert len(errors) == 1 and errors[0].startswith(str(target)) and problem in errors[0], errors
    assert "\n" not in errors[0] and Store(db).checkpoints() == []
