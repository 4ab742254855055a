"""analyze computes a stored file's metrics in a child process under the memory and time budgets."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from app import jobs
from loaders.errors import FileError
from loaders.ingest import ingest_checkpoint
from loaders.store import Store


@pytest.fixture
def stored(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    folder = tmp_path / "gpt2-tiny"
    GPT2LMHeadModel(GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=2, n_head=4)).save_pretrained(folder)
    store = Store(tmp_path / "db.duckdb")
    store.migrate()
    return store, ingest_checkpoint(store, folder).checkpoint_id


def test_the_child_answers_what_the_process_itself_computes(stored):
    store, cid = stored
    (child,) = jobs.analyze(store, cid)
    from loaders.checkpoints import open_checkpoint

    # an opener of the caller's own computes in this process: the same rows
    (own,) = jobs.analyze(store, cid, force=True, opener=lambda p: open_checkpoint(p))
    a = child.frame.sort_values(["layer", "metric", "head"], na_position="first").reset_index(drop=True)
    b = own.frame.sort_values(["layer", "metric", "head"], na_position="first").reset_index(drop=True)
    assert a["metric"].tolist() == b["metric"].tolist() and a["head"].equals(b["head"])
    assert (a["value"] - b["value"]).abs().max() < 1e-9
    # the chance levels to round-off, not bit for bit: MKL's eigenvalues of one 128 x 128
    # problem move by ~1e-14 with the threads it gets, and the child and this process may
    # differ there (analysis._lapack_pool gives each problem one thread where a stack is split,
    # a plain call gives it all of them)
    assert a["chance"].isna().equals(b["chance"].isna())
    np.testing.assert_allclose(a["chance"].to_numpy(), b["chance"].to_numpy(), rtol=1e-12, atol=1e-14)
    assert child.tied == own.tied and child.notes == own.notes


def test_an_analysis_past_its_time_budget_is_one_line_and_the_caller_goes_on(stored, monkeypatch):
    store, cid = stored
    monkeypatch.setenv("QKVSCOPE_ANALYSIS_TIMEOUT_S", "0")
    with pytest.raises(FileError) as err:
        jobs.analyze(store, cid)
    assert str(err.value).endswith("analysing it took more than 0 s (limit QKVSCOPE_ANALYSIS_TIMEOUT_S; set it in "
                                   "the environment to raise it)")
    with store.connect() as con:                          # nothing stored for it
        assert con.execute("SELECT count(*) FROM analysis_results WHERE checkpoint_id = ?", [cid]).fetchone() == (0,)
    monkeypatch.delenv("QKVSCOPE_ANALYSIS_TIMEOUT_S")
    (done,) = jobs.analyze(store, cid)                    # the next analysis runs in a fresh child
    assert len(done.frame) > 0


# -- resolve: an unstored path is ingested by the child, never in this process ----------------

@pytest.fixture
def bomb(tmp_path):
    """A 3 KB nanoGPT-style checkpoint whose c_attn weight is ``zeros(1).expand(73728, 24576)``
    (zero strides: 7 GB if materialised), as in tests/hostile/test_bombs.py."""
    from tests.hostile.test_bombs import gpt2_state

    state = gpt2_state()
    state["h.0.attn.c_attn.weight"] = torch.zeros(1).expand(73728, 24576)
    p = tmp_path / "expand.pt"
    torch.save({"model": state}, p)
    assert p.stat().st_size < 10_000
    return p


def test_resolve_refuses_a_fifo_from_its_stat_without_a_child(tmp_path, monkeypatch):
    """A FIFO named model.pt given to ``analyze`` or the Inspector's path field: one line, nothing
    stored, and no reading child asked (its ingest would stop at the same check)."""
    import os

    import loaders.sandbox

    def in_child(*a, **k):
        raise AssertionError("a reading child was asked to ingest it")

    monkeypatch.setattr(loaders.sandbox, "ingest_checkpoint", in_child)
    store = Store(tmp_path / "db.duckdb")
    store.migrate()
    fifo = tmp_path / "model.pt"
    os.mkfifo(fifo)
    with pytest.raises(FileError) as err:
        jobs.resolve(store, str(fifo))
    assert str(err.value) == f"{fifo}: is a FIFO, not a regular file"
    assert store.checkpoints() == []


@pytest.mark.slow
def test_resolve_ingests_in_the_child_only(stored, bomb, tmp_path, monkeypatch):
    """``loaders.ingest.ingest_checkpoint`` is never called in this process (it would raise)."""
    import loaders.ingest
    from app import sandbox_jobs

    def in_process(*a, **k):
        raise AssertionError("the file was parsed in the parent process")

    monkeypatch.setattr(loaders.ingest, "ingest_checkpoint", in_process)
    store, cid = stored
    with pytest.raises(FileError) as err:                              # a child of its own
        jobs.resolve(store, str(bomb))
    assert str(err.value).startswith(f"{bomb}: ") and "strides [0, 0] reuses its storage's elements" in str(err.value)
    assert jobs.resolve(store, str(cid)) == cid                         # an id: no file read
    with sandbox_jobs.pooled() as reader:                              # one child for several targets
        assert [jobs.resolve(store, str(tmp_path / "gpt2-tiny"), reader=reader) for _ in range(2)] == [cid, cid]
        with pytest.raises(FileError):
            jobs.resolve(store, str(bomb), reader=reader)
        pid = reader.pid
        assert jobs.resolve(store, str(tmp_path / "gpt2-tiny"), reader=reader) == cid and reader.pid == pid


@pytest.mark.slow
def test_analyze_cli_on_a_bomb_is_one_line_and_the_database_unchanged(stored, bomb):
    """``python -m app analyze BOMB`` under an address-space limit of 4 GiB: exit 2, one line
    ``error: BOMB: what``, the database byte-identical."""
    from tests.hostile.test_bombs import cli, digest, one_error_line

    store, _ = stored
    before = digest(store.path)
    proc, secs = cli("analyze", str(bomb), "--db", str(store.path), "--device", "cpu")
    one_error_line(proc, bomb, "strides [0, 0] reuses its storage's elements")
    assert digest(store.path) == before and secs < 60
