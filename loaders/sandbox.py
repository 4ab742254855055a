"""The one sandbox: untrusted parsing and computation in a child process, under budgets,
running only the jobs of a fixed table.

Every reader has its own budgets (``loaders.budgets``); this is the net under
all of them, for a bomb nobody thought of. A ``Sandbox`` keeps one child
process (``python -P -m ENTRY``) that runs jobs one at a time for its parent.

**What may run in it.** ``ENTRY`` is a module holding a table ``JOBS`` (job
name -> ``(module, function)``, written as literals in that module's source)
and ``PRELOAD`` (modules the child imports before its first request). The
parent sends a job *name*; the child looks it up in its own table and calls
``function(path, **kwargs)``; a name not in the table is refused with
``the sandbox runs only the jobs of its table (NAMES); 'NAME' is not one``
(``SandboxRefused``), by the parent before anything is sent and by the child
again. No string received over the pipe is ever imported: the child imports
only what its entry's table names. Entries:

* ``loaders.sandbox`` (this module): ``classify``, ``ingest``,
  ``ingest_checkpoint``;
* ``loaders.sql_child``: ``sql``, one read-only query (nothing preloaded: it
  sets its address-space limit before it imports duckdb; one child per query);
* ``app.sandbox_jobs``: those plus the jobs of ``app`` (the analysis, the
  Inspector's spectra, ties and attention maps, ``info``, the what-if
  conversion, a batch task's body).

Layering: ``loaders`` never names ``app``. The runner here takes the entry as
a module object (``Sandbox(app.sandbox_jobs)``): ``app`` hands its own table
down, and the child started for it runs ``python -m app.sandbox_jobs``, whose
``__main__`` calls ``serve`` of this module. ``analysis`` stays pure: its
functions are called by the jobs, never started as processes.

**Budgets.** Before each job the child lowers its own limit on private
writable memory (``RLIMIT_DATA``: heap, anonymous and private writable
mappings, thread stacks; ``VmData``) to what it already holds (the
interpreter and ``PRELOAD``: about 0.3 GB with a CPU build of torch) plus
``QKVSCOPE_PARSE_MEMORY_MB`` MiB plus the file's size (a file mapped
copy-on-write counts toward it): the budget is for the file, never spent on
the child's own start. Address space that is only reserved does not count
(per-thread malloc arenas, the CUDA driver's reservations): it grows with the
machine's cores, so an address-space limit (``RLIMIT_AS``) fails good files
on 16 cores (docs/security.md, "The reading child process"; the figures are in
``tests/hostile/test_sandbox.py::test_the_budget_does_not_shrink_with_the_machines_cores``).
The SQL job adds an address-space limit of its own before it imports duckdb
(``loaders.sql_child``): DuckDB's string heaps are not private writable
mappings it counts. The parent waits at most ``QKVSCOPE_PARSE_TIMEOUT_S``
seconds (or the budget a caller names, or a number of seconds) for the
answer and then kills the child. What fails becomes one line naming the file:

* an allocation over the limit (``MemoryError``, torch's ``can't allocate
  memory``): ``PATH: reading it needed more than 4.0 GiB of memory (limit
  QKVSCOPE_PARSE_MEMORY_MB=4,096 plus the file's size; ...)``, and the same
  child goes on with the next job;
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
  status. The next job gets a fresh child.

Callers that make many small requests (the Inspector's spectra, ties and
attention maps; batch tasks) take a child from ``POOL`` instead of starting
one each time (a start costs 2-3 s of imports): ``call(..., pooled=True)``.
``ingest_paths`` and ``ingest_checkpoint`` borrow one from ``POOL`` too unless
given a ``Sandbox``: ``analyze PATH`` ingests and then analyses in one child.

Ingest: the child runs ``loaders.ingest.ingest_file`` for one path, which
stores that file in one DuckDB transaction; a child that dies part-way
leaves no row of it (a transaction that never committed is discarded, the
guarantee ``tests/faults/test_kill.py`` checks with ``kill -9``), and the
parent links checkpoints to runs at the end. The parent never parses the
file: it only walks folders (``lstat``), sends paths and reads JSON answers
(never a pickle).

**The protocol** is one JSON line each way: ``{"job": NAME, "path": PATH,
"limit": BYTES, "imports": [MODULE, ...], "kwargs": {...}}`` on the child's stdin (``imports``:
modules of the entry's ``ON_DEMAND`` the child imports before the job's limit, the checkpoint
readers, which a log's ingest does without); ``{"taken": true}`` as soon as the child has read
it and made those imports (a kept child that died idle never writes it, so the
job goes to a fresh child instead of being blamed for the death), then ``{"ok": true,
"result": ..., "payload": N}`` followed by ``N`` raw bytes (only a job that
returns ``WithPayload``: the SQL result as an Arrow IPC stream), or ``{"ok":
false, "message": "PATH: what", "file": PATH, "problem": TEXT, "store":
CLASS, "refused": bool}`` on its stdout (whatever a library prints goes to
stderr, so it cannot break a line). The child's first line is ``{"ready":
true}``, written once ``PRELOAD`` is imported.
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
from types import ModuleType
from typing import Callable, Iterable, NamedTuple

from loaders.budgets import budget, memory_exceeded, memory_limit_bytes, time_exceeded
from loaders.bundled import in_checkout
from loaders.errors import DatabaseBusyError, FileError, QkvscopeError, StoreError

ROOT = Path(__file__).resolve().parents[1]
Progress = Callable[[int, int, str], None]  # (done, total, current path)

#: The jobs a child started for this module runs: name -> (module, function), literals only.
JOBS: dict[str, tuple[str, str]] = {
    "classify": ("loaders.sandbox", "classify"),
    "ingest": ("loaders.sandbox", "ingest"),
    "ingest_checkpoint": ("loaders.sandbox", "ingest_one_checkpoint"),
}
#: What a child of this module imports before its first request: the log readers and the walk
#: (pandas, duckdb).
PRELOAD: tuple[str, ...] = ("loaders.ingest", "loaders.logs.ingest", "loaders.logs.registry")
#: What a request may have its child import before the job's memory limit is set (its
#: ``imports``): the checkpoint readers. They bring torch (about 120 MiB of the child's memory and
#: 1.3 CPU-s to import), which a log's ingest never uses, so a child imports them at the first
#: request that reads a checkpoint (``readers_for``), never under that file's budget.
ON_DEMAND: tuple[str, ...] = ("loaders.checkpoints",)
#: Suffixes of files that torch reads (a checkpoint, or a log saved as a tensor).
_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def readers_for(path: str | Path, kind: str | None = None) -> tuple[str, ...]:
    """The ``imports`` of a request on ``path``: ``ON_DEMAND`` for a checkpoint (``kind``, as
    ``classify`` found it) or a file torch reads, else none."""
    return ON_DEMAND if kind == "checkpoint" or Path(path).suffix.lower() in _TORCH_SUFFIXES else ()


class WithPayload(NamedTuple):
    """A job's result with raw bytes sent after its JSON line (an Arrow IPC stream)."""
    result: object
    payload: bytes


class SandboxRefused(QkvscopeError):
    """A job name outside the sandbox's table."""


def refusal(name: str, jobs: Iterable[str]) -> str:
    """The one line for a job name outside the table ``jobs``."""
    return f"the sandbox runs only the jobs of its table ({', '.join(sorted(jobs))}); {name!r} is not one"


def import_refusal(imports: Iterable[str], allowed: Iterable[str]) -> str:
    """The one line for a request asking its child to import a module outside ``allowed``."""
    outside = [m for m in imports if m not in allowed]
    return (f"the sandbox imports on request only {', '.join(sorted(allowed)) or 'nothing'}; "
            f"{outside[0]!r} is not one")


class Died(Exception):
    """The child ended while running a job (``rc``: its exit status, negative for a signal)."""

    def __init__(self, rc: int):
        super().__init__(f"exit status {rc}")
        self.rc = rc


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
    """Starts every child from one thread that lives as long as this process.

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
                self._thread = threading.Thread(target=self._serve, name="qkvscope-sandbox-spawner", daemon=True)
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


class Sandbox:
    """One child process running the jobs of ``entry`` (a module with ``JOBS`` and ``PRELOAD``;
    default this one) for this process; see the module docstring.

    Use as a context manager (the child ends with it); a child that dies or
    runs out of time is replaced at the next request. Not shared between
    threads: each caller (a page run, a CLI command) makes its own.
    ``stderr``: ``subprocess.PIPE`` keeps what the child prints (``stderr_tail``) instead
    of passing it to this process's stderr.
    """

    def __init__(self, entry: ModuleType | None = None, *, stderr=None) -> None:
        self.entry = entry if entry is not None else sys.modules[__name__]
        self.jobs: dict[str, tuple[str, str]] = dict(self.entry.JOBS)
        self._stderr = stderr
        self._tail = b""
        self._drainer: threading.Thread | None = None
        self._proc: subprocess.Popen | None = None
        self._buf = bytearray()         # what the child sent and no answer has taken yet

    def __enter__(self) -> "Sandbox":
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

    @property
    def stderr_tail(self) -> str:
        """The last few KB the child printed on stderr (with ``stderr=subprocess.PIPE``)."""
        if self._drainer is not None:
            self._drainer.join(2)                # what a child that ended printed last
        return self._tail.decode(errors="replace")

    def _drain(self, pipe) -> None:
        for chunk in iter(lambda: pipe.read1(1 << 14), b""):
            self._tail = (self._tail + chunk)[-4096:]

    def _start(self) -> subprocess.Popen:
        # A checkout's packages are found through PYTHONPATH (-P below drops the working directory);
        # installed ones are on the interpreter's own path.
        env = dict(os.environ, QKVSCOPE_PARSE_PARENT=str(os.getpid()), PYTHONPATH=os.pathsep.join(
            [*([str(ROOT)] if in_checkout() else []), *filter(None, [os.environ.get("PYTHONPATH")])]))
        # pyarrow's default pool (mimalloc) reserves a 1 GiB arena at its first use (pandas' string
        # columns), and a child's data limit is what it holds plus the file's budget: the first
        # analysis of a small checkpoint would fail under a 1 GiB budget. glibc's malloc, as the
        # server uses (app/commands/serve.py), reserves nothing ahead.
        env.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
        self._buf, self._tail = bytearray(), b""
        # -P: the caller's working directory (relative paths are its) is not on sys.path.
        # Started by _SPAWNER's thread: the child dies with this process, not with the calling thread.
        self._proc = _SPAWNER.popen([sys.executable, "-P", "-m", self.entry.__name__], env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr)
        if self._stderr == subprocess.PIPE:
            self._drainer = threading.Thread(target=self._drain, args=(self._proc.stderr,), daemon=True)
            self._drainer.start()
        # The child imports PRELOAD (torch, duckdb) before it says ready: a busy machine's
        # slow start is not counted against the first job's time limit.
        try:
            ready = self._readline(self._start_deadline())
        except TimeoutError:
            ready = None
        if ready != b'{"ready": true}':
            rc = self._kill()
            why = (" (exit status 127: out of address space while loading its libraries; this process "
                   "runs under an address-space limit of its own, ulimit -v, too low for torch)"
                   if rc == GLIBC_OUT_OF_MEMORY else f" (exit status {rc})")
            raise QkvscopeError(f"the process that reads files did not start{why}")
        return self._proc

    @staticmethod
    def _start_deadline() -> float:
        """When a child's start (or a request's imports) is given up: its imports are not the
        file's, so not under the file's time budget, but not unbounded either."""
        return time.monotonic() + max(300, budget("QKVSCOPE_PARSE_TIMEOUT_S"))

    def _kill(self) -> int:
        proc, self._proc = self._proc, None
        proc.kill()
        return proc.wait()

    def _reap(self) -> int:
        """The exit status of a child whose stdout closed: its own, when it ends within a moment
        (a SIGKILL sent here would read as the out-of-memory killer's), else killed."""
        try:
            rc = self._proc.wait(2)
        except subprocess.TimeoutExpired:
            return self._kill()
        self._proc = None
        return rc

    def _fill(self, deadline: float, enough: Callable[[], bool]) -> bool:
        """Read until ``enough()``; False at EOF, ``TimeoutError`` past ``deadline``. The buffer
        is a ``bytearray`` grown in place: a payload of N bytes arrives in pipe-sized chunks, and
        ``bytes`` concatenation would copy it N / 64 KiB times (a 60 MB SQL result: 17 s of CPU)."""
        fd = self._proc.stdout.fileno()
        while not enough():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return False
            self._buf += chunk
        return True

    def _readline(self, deadline: float) -> bytes | None:
        """The child's next answer line, or None at EOF; ``TimeoutError`` past ``deadline``."""
        if not self._fill(deadline, lambda: b"\n" in self._buf):
            return None
        end = self._buf.index(b"\n")
        line = bytes(self._buf[:end])
        del self._buf[:end + 1]
        return line

    def _read(self, n: int, deadline: float) -> bytes | None:
        if not self._fill(deadline, lambda: len(self._buf) >= n):
            return None
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def exchange(self, job: str, path: str | Path, *, limit: int, seconds: float,
                 imports: Iterable[str] = (), **kwargs) -> tuple[dict, bytes | None]:
        """Send one job and return the child's reply and its payload (None when it sent none).
        ``SandboxRefused`` for a name outside the table; ``TimeoutError`` past ``seconds`` (the
        child killed); ``Died`` when the child ended while it held the job.

        The child acknowledges each request before it runs it. A kept child that ended while it
        was idle (killed by the system or a user; not yet reaped, so ``poll()`` could not tell)
        never acknowledges: the job goes to a fresh child, instead of being reported as
        having killed its reader. The child imports ``imports`` (modules of its entry's
        ``ON_DEMAND``) before it acknowledges: the job's ``seconds`` start at the acknowledgement,
        so a busy machine's slow import is not counted against the job (as with the start)."""
        if job not in self.jobs:
            raise SandboxRefused(refusal(job, self.jobs))
        imports = list(imports)
        allowed = getattr(self.entry, "ON_DEMAND", ())
        if any(m not in allowed for m in imports):
            raise SandboxRefused(import_refusal(imports, allowed))
        line = json.dumps({"job": job, "path": str(path), "limit": int(limit), "imports": imports,
                           "kwargs": kwargs}) + "\n"
        for attempt in (0, 1):
            reused = self._proc is not None and self._proc.poll() is None
            if not reused:
                self._proc = self._start()
            try:
                self._proc.stdin.write(line.encode())
                self._proc.stdin.flush()
                taken = self._readline(self._start_deadline()) is not None
                deadline = time.monotonic() + seconds
                reply = None
                if taken:
                    answer = self._readline(deadline)
                    reply = None if answer is None else json.loads(answer)
                payload = None
                if reply is not None and reply.get("payload") is not None:
                    payload = self._read(int(reply["payload"]), deadline)
                    if payload is None:
                        reply = None
            except TimeoutError:
                self._kill()
                raise
            except BrokenPipeError:
                taken, reply = False, None
            if reply is None:
                rc = self._reap()
                if not taken and reused and attempt == 0:
                    continue                    # it had died idle: the job was never run
                raise Died(rc)                  # the child died while running the job
            if reply.get("refused"):
                raise SandboxRefused(reply["message"])
            return reply, payload
        raise AssertionError("unreachable")

    def request(self, path: str | Path, job: str, *, timeout: str = "QKVSCOPE_PARSE_TIMEOUT_S", **kwargs):
        """Run ``job`` on ``path`` in the child and return its result; a failure
        raises ``FileError(path, problem)`` (``StoreError``s keep their class).
        ``timeout`` names the time budget (analyses have their own, longer one)."""
        limit = memory_limit_bytes(reading_size(path))
        try:
            reply, _ = self.exchange(job, path, limit=limit, seconds=budget(timeout), **kwargs)
        except TimeoutError:
            raise FileError(path, time_exceeded(timeout, "analysing" if "ANALYSIS" in timeout else "reading")) from None
        except Died as exc:
            raise FileError(path, _death(exc.rc, limit)) from None
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

    def ingest_file(self, store, path: Path, kind: str = "unknown") -> list:
        """``loaders.ingest.ingest_file`` in the child: every outcome is a report
        (``kind``, from ``kind_of``, labels the report of a child that died)."""
        from loaders.report import FileReport  # here: the runner module stays light (the SQL child imports it)

        try:
            return [FileReport(**r) for r in self.request(path, "ingest", db=str(store.path),
                                                           busy_timeout=store.busy_timeout,
                                                           imports=readers_for(path, kind))]
        except StoreError:
            raise
        except FileError as exc:
            return [FileReport(str(path), kind if kind in ("log", "checkpoint") else "unknown", "error",
                               reason=str(exc))]

    def kind_of(self, path: Path) -> str:
        """'log', 'checkpoint', ... as ``loaders.ingest`` classifies it ('unknown' on failure)."""
        try:
            return self.request(path, "classify", imports=readers_for(path))
        except FileError:
            return "unknown"       # ingest_file reports it in its turn


def ingest_paths(store, paths: Iterable[str | Path], *, progress: Progress | None = None,
                 reader: Sandbox | None = None, project: str | None = None):
    """``loaders.ingest.ingest_paths`` (the same walk, order, projects and final linking) with
    each file classified, read and stored by the child: a file that kills or stalls the child
    is one ``error`` report and the next file gets a fresh child. ``reader`` None: an idle
    child of ``POOL``.
    """
    from loaders import ingest as _ingest  # here: the walk is ingest's; this module stays light for the SQL child

    with _lent(reader) as reader:
        return _ingest.ingest_paths(store, paths, progress=progress, project=project, kind_of=reader.kind_of,
                                   ingest_one=reader.ingest_file)


def ingest_checkpoint(store, path: str | Path, *, reader: Sandbox | None = None):
    """``loaders.ingest.ingest_checkpoint`` in a child (the Inspector's upload and
    path field, ``analyze PATH``): its report, or ``FileError`` with the one-line
    problem. ``reader`` None: an idle child of ``POOL``."""
    from loaders.report import FileReport  # here: the runner module stays light (the SQL child imports it)

    with _lent(reader) as reader:
        return FileReport(**reader.request(path, "ingest_checkpoint", db=str(store.path),
                                           busy_timeout=store.busy_timeout, imports=ON_DEMAND))


@contextmanager
def _lent(reader: Sandbox | None):
    """``reader`` itself, or one lent by ``POOL`` for the block (a child's start costs 2-3 s
    of imports; a child that died or stalled is replaced at its next request either way)."""
    if reader is not None:
        yield reader
        return
    with POOL.reader() as lent:
        yield lent


def watch(store, paths: Iterable[str | Path], *, interval: float = 2.0,
          on_report=None, on_busy=None, stop: Callable[[], bool] | None = None,
          project: str | None = None) -> None:
    """``loaders.ingest.watch`` (its polling loop) with one child kept across polls; ``project``
    as ``ingest_paths`` takes it."""
    from loaders.ingest import watch as poll  # here: ingest's polling loop, only when watching

    with Sandbox() as reader:
        poll(store, paths, interval=interval, on_report=on_report, on_busy=on_busy, stop=stop,
             ingest=lambda store, paths: ingest_paths(store, paths, reader=reader, project=project))


class SandboxPool:
    """Idle children kept for callers that make many small requests (the Inspector's
    spectra for each layer and head a user picks, one batch task after another).

    ``with POOL.reader(entry) as r:`` lends an idle child of ``entry`` (or a new ``Sandbox``)
    to one caller at a time and takes it back afterwards, keeping at most ``keep`` idle.
    A child started under other budgets (the ``QKVSCOPE_*`` environment it
    inherited, ``QKVSCOPE_DB`` aside) is closed instead of lent: budgets are read
    from the environment by the child's readers. A child that died or timed out
    is replaced by its ``Sandbox`` at the next request. Thread-safe; each child is
    still used by one thread at a time.
    """

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self._idle: list[tuple[tuple, Sandbox]] = []
        self._lock = threading.Lock()

    @staticmethod
    def _key(entry: ModuleType | None) -> tuple:
        name = (entry or sys.modules[__name__]).__name__
        return (name, *sorted((k, v) for k, v in os.environ.items()
                              if k.startswith("QKVSCOPE_") and k not in ("QKVSCOPE_DB", "QKVSCOPE_PARSE_PARENT")))

    @contextmanager
    def reader(self, entry: ModuleType | None = None):
        key = self._key(entry)
        stale: list[Sandbox] = []
        lent = None
        with self._lock:
            keep = []
            for k, r in self._idle:
                if k == key and lent is None:
                    lent = r
                elif k[0] == key[0]:
                    stale.append(r)           # the same entry under other budgets
                else:
                    keep.append((k, r))
            self._idle = keep
        for r in stale:
            r.close()
        lent = lent or Sandbox(entry)
        try:
            yield lent
        finally:
            with self._lock:
                kept = len(self._idle) < self.keep and lent.pid is not None
                if kept:
                    self._idle.append((key, lent))
            if not kept:
                lent.close()

    def close(self) -> None:
        """End every idle child (at exit, or a test that wants a fresh start)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for _, r in idle:
            r.close()


#: The process-wide pool (``call(..., pooled=True)``); its children end with this process.
POOL = SandboxPool()
atexit.register(POOL.close)


def call(job: str, path: str | Path, *, entry: ModuleType | None = None,
         timeout: str = "QKVSCOPE_PARSE_TIMEOUT_S", pooled: bool = False, **kwargs):
    """The job named ``job`` of ``entry``'s table (default this module's) run on ``path`` (and the
    JSON-able ``kwargs``) in a child, under the memory budget and the time budget ``timeout``;
    its result must be JSON-able. ``pooled``: in an idle child of ``POOL`` (started once,
    reused) instead of a new one."""
    with (POOL.reader(entry) if pooled else Sandbox(entry)) as box:
        return box.request(path, job, timeout=timeout, **kwargs)


# -- the jobs of this module ------------------------------------------------

def classify(path: str) -> str:
    from loaders.ingest import _classify  # here: runs in the reading child only

    return _classify(Path(path))[0]


def ingest(path: str, *, db: str, busy_timeout: float) -> list[dict]:
    from loaders.ingest import ingest_file  # here: runs in the reading child only
    from loaders.store import Store

    return [r.to_json() for r in ingest_file(Store(db, busy_timeout=busy_timeout), Path(path))]


def ingest_one_checkpoint(path: str, *, db: str, busy_timeout: float) -> dict:
    from loaders.ingest import ingest_checkpoint as ingest_one  # here: runs in the reading child only
    from loaders.store import Store

    return ingest_one(Store(db, busy_timeout=busy_timeout), Path(path)).to_json()


# -- the child -------------------------------------------------------------

def _resolve(jobs: dict[str, tuple[str, str]], name: str):
    """The function of job ``name`` from the table (the only import a request can cause)."""
    import importlib  # here: the child imports only the module its own table names

    module, function = jobs[name]
    return getattr(importlib.import_module(module), function)


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


def serve(jobs: dict[str, tuple[str, str]], preload: Iterable[str] = (), on_demand: Iterable[str] = ()) -> int:
    """The child's loop (an entry's ``__main__``): import ``preload``, say ready, then for each
    request import what it asks of ``on_demand``, acknowledge it and run its job from ``jobs``
    under the memory limit, until stdin closes."""
    import importlib
    import resource  # here: the child only

    from loaders.filecheck import failure, out_of_memory

    _die_with_parent()
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)                                # a library's print() cannot break a line
    for module in preload:                       # the readers, before any limit
        importlib.import_module(module)
    answers.write(b'{"ready": true}\n')
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    on_demand = tuple(on_demand)
    for line in sys.stdin:
        req = json.loads(line)
        imports = [str(m) for m in req.get("imports") or ()]
        allowed = all(m in on_demand for m in imports)
        for module in imports if allowed else ():    # before the limit: the readers are not the file's
            importlib.import_module(module)
        answers.write(b'{"taken": true}\n')    # the parent tells a child that died idle by its absence
        payload = b""
        if req.get("job") not in jobs or not allowed:
            message = (refusal(str(req.get("job")), jobs) if req.get("job") not in jobs
                       else import_refusal(imports, on_demand))
            answers.write(json.dumps({"ok": False, "refused": True, "message": message}).encode() + b"\n")
            continue
        held = data_held()
        cap = held + int(req["limit"])                  # the budget is for the file, on top of what is held
        # for readers that word their own out-of-memory line from the soft limit (loaders.filecheck):
        # the part of it that is not the file's budget
        os.environ["QKVSCOPE_PARSE_HELD_BYTES"] = str(held)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
        try:
            result = _resolve(jobs, req["job"])(req["path"], **(req.get("kwargs") or {}))
            reply = {"ok": True, "result": result}
            # a WithPayload (compared by its fields: this module may run as __main__ beside its import)
            if isinstance(result, tuple) and getattr(result, "_fields", None) == WithPayload._fields:
                reply, payload = {"ok": True, "result": result.result, "payload": len(result.payload)}, result.payload
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
        answers.write(json.dumps(reply, default=str).encode() + b"\n" + payload)
    return 0


if __name__ == "__main__":
    sys.exit(serve(JOBS, PRELOAD, ON_DEMAND))
