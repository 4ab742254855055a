"""``loaders.filecheck.failure``: the one line for an exception no reader typed."""
import resource

import pytest

from loaders.filecheck import failure

GIB = 1 << 30


@pytest.fixture
def soft_limit(monkeypatch):
    """A process with a 6 GiB soft memory limit (RLIMIT_DATA, as the reading child sets it)."""
    monkeypatch.setattr(resource, "getrlimit", lambda what: (6 * GIB, resource.RLIM_INFINITY))


def test_memory_line_names_the_files_budget_not_what_the_imports_hold(soft_limit, monkeypatch):
    monkeypatch.setenv("QKVSCOPE_PARSE_MEMORY_MB", "4096")
    monkeypatch.setenv("QKVSCOPE_PARSE_HELD_BYTES", str(2 * GIB))     # torch and the readers, imported
    assert failure(MemoryError()) == ("reading it needed more than 4.0 GiB of memory (limit "
                                      "QKVSCOPE_PARSE_MEMORY_MB=4,096 plus the file's size; "
                                      "set it in the environment to raise it)")


def test_memory_line_without_a_held_figure_is_the_whole_limit(soft_limit, monkeypatch):
    monkeypatch.delenv("QKVSCOPE_PARSE_HELD_BYTES", raising=False)
    assert failure(MemoryError()).startswith("reading it needed more than 6.0 GiB of memory (limit ")


def test_other_failures():
    assert failure(RecursionError()) == "content nested deeper than can be followed (RecursionError)"
    assert failure(ValueError("bad\n  thing")) == "ValueError: bad thing"
