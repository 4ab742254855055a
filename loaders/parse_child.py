"""Reading untrusted files in a child process, under a memory limit and a time limit.

Every reader has its own budgets (``loaders.budgets``); this is the net under
all of them, for a bomb nobody thought of. ``Reader`` keeps one child process
(``python -m loaders.parse_child``) that reads files one at a time for its
parent. Before each file the child lowers its own limit on private writable
memory (``RLIMIT_DATA``: heap, anonymous and private writable mappings, thread
stacks; ``VmData``) to what it already holds (the interpreter, torch and the
readers, imported before the first file: about 0.3 GB with a CPU build of
torch) plus ``QKVSCOPE_PARSE_MEMORY_MB`` MiB plus the file's size (a file
mapped copy-on-write counts toward it): the budget is for the file, never
spent on the child's own start. Address space that is only reserved does not
count (per-thread malloc arenas, the CUDA driver's reservations): it grows with
the machine's cores, so an address-space limit (``RLIMIT_AS``) fails good
files on 16 cores (docs/security.md, "The reading child process"; the figures are in
``tests/hostile/test_parse_child.py::test_the_budget_does_not_shrink_with_the_machines_cores``).
The parent waits at most
``QKVSCOPE_PARSE_TIMEOUT_S`` seconds for the answer and then kills the child.
What fails becomes one line naming the file:

* an allocation over the limit (``MemoryError``, torch's ``can't allocate
  memory``): ``PATH: reading it needed more than 4.0 GiB of memory (limit
  QKVSCOPE_PARSE_MEMORY_MB=4,096 plus the file's size; ...)``, and the same
  child goes on with the next file;
* past the time limit: ``PATH: reading it took more than 600 s (limit
  QKVSCOPE_PARSE_TIMEOUT_S; ...)``;
* the child killed by a signal: ``SIGBUS`` (a memory-mapped file truncated
  while it was read) says the file changed while it was read; ``SIGKILL`` not
  sent by us (the kernel's out-of-memory killer) says memory; exit status 127
  is glibc giving up when it cannot map a new thread's stack and thread-local
  data or a library loaded part-way (it prints "cannot allocate memory for
  thread-local data: ABORT" and calls ``_exit(127)``: torch starting its
  OpenMP threads, ``transformers`` imported for a forward pass): that says
  memory too, naming the budget. Any other death names the signal or exit
  status. The next file gets a fresh child.

Callers that make many small requests (the Inspector's spectra, ties and
attention maps; batch tasks) take a child from ``POOL`` instead of starting
one each time (a start costs 2-3 s of imports): ``call(..., pooled=True)``.
``POOL.prestart(modules)`` starts one in the background and has it import
``modules`` (code of this project and its libraries, named by the caller,
never by a file) before any file, so that the first request finds it ready:
the dashboard does this at its first page (``app/dashboard/prestart.py``), ``analyze``
before its own imports (``prestart``; ``QKVSCOPE_PRESTART=0`` turns both off).
``ingest_paths`` and ``ingest_checkpoint`` borrow one from ``POOL`` too unless
given a ``Reader``: ``analyze PATH`` ingests and then analyses in one child.

Ingest: the child runs ``loaders.ingest.ingest_file`` for one path, which
stores that file in one DuckDB transaction; a child that dies part-way
leaves no row of it (a transaction that never committed is discarded, the
guarantee ``tests/faults/test_kill.py`` checks with ``kill -9``), and the
parent links checkpoints to runs at the end. The parent never parses the
file: it only walks folders (``lstat``), sends paths and reads JSON answers
(never a pickle). ``info``: ``call("app.commands.info:describe", path)``
runs the function in the child and returns its JSON-able result.

The protocol is one JSON line each way: ``{"op": ..., "limit": BYTES, ...}``
on the child's stdin; ``{"ok": true, "result": ...}`` or ``{"ok": false,
"message": "PATH: what", "file": PATH, "problem": TEXT, "store": CLASS}``
on its stdout (whatever a
library prints goes to stderr, so it cannot break a line).
"""
from __future__ import annotations

import atexit
import json
import os
import queue
import select
import signal
import stat
import subprocess
import sys
import threading
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable

from loaders.budgets import budget, memory_exceeded, memory_limit_bytes, time_exceeded
from loaders.bundled import in_checkout
from loaders.errors import DatabaseBusyError, FileError, QkvscopeError, StoreError
from loaders import ingest as _ingest
from loaders.ingest import watch as poll
from loaders.report import FileReport, IngestReport
from loaders.store import Store

ROOT = Path(__file__).resolve().parents[1]
Progress = Callable[[int, int, str], None]  # (done, total, current path)


def _held(st: os.stat_result) -> int:
    """Bytes a file holds: its size, or its allocated blocks when fewer (a
    sparse file's holes hold nothing, so they buy no memory)."""
    return min(st.st_size, st.st_blocks * 512)


def reading_size(path: str | Path) -> int:
    """Bytes a reader of ``path`` may map or load: the bytes the file holds (a zip's
    declared uncompressed total when larger, capped by ``QKVSCOPE_ZIP_TOTAL_BYTES``),
    or for a folder the files directly in it (a Hugging Face folder's shards).
    Only ``stat`` and a zip's central directory are read; 0 when unreadable."""
    path = Path(path)
    try:
        if path.is_dir():
            return sum(_held(p.stat()) for p in path.iterdir() if p.is_file())
        st = path.stat()
        size = _held(st)
        # only a regular file is opened here: a FIFO named x.zip would block this process
        if path.suffix.lower() == ".zip" and stat.S_ISREG(st.st_mode) and zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                declared = sum(i.file_size for i in zf.infolist())
            size = max(size, min(declared, budget("QKVSCOPE_ZIP_TOTAL_BYTES")))
        return size
    except (OSError, zipfile.BadZipFile, ValueError):
        return 0


#: glibc's exit status when it cannot allocate a new thread's TLS or map a library
#: (``_dl_fatal_printf`` / ``_dl_signal_error``): out of memory under a limit (a thread's stack
#: counts toward RLIMIT_DATA; a library's mapping toward a user's own ``ulimit -v``).
GLIBC_OUT_OF_MEMORY = 127


def _death(rc: int, limit: int) -> str:
    """The one-line problem for a child that died while reading a file."""
    if rc == GLIBC_OUT_OF_MEMORY:
        return memory_exceeded(limit) + (" [the reading process could not start a thread or load a library "
                                         "within its limit: exit status 127]")
    if rc < 0:
        sig = -rc
        if sig == signal.SIGBUS:
            return ("changed while it was read (bus error: a memory-mapped file was truncated or "
                    "rewritten); read it again once it is written")
        if sig == signal.SIGKILL:
            return memory_exceeded(limit) + " [the reading process was killed, as by the out-of-memory killer]"
        return f"the process reading it died ({signal.Signals(sig).name})"
    return f"the process reading it exited with status {rc}"


class _Spawner:
    """Starts every reading child from one thread that lives as long as this process.

    A child asks the kernel to kill it when its parent dies (``_die_with_parent``,
    ``PR_SET_PDEATHSIG``), and for Linux the parent is the *thread* that started it.
    Started by a Streamlit script run (a thread that ends with the run), a pooled child
    was killed the moment the page was drawn: the pool kept dead children, and every
    later request paid a fresh start (1 s of imports, 2 s more for ``transformers``).
    Started here, a child dies with this process and not before.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, args: list[str], **kwargs) -> subprocess.Popen:
        """``subprocess.Popen(args, **kwargs)``, run by the spawning thread."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():    # the first child, or after a fork
                self._thread = threading.Thread(target=self._serve, name="qkvscope-reader-spawner", daemon=True)
                self._thread.start()
        job = {"done": threading.Event()}
        self._jobs.put((args, kwargs, job))
        job["done"].wait()
        if "error" in job:
            raise job["error"]
        return job["proc"]

    def _serve(self) -> None:
        while True:
            args, kwargs, job = self._jobs.get()
            try:
                job["proc"] = subprocess.Popen(args, **kwargs)
            except BaseException as exc:      # noqa: BLE001 -- raised again in the caller's thread
                job["error"] = exc
            finally:
                job["done"].set()


_SPAWNER = _Spawner()


class Reader:
    """One child process reading untrusted files for this process; see the module docstring.

    Use as a context manager (the child ends with it); a child that dies or
    runs out of time is replaced at the next request. Not shared between
    threads: each caller (a page run, a CLI command) makes its own.
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._buf = b""

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> subprocess.Popen:
        # A checkout's packages are found through PYTHONPATH (-P below drops the working directory);
        # installed ones are on the interpreter's own path.
        env = dict(os.environ, QKVSCOPE_PARSE_PARENT=str(os.getpid()), PYTHONPATH=os.pathsep.join(
            [*([str(ROOT)] if in_checkout() else []), *filter(None, [os.environ.get("PYTHONPATH")])]))
        self._buf = b""
        # -P: the caller's working directory (relative paths are its) is not on sys.path.
        # Started by _SPAWNER's thread: the child dies with this process, not with the calling thread.
        self._proc = _SPAWNER.popen([sys.executable, "-P", "-m", "loaders.parse_child"], env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None)
        # The child imports the readers (torch, duckdb) before it says ready: a busy machine's
        # slow start is not counted against the first file's time limit.
        try:
            ready = self._readline(time.monotonic() + max(300, budget("QKVSCOPE_PARSE_TIMEOUT_S")))
        except TimeoutError:
            ready = None
        if ready != b'{"ready": true}':
            rc = self._kill()
            why = (" (exit status 127: out of address space while loading its libraries; this process "
                   "runs under an address-space limit of its own, ulimit -v, too low for torch)"
                   if rc == GLIBC_OUT_OF_MEMORY else f" (exit status {rc})")
            raise QkvscopeError(f"the process that reads files did not start{why}")
        return self._proc

    def _kill(self) -> int:
        proc, self._proc = self._proc, None
        proc.kill()
        return proc.wait()

    def _readline(self, deadline: float) -> bytes | None:
        """The child's next answer line, or None at EOF; ``TimeoutError`` past ``deadline``."""
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def request(self, path: str | Path, op: str, *, timeout: str = "QKVSCOPE_PARSE_TIMEOUT_S", **fields):
        """Run ``op`` on ``path`` in the child and return its result; a failure
        raises ``FileError(path, problem)`` (``StoreError``s keep their class).
        ``timeout`` names the time budget (analyses have their own, longer one)."""
        limit = memory_limit_bytes(reading_size(path))
        if self._proc is None or self._proc.poll() is not None:
            self._proc = self._start()
        line = json.dumps({"op": op, "path": str(path), "limit": limit, **fields}) + "\n"
        try:
            self._proc.stdin.write(line.encode())
            self._proc.stdin.flush()
            answer = self._readline(time.monotonic() + budget(timeout))
        except TimeoutError:
            self._kill()
            raise FileError(path, time_exceeded(timeout, "analysing" if "ANALYSIS" in timeout else "reading")) from None
        except BrokenPipeError:
            answer = None
        if answer is None:                       # the child died while reading
            raise FileError(path, _death(self._kill(), limit))
        reply = json.loads(answer)
        if reply["ok"]:
            return reply["result"]
        message = reply["message"]
        if reply.get("store"):
            cls = DatabaseBusyError if reply["store"] == "DatabaseBusyError" else StoreError
            raise cls(message)
        if reply.get("file"):                    # a FileError: keep the file it names (a folder's shard)
            raise FileError(reply["file"], reply["problem"])
        prefix = f"{path}: "
        raise FileError(path, message[len(prefix):] if message.startswith(prefix) else message)

    # -- what callers use --------------------------------------------------

    def warm(self, modules: Iterable[str]) -> dict[str, float]:
        """Start the child if it is not running and have it import ``modules`` (this
        project's and its libraries' module names, given by the caller) before any file:
        seconds per module. What a module costs to import is then paid before the first
        request that needs it, and stays out of that request's memory budget, like the
        readers' own imports."""
        return self.request(os.devnull, "warm", modules=list(modules))

    def ingest_file(self, store, path: Path, kind: str = "unknown") -> list[FileReport]:
        """``loaders.ingest.ingest_file`` in the child: every outcome is a report
        (``kind``, from ``kind_of``, labels the report of a child that died)."""
        try:
            return [FileReport(**r) for r in self.request(path, "ingest", db=str(store.path),
                                                           busy_timeout=store.busy_timeout)]
        except StoreError:
            raise
        except FileError as exc:
            return [FileReport(str(path), kind if kind in ("log", "checkpoint") else "unknown", "error",
                               reason=str(exc))]

    def kind_of(self, path: Path) -> str:
        """'log', 'checkpoint', ... as ``loaders.ingest`` classifies it ('unknown' on failure)."""
        try:
            return self.request(path, "classify")
        except FileError:
            return "unknown"       # ingest_file reports it in its turn


def ingest_paths(store, paths: Iterable[str | Path], *, progress: Progress | None = None,
                 reader: Reader | None = None, project: str | None = None) -> IngestReport:
    """``loaders.ingest.ingest_paths`` (the same walk, order, projects and final linking) with
    each file classified, read and stored by the child: a file that kills or stalls the child
    is one ``error`` report and the next file gets a fresh child. ``reader`` None: an idle
    child of ``POOL``.
    """
    with _lent(reader) as reader:
        return _ingest.ingest_paths(store, paths, progress=progress, project=project, kind_of=reader.kind_of,
                                   ingest_one=reader.ingest_file)


def ingest_checkpoint(store, path: str | Path, *, reader: "Reader | None" = None) -> FileReport:
    """``loaders.ingest.ingest_checkpoint`` in a child (the Inspector's upload and
    path field, ``analyze PATH``): its report, or ``FileError`` with the one-line
    problem. ``reader`` None: an idle child of ``POOL``, so the ``analyze`` that
    follows (``call(..., pooled=True)``) finds the same child already started."""
    with _lent(reader) as reader:
        return FileReport(**reader.request(path, "ingest_checkpoint", db=str(store.path),
                                           busy_timeout=store.busy_timeout))


@contextmanager
def _lent(reader: "Reader | None"):
    """``reader`` itself, or one lent by ``POOL`` for the block (a child's start costs 2-3 s
    of imports; a child that died or stalled is replaced at its next request either way)."""
    if reader is not None:
        yield reader
        return
    with POOL.reader() as lent:
        yield lent


def watch(store, paths: Iterable[str | Path], *, interval: float = 2.0,
          on_report: Callable[[IngestReport], None] | None = None,
          on_busy: Callable[[DatabaseBusyError], None] | None = None,
          stop: Callable[[], bool] | None = None, project: str | None = None) -> None:
    """``loaders.ingest.watch`` (its polling loop) with one child kept across polls; ``project``
    as ``ingest_paths`` takes it."""
    with Reader() as reader:
        poll(store, paths, interval=interval, on_report=on_report, on_busy=on_busy, stop=stop,
             ingest=lambda store, paths: ingest_paths(store, paths, reader=reader, project=project))


class ReaderPool:
    """Idle children kept for callers that make many small requests (the Inspector's
    spectra for each layer and head a user picks, one batch task after another).

    ``with POOL.reader() as r:`` lends an idle child (or a new ``Reader``) to one
    caller at a time and takes it back afterwards, keeping at most ``keep`` idle.
    A child started under other budgets (the ``QKVSCOPE_*`` environment it
    inherited, ``QKVSCOPE_DB`` aside) is closed instead of lent: budgets are read
    from the environment by the child's readers. A child that died or timed out
    is replaced by its ``Reader`` at the next request. Thread-safe; each child is
    still used by one thread at a time.
    """

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self._idle: list[tuple[tuple, Reader]] = []
        self._lock = threading.Lock()
        self._starting: threading.Event | None = None     # set when prestart's child is ready or gone

    def prestart(self, modules: Iterable[str] = ()) -> threading.Thread | None:
        """Start a child in a background thread, have it import ``modules`` (``Reader.warm``)
        and keep it idle, so that the first ``reader()`` finds it ready instead of paying
        the start and those imports (the dashboard's first checkpoint: about 1 s of start
        and 2 s of ``transformers``). Nothing when a child is already idle or starting.
        ``reader()`` waits for a child being started rather than start a second one. A
        child that fails to start is dropped; the next ``reader()`` starts its own, which
        reports why. Returns the thread (None when nothing was started)."""
        env = self._env()
        with self._lock:
            if self._idle or self._starting is not None:
                return None
            started = self._starting = threading.Event()
        modules = list(modules)

        def work() -> None:
            r: Reader | None = Reader()
            try:
                r.warm(modules)
            except (QkvscopeError, OSError):  # a module that failed to import (the child is still usable), or no child
                pass
            finally:
                with self._lock:
                    if r.pid is not None and len(self._idle) < self.keep:
                        self._idle.append((env, r))
                        r = None
                    self._starting = None
                started.set()
                if r is not None:
                    r.close()

        thread = threading.Thread(target=work, name="qkvscope-reader-prestart", daemon=True)
        thread.start()
        return thread

    @staticmethod
    def _env() -> tuple:
        return tuple(sorted((k, v) for k, v in os.environ.items()
                            if k.startswith("QKVSCOPE_") and k not in ("QKVSCOPE_DB", "QKVSCOPE_PARSE_PARENT")))

    @contextmanager
    def reader(self):
        env = self._env()
        stale: list[Reader] = []
        lent = None
        with self._lock:
            starting = self._starting if not self._idle else None
        if starting is not None:          # prestart's child: ready sooner than a second one started now
            starting.wait(max(300, budget("QKVSCOPE_PARSE_TIMEOUT_S")))
        with self._lock:
            while self._idle:
                key, r = self._idle.pop()
                if key == env and lent is None:
                    lent = r
                else:
                    stale.append(r)
        for r in stale:
            r.close()
        lent = lent or Reader()
        try:
            yield lent
        finally:
            with self._lock:
                keep = len(self._idle) < self.keep and lent.pid is not None
                if keep:
                    self._idle.append((env, lent))
            if not keep:
                lent.close()

    def close(self) -> None:
        """End every idle child (at exit, or a test that wants a fresh start)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for _, r in idle:
            r.close()


#: The process-wide pool (``call(..., pooled=True)``); its children end with this process.
POOL = ReaderPool()
atexit.register(POOL.close)


def prestart(modules: Iterable[str] = ()) -> threading.Thread | None:
    """``POOL.prestart(modules)`` unless ``QKVSCOPE_PRESTART=0`` is in the environment: the
    dashboard at its first page (``app/dashboard/prestart.py``), and ``analyze`` before it
    imports torch itself, so that the child's start and imports (about 1.5 s) run beside this
    process's own instead of after them. The thread doing it, or None when nothing was started."""
    if os.environ.get("QKVSCOPE_PRESTART", "1") == "0":
        return None
    return POOL.prestart(modules)


def call(target: str, path: str | Path, *, timeout: str = "QKVSCOPE_PARSE_TIMEOUT_S", pooled: bool = False,
         **kwargs):
    """``module:function`` called on ``path`` (and the JSON-able ``kwargs``) in a child, under
    the memory budget and the time budget ``timeout``; its result must be JSON-able.
    ``pooled``: in an idle child of ``POOL`` (started once, reused) instead of a new one."""
    with (POOL.reader() if pooled else Reader()) as reader:
        return reader.request(path, "call", target=target, kwargs=kwargs, timeout=timeout)


# -- the child -------------------------------------------------------------

def _run(req: dict):
    path = Path(req["path"])
    if req["op"] == "classify":
        from loaders.ingest import _classify

        return _classify(path)[0]
    if req["op"] == "ingest":
        from loaders.ingest import ingest_file

        store = Store(req["db"], busy_timeout=req["busy_timeout"])
        return [r.to_json() for r in ingest_file(store, path)]
    if req["op"] == "ingest_checkpoint":
        from loaders.ingest import ingest_checkpoint as ingest_one

        return ingest_one(Store(req["db"], busy_timeout=req["busy_timeout"]), path).to_json()
    if req["op"] == "warm":
        import importlib

        seconds = {}
        for module in req["modules"]:
            t = time.perf_counter()
            importlib.import_module(module)
            seconds[module] = time.perf_counter() - t
        return seconds
    if req["op"] == "call":
        import importlib

        module, name = req["target"].split(":")
        return getattr(importlib.import_module(module), name)(str(path), **(req.get("kwargs") or {}))
    raise ValueError(f"unknown op {req['op']!r}")


def data_held() -> int:
    """Bytes of private writable memory this process holds now (``VmData`` of
    ``/proc/self/status``, what ``RLIMIT_DATA`` counts; 0 where there is no ``/proc``):
    what the limit of the next file is added to."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) << 10                       # kB
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux ``PR_SET_PDEATHSIG``): a
    ``kill -9`` of ``ingest`` must not leave a child that goes on writing. The kernel
    sends it when the parent *thread* ends: the parent starts children from one
    long-lived thread (``_Spawner``)."""
    import ctypes  # here: Linux only, the child only

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)     # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != int(os.environ.get("QKVSCOPE_PARSE_PARENT", os.getppid())):
        os._exit(1)                              # the parent died before prctl took effect


def main() -> int:
    import resource  # here: the child only

    from loaders.filecheck import failure, out_of_memory

    _die_with_parent()
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)                                # a library's print() cannot break a line
    import loaders.checkpoints                   # noqa: F401 -- the readers, before any limit
    import loaders.ingest                        # noqa: F401
    import loaders.logs                          # noqa: F401
    answers.write('{"ready": true}\n')
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    for line in sys.stdin:
        req = json.loads(line)
        held = data_held()
        cap = held + int(req["limit"])                  # the budget is for the file, on top of what is held
        # for readers that word their own out-of-memory line from the soft limit (loaders.filecheck):
        # the part of it that is not the file's budget
        os.environ["QKVSCOPE_PARSE_HELD_BYTES"] = str(held)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
        try:
            reply = {"ok": True, "result": _run(req)}
        except StoreError as exc:
            reply = {"ok": False, "message": str(exc), "store": type(exc).__name__}
        except FileError as exc:
            reply = {"ok": False, "message": str(exc), "file": exc.path, "problem": exc.problem}
        except QkvscopeError as exc:
            reply = {"ok": False, "message": f"{req['path']}: {exc}"}
        except Exception as exc:    # noqa: BLE001 -- an untrusted file's content
            why = memory_exceeded(int(req["limit"])) if out_of_memory(exc) else failure(exc)
            reply = {"ok": False, "message": f"{req['path']}: {why}"}
        finally:
            resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))
        answers.write(json.dumps(reply, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
