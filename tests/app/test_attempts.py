"""app.attempts on the pages that read a stored checkpoint: a read that failed in the reading
child is not repeated at every click (each could cost the child's whole time limit), until
*Try again* or until the file changes; the failure says which file and what was wrong."""
from __future__ import annotations

import pytest

import app.sandbox_jobs as sandbox_jobs
from loaders.ingest import ingest_checkpoint
from loaders.store import Store
from tests.app.apptest import page_test
from tests.app.test_page_experiments import arr, figures
from tests.app.test_page_inspector import _analysed_in_process, tiny_gpt2


@pytest.fixture
def broken(tmp_path, monkeypatch):
    """A stored GPT-2 whose weights file was overwritten with junk after it was stored, the
    database in ``QKVSCOPE_DB``, and the list of what the reading child was asked to do."""
    folder = tiny_gpt2(tmp_path / "gpt2")
    store = Store(tmp_path / "db.duckdb")
    store.migrate()
    cid = ingest_checkpoint(store, folder).checkpoint_id
    monkeypatch.setenv("QKVSCOPE_DB", str(store.path))
    return store, cid, folder, _child_calls(monkeypatch)


def _child_calls(monkeypatch) -> list[str]:
    """The names of the jobs the sandbox is asked to run from now on (the real child)."""
    calls: list[str] = []
    real = sandbox_jobs.call

    def counted(job, *args, **kw):
        calls.append(job)
        return real(job, *args, **kw)

    monkeypatch.setattr(sandbox_jobs, "call", counted)
    return calls


def _break(folder) -> None:
    (folder / "model.safetensors").write_bytes(b"\x00" * 64)


def test_a_failed_spectra_or_map_read_is_remembered_until_try_again_or_a_new_file(broken):
    store, cid, folder, calls = broken
    _analysed_in_process(store, cid)          # stored: the page shows the metrics without the file
    _break(folder)
    at = page_test("inspector", {"ckpt": str(cid)}).run()
    assert not at.exception, at.exception
    assert calls == ["spectra", "attention", "head_groupings"]
    errors = [e.value for e in at.error]
    assert len(errors) == 3 and all("model.safetensors" in e for e in errors), errors
    assert {"retry_spectra", "retry_attention", "retry_head_groupings"} <= {b.key for b in at.button}
    assert "insp_heatmap" in figures(at)       # the stored metrics are still drawn
    # another control reruns the page: the broken file is not read again
    at.selectbox(key="insp_metric").select("qk_symmetry").run()
    at.number_input(key="insp_tokens").set_value(32).run()      # a new question for the maps: asked once
    assert calls == ["spectra", "attention", "head_groupings", "attention"]
    at.run()
    assert calls == ["spectra", "attention", "head_groupings", "attention"] and len(at.error) == 3
    # Try again reads it again (and fails again, with the same message)
    at.button(key="retry_spectra").click().run()
    assert calls == ["spectra", "attention", "head_groupings", "attention", "spectra"] and len(at.error) == 3
    # a file written again is read again by itself
    tiny_gpt2(folder)
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert calls[5:] == ["spectra", "attention", "head_groupings"]
    assert "insp_spectra" in figures(at) and "insp_attention" in figures(at) and "insp_head_map" in figures(at)


def test_an_analysis_that_failed_is_not_run_again_at_every_rerun(broken):
    store, cid, folder, calls = broken
    _break(folder)
    at = page_test("inspector", {"ckpt": str(cid)}).run()
    assert not at.exception, at.exception
    assert calls == ["analyze"]
    [error] = [e.value for e in at.error]
    assert "model.safetensors" in error, error
    assert not at.get("progress"), "the progress bar is removed when the analysis fails"
    at.run()
    at.toggle(key="insp_act").set_value(True).run()            # activations too: another analysis
    assert calls == ["analyze", "analyze"]
    at.toggle(key="insp_act").set_value(False).run()
    assert calls == ["analyze", "analyze"] and len(at.error) == 1
    at.button(key="retry_analysis").click().run()
    assert calls == ["analyze", "analyze", "analyze"]
    tiny_gpt2(folder)
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert calls[3:] == ["analyze", "spectra", "attention", "head_groupings"] and "insp_heatmap" in figures(at)


def test_compare_names_the_checkpoint_that_fails_once_and_compares_the_rest(tmp_path, monkeypatch):
    """A run of two checkpoints, the second broken: the pair view says why and offers Try
    again; the run's trajectory still draws the first; reruns analyse nothing again."""
    from loaders.ingest import ingest_paths

    run = tmp_path / "runs" / "gpt2-wd0.1"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text("step,train_loss\n100,3.9\n200,3.8")      # no trailing newline
    for i, step in enumerate((100, 200)):
        tiny_gpt2(run / f"step_{step}", seed=i)
    store = Store(tmp_path / "db.duckdb")
    assert ingest_paths(store, [tmp_path / "runs"]).to_json()["errors"] == 0
    _break(run / "step_200")
    monkeypatch.setenv("QKVSCOPE_DB", str(store.path))
    calls = _child_calls(monkeypatch)
    at = page_test("compare", {"a": "1", "b": "2", "tmetric": "kv_share_r2"}, timeout=240).run()
    assert not at.exception, at.exception
    # the pair analysed both (one failed); the run's view tried the broken one once more
    assert calls == ["analyze"] * 3
    errors = [e.value for e in at.error]
    assert len(errors) == 2 and all("step_200" in e and "model.safetensors" in e for e in errors), errors
    assert {"retry_compare_pair", "retry_compare_run"} <= {b.key for b in at.button}
    traj = figures(at)["cmp_traj"]["data"]
    assert [t["name"] for t in traj][:2] == ["L0", "L1"] and arr(traj[0]["x"]) == [100]
    at.run()
    assert len(calls) == 3 and len(at.error) == 2
    at.button(key="retry_compare_pair").click().run()
    assert len(calls) == 4


def test_file_stamp_changes_with_the_file_and_names_a_missing_path(tmp_path):
    from app.attempts import file_stamp

    folder = tmp_path / "ckpt"
    assert file_stamp(str(folder)) == "missing"
    folder.mkdir()
    assert file_stamp(str(folder)) == "empty"
    (folder / "config.json").write_text("{}")
    one = file_stamp(str(folder))
    assert one.startswith("config.json:2:") and file_stamp(str(folder)) == one
    (folder / "config.json").write_text("{} ")
    assert file_stamp(str(folder)) != one
    assert file_stamp(str(folder / "config.json")).startswith("config.json:3:")


def _two_reads():
    """AppTest script: a read that finds the database busy and one whose file is broken, each
    logged to ``$ATTEMPTS_LOG`` when it is really called."""
    import os
    from pathlib import Path

    from app.attempts import attempt, show_failure
    from loaders.errors import DatabaseBusyError, FileError

    log = Path(os.environ["ATTEMPTS_LOG"])

    def read(kind):
        log.write_text(log.read_text() + kind + "\n")
        raise DatabaseBusyError("db.duckdb: busy") if kind == "busy" else FileError("m.pt", "broken")

    for kind in ("busy", "file"):
        _, failure = attempt(kind, ("m.pt",), lambda: read(kind))
        show_failure(kind, failure)


def test_a_busy_database_is_shown_but_asked_again_a_broken_file_is_remembered(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    log = tmp_path / "log"
    log.write_text("")
    monkeypatch.setenv("ATTEMPTS_LOG", str(log))
    at = AppTest.from_function(_two_reads).run()
    assert not at.exception, at.exception
    assert [e.value for e in at.error] == ["db.duckdb: busy", "m.pt: broken"]
    at.run()
    assert log.read_text().split() == ["busy", "file", "busy"]
    at.button(key="retry_file").click().run()
    assert log.read_text().split() == ["busy", "file", "busy", "busy", "file"]
