"""The reader protocol (``loaders.logs.readers``): every reader module declares
it, a module dropped in the package is found by discovery alone, and
detection asks the readers in ``PRIORITY`` order."""
from __future__ import annotations

import inspect
import json
import pkgutil
import sys

import pytest

from loaders.logs import CHECKPOINT_LOG_FORMATS, READERS, detect_log, ingest_log, list_runs, readers, registry
from loaders.logs.base import ZIP_MAGIC, is_text_head
from tests.loaders.logs.helpers import points, write

NAMES = {"tensorboard", "query_free", "projection_sharing", "hf_trainer", "jsonl", "wandb_csv", "csv_long",
         "lightning", "csv_wide", "llmc", "modded_nanogpt", "nanogpt"}


def test_every_reader_module_declares_the_protocol():
    """Every public module of the package is a reader named after its file
    (one lacking an attribute would be skipped by discovery, not read)."""
    modules = {i.name for i in pkgutil.iter_modules(readers.__path__) if not i.name.startswith("_")}
    assert modules == set(READERS) and NAMES <= modules
    for name, mod in READERS.items():
        assert mod.NAME == name and mod.__name__ == f"loaders.logs.readers.{name}"
        assert isinstance(mod.PRIORITY, int) and isinstance(mod.APPENDABLE, bool)
        assert isinstance(mod.HELP, str) and mod.HELP
        assert list(inspect.signature(mod.sniff).parameters) == ["path", "head"]
        read = inspect.signature(mod.read).parameters
        assert list(read) == ["path", "start", "state", "complete"]
        assert [read[k].default for k in ("start", "state", "complete")] == [0, None, False]
        if hasattr(mod, "sniff_dir"):          # a run that is a folder: the file standing for it
            assert list(inspect.signature(mod.sniff_dir).parameters) == ["folder"]
        assert not getattr(mod, "FOLDER_UNIT", False) or hasattr(mod, "sniff_dir")
    assert [m.PRIORITY for m in READERS.values()] == sorted(m.PRIORITY for m in READERS.values())
    assert CHECKPOINT_LOG_FORMATS == ("projection_sharing",)


@pytest.mark.parametrize("name", sorted(NAMES - {"tensorboard", "query_free", "projection_sharing"}))
def test_text_readers_refuse_binary_and_zip_heads(tmp_path, name):
    """Each text reader's sniff refuses what detection used to filter out before
    asking it: a zip, NUL bytes (``is_text_head``); the same text is taken."""
    text = {"hf_trainer": b'{"log_history": [{"step": 1, "loss": 2.0}]}\n',
            "jsonl": b'{"step": 1, "loss": 2.0}\n',
            "wandb_csv": b"Step,a - loss\n1,2.0\n", "csv_long": b"step,metric,value\n1,loss,2.0\n",
            "csv_wide": b"step,loss\n1,2.0\n", "lightning": b"step,loss\n1,2.0\n",
            "llmc": b"s:1 trl:2.0\n", "modded_nanogpt": b"step:1/10 val_loss:2.0\n",
            "nanogpt": b"iter 1: loss 2.0, time 3.0ms\n"}[name]
    folder = tmp_path / "version_0"
    folder.mkdir()
    p = folder / ("metrics.csv" if name == "lightning" else "log.txt")
    assert READERS[name].sniff(p, text)
    assert not is_text_head(ZIP_MAGIC + text) and not READERS[name].sniff(p, ZIP_MAGIC + text)
    assert not READERS[name].sniff(p, text + b"\x00")


def test_a_one_line_trainer_state_is_hf_trainer_before_jsonl(tmp_path):
    """Both sniffs take it (a JSON line with global_step): the lower PRIORITY wins."""
    line = json.dumps({"global_step": 2, "max_steps": 2, "log_history": [{"step": 2, "loss": 1.5}]})
    p = write(tmp_path / "out" / "trainer_state.json", line + "\n")
    head = p.read_bytes()
    assert READERS["jsonl"].sniff(p, head) and READERS["hf_trainer"].sniff(p, head)
    assert READERS["hf_trainer"].PRIORITY < READERS["jsonl"].PRIORITY
    assert detect_log(p) == "hf_trainer"


TOY = '''"""A reader made up by the test: 'TOY v1 v2 ...' is train/loss at steps 0, 1, ..."""
from loaders.logs.base import Parsed, RunData, points_frame

NAME = "{name}"
PRIORITY = {priority}
HELP = "toy"
APPENDABLE = False


def sniff(path, head):
    return head.startswith(b"TOY ")


def read(path, *, start=0, state=None, complete=False):
    values = [float(x) for x in path.read_text().split()[1:]]
    return Parsed(runs=[RunData(name="", points=points_frame(range(len(values)), "train/loss", values))])
'''


@pytest.fixture
def more_readers(tmp_path, monkeypatch):
    """A second folder of ``loaders.logs.readers`` holding new modules: what
    dropping them into the package does, without writing into the source tree."""
    folder = tmp_path / "dropped"
    folder.mkdir()
    monkeypatch.setattr(readers, "__path__", [*readers.__path__, str(folder)])
    yield folder
    for path in folder.glob("*.py"):                 # imported modules, and their names on the package
        sys.modules.pop(f"{readers.__name__}.{path.stem}", None)
        if hasattr(readers, path.stem):
            delattr(readers, path.stem)


def test_a_reader_module_dropped_in_the_package_is_found_in_priority_order(more_readers, store, tmp_path,
                                                                           monkeypatch):
    (more_readers / "toy_late.py").write_text(TOY.format(name="toy_late", priority=55))
    (more_readers / "toy_first.py").write_text(TOY.format(name="toy_first", priority=5))
    (more_readers / "_toy_helper.py").write_text(TOY.format(name="toy_helper", priority=0))  # private
    (more_readers / "toy_half.py").write_text('NAME = "toy_half"\nPRIORITY = 1\n')          # no sniff/read
    found = readers.discover()
    names = list(found)
    assert set(names) == set(READERS) | {"toy_first", "toy_late"}
    assert names[0] == "toy_first"                                    # 5: before tensorboard (10)
    assert names.index("csv_wide") < names.index("toy_late") < names.index("llmc")    # 53 < 55 < 60
    assert [m.PRIORITY for m in found.values()] == sorted(m.PRIORITY for m in found.values())

    # Detection, the error's list of formats and ingest use it, with nothing else edited;
    # both toys take the file, the lower PRIORITY reads it.
    monkeypatch.setattr(registry, "READERS", found)
    p = write(tmp_path / "runs" / "sweep.toy", "TOY 3 2.5 2\n")
    assert found["toy_late"].sniff(p, p.read_bytes())
    assert detect_log(p) == "toy_first"
    [rep] = ingest_log(store, p)
    assert (rep.status, rep.format, rep.n_points) == ("added", "toy_first", 3)
    [run] = list_runs(store)
    assert (run["format"], run["metrics"], run["first_step"], run["last_step"]) == \
        ("toy_first", ["train/loss"], 0, 2)
    assert points(store, run["id"], "train/loss") == [(0, 3.0), (1, 2.5), (2, 2.0)]
    assert registry.why_not_a_log(write(tmp_path / "notes.txt", "hello\n")).startswith(
        "expected a training log (toy_first, tensorboard, wandb_offline, mlflow_sqlite, trackio, mlflow_files, "
        "query_free, hf_trainer,")


def test_two_reader_modules_of_one_name_are_refused(more_readers):
    (more_readers / "toy_a.py").write_text(TOY.format(name="jsonl", priority=1))
    with pytest.raises(ValueError) as e:
        readers.discover()
    assert str(e.value) == ("log readers loaders.logs.readers.toy_a and loaders.logs.readers.jsonl "
                            "are both named 'jsonl'")
