"""What the server keeps of SQL results (``loaders.sql_console.hold``): all sessions' last
results together stay under ``QKVSCOPE_SQL_HELD_MB``, the oldest other session's going
first; one over the whole budget is refused with one line."""
from __future__ import annotations

import gc
import sys

import numpy as np
import pandas as pd
import pytest

from loaders import sql_console
from loaders.errors import QueryError
from loaders.sql_console import QueryResult, dropped_message, held_bytes, held_total, hold, release

MB = 1 << 20


@pytest.fixture(autouse=True)
def nothing_held(monkeypatch):
    monkeypatch.setattr(sql_console, "_held", [])
    monkeypatch.setenv("QKVSCOPE_SQL_HELD_MB", "10")


def result(mb: int) -> QueryResult:
    """A frame of ``mb`` MB: one byte a row, less the 132 bytes of its index."""
    return QueryResult(frame=pd.DataFrame({"x": np.zeros(mb * MB - 132, dtype=np.int8)}), truncated=False,
                       seconds=0.1)


def test_a_frame_is_counted_at_its_deep_size():
    assert held_bytes(result(3).frame) == 3 * MB
    words = pd.DataFrame({"s": ["x" * 1000] * 100})
    assert held_bytes(words) >= 100 * 1000


def test_list_and_struct_cells_count_what_they_hold():
    cell = np.array([{"a": "y" * 1000, "b": np.arange(100)} for _ in range(10)], dtype=object)
    frame = pd.DataFrame({"l": [cell] * 50})
    shallow = int(frame.memory_usage(index=True, deep=True).sum())
    inner = sys.getsizeof("y" * 1000) + sys.getsizeof(np.arange(100))
    assert held_bytes(frame) >= shallow + 50 * 10 * inner


def test_the_oldest_other_session_goes_first():
    a, b, c = hold(result(4)), hold(result(4)), hold(result(1))
    assert held_total() == 9 * MB
    d = hold(result(4))                       # 13 MB > 10: a goes
    assert a.result is None and b.result is not None and c.result is not None and d.result is not None
    assert held_total() == 9 * MB
    e = hold(result(8))                       # b, c and d go
    assert [h.result is None for h in (b, c, d)] == [True, True, True]
    assert held_total() == 8 * MB and e.result is not None
    assert dropped_message(a) == (
        "this result (4 MB) was dropped to make room for another session's: the server keeps 10 MB of "
        "results for all sessions (QKVSCOPE_SQL_HELD_MB; set it in the environment to raise it); "
        "press Run to run the query again")


def test_a_sessions_previous_result_is_let_go():
    a = hold(result(6))
    b = hold(result(6), previous=a)
    assert a.result is None and b.result is not None and held_total() == 6 * MB
    release(b)
    assert held_total() == 0


def test_a_closed_sessions_result_leaves_the_count():
    hold(result(6))                           # nobody keeps it: the session state is gone
    gc.collect()
    kept = hold(result(6))
    assert kept.result is not None and held_total() == 6 * MB


def test_a_result_over_the_whole_budget_is_refused():
    a = hold(result(2))
    with pytest.raises(QueryError) as err:
        hold(result(11))
    assert str(err.value) == ("result of 11 MB in the server is over the 10 MB it keeps for all sessions' "
                              "results: add LIMIT or select fewer columns (QKVSCOPE_SQL_HELD_MB; set it in "
                              "the environment to raise it)")
    assert a.result is not None and held_total() == 2 * MB
