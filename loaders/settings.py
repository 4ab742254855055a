"""The environment variables qkvscope reads that are not file budgets.

The budgets for untrusted files are ``loaders.budgets.BUDGETS`` (default and
help each) and the SQL page's are ``loaders.sql_console.SQL_BUDGETS``
(defaults; their help is below). ``SETTINGS`` holds every other
``QKVSCOPE_*`` variable the code reads, so that the settings reference
(``docs/reference/settings.md``, written by ``scripts/gen_reference.py``)
lists all of them; ``tests/test_docs_reference.py`` fails when the code reads
one that none of the three tables names.

Each entry: name -> ``Setting(default, help, who)``; ``default`` as text
(``None``: the default depends on the machine, see the help), ``who`` says
whom it is for: ``user``, ``tests`` or ``internal`` (set by qkvscope for its
own child processes; never set it by hand).
"""
from __future__ import annotations

from typing import NamedTuple


class Setting(NamedTuple):
    default: str | None
    help: str
    who: str = "user"


SETTINGS: dict[str, Setting] = {
    "QKVSCOPE_DB": Setting(None, "the database file every command and the dashboard use when `--db` is not given "
                                 "(`Store`, `loaders/store.py`)"),
    "QKVSCOPE_CHANCE_CACHE": Setting(None, "the folder where chance levels are kept between analyses, one entry per "
                                           "geometry and version of the analysis code (`loaders/chance_cache.py`); "
                                           "default `chance/` in the user cache folder; empty turns it off"),
    "QKVSCOPE_PLUGINS": Setting("", "comma-separated module names on the Python path, or `.py` files, that "
                                    "register metrics (`analysis/registry.py`); imported by every qkvscope "
                                    "process with the registry, Ray workers included when they inherit it"),
    "QKVSCOPE_ALLOWED_HOSTS": Setting("", "comma-separated host names the dashboard answers to besides localhost, "
                                          "127.0.0.1, ::1 and the `--host` address (as `serve --allow-host`); "
                                          "`*` turns the Host check off (`app/hostguard.py`)"),
    "QKVSCOPE_SQL_TIMEOUT_S": Setting(None, "the SQL page's default time limit in seconds; at the limit DuckDB is "
                                            "interrupted, and 1 s later the query process is killed"),
    "QKVSCOPE_SQL_MAX_TIMEOUT_S": Setting(None, "the largest time limit a query (or a link's `timeout=`) may ask for"),
    "QKVSCOPE_SQL_MAX_ROWS": Setting(None, "the SQL page's default row limit; rows past it are cut off and the "
                                           "result marked truncated"),
    "QKVSCOPE_SQL_RESULT_MB": Setting(None, "megabytes of one result (Arrow size of the kept rows); over it the "
                                            "query fails"),
    "QKVSCOPE_SQL_MEMORY_MB": Setting(None, "DuckDB's `memory_limit` in the query process, in MB"),
    "QKVSCOPE_SQL_ADDRESS_MB": Setting(None, "the query process's address space (`RLIMIT_AS`) in MB; 0 means "
                                             "QKVSCOPE_SQL_MEMORY_MB + 2,048"),
    "QKVSCOPE_SQL_SPILL_MB": Setting(None, "spill files: 0 writes none, so a query needing more than its memory "
                                           "fails; N lets it spill N MB into a fresh temporary folder"),
    "QKVSCOPE_SQL_MAX_VALUES": Setting(None, "values of one result as the server will hold them (a list or struct "
                                             "cell counts its elements, recursively); over it the query fails"),
    "QKVSCOPE_SQL_MAX_QUERY_KB": Setting(None, "the query text in KB; longer is refused before anything parses it"),
    "QKVSCOPE_SQL_CONCURRENT": Setting(None, "query processes one server runs at once; a query while all are busy "
                                             "is told to try again"),
    "QKVSCOPE_SQL_HELD_MB": Setting(None, "MB of results all the server's sessions keep (pandas deep size); a new "
                                          "result that would pass it drops the oldest other session's, which runs "
                                          "again on Run; a result over it is refused"),
    "QKVSCOPE_TEST_WORKERS": Setting("3", "test processes `scripts/test.sh` runs (pytest-xdist); 0 runs every "
                                          "test in one process", "tests"),
    "QKVSCOPE_BENCH_HWM": Setting(None, "file where `bench/checkpoint_memory.py`'s measured child writes its "
                                        "peak memory", "internal"),
    "QKVSCOPE_TERMINAL_FD": Setting(None, "the terminal `serve` keeps for qkvscope's own lines while the server's "
                                          "output goes to its log (`app/serverlog.py`)", "internal"),
    "QKVSCOPE_SERVER_LOG": Setting(None, "the server's log file, `<db>.log` (`app/serverlog.py`)", "internal"),
    "QKVSCOPE_SERVER_LOG_START": Setting(None, "where in the server's log this start began, so a failed start "
                                               "prints its own last lines (`app/serverlog.py`)", "internal"),
    "QKVSCOPE_PARSE_PARENT": Setting(None, "the process id a reading child checks its parent against, so that "
                                           "it dies with it (`loaders/sandbox.py`)", "internal"),
    "QKVSCOPE_PARSE_HELD_BYTES": Setting(None, "memory a reading child held after its imports, from which its "
                                               "memory limit is counted (`loaders/sandbox.py`)", "internal"),
}
