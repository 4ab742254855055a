"""``python -m app ARGS`` in a process forked from one that imported the CLI once.

A test that runs the command line many times (kills at random moments, one hostile file after
the other) pays the interpreter start and the imports (torch, duckdb, pandas, the loaders: 2-4 s
a command on two busy cores) once: ``ForkedCli`` starts one driver process that imports them and
then forks one process per command. Each command still runs in a process of its own, with its
own stdout and stderr (files, so the output of the processes it starts is caught as well), its
exit status, the environment and the text on stdin it is given (else ``/dev/null``) and the
limits the driver was started under (``preexec_fn``, e.g. ``RLIMIT_AS``), and is the process a
test kills.
"""
from __future__ import annotations

import json
import os
import resource
import select
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_DRIVER = """
import json, os, sys
sys.path.insert(0, {root!r})
import torch, duckdb, pandas
from tests.forked_cli import run_command
import loaders.ingest, loaders.checkpoints, loaders.logs, loaders.sources, app.jobs
from app.cli import command_module
for name in ("ingest", "info", "analyze"):
    command_module(name)
print("ready", flush=True)
while line := sys.stdin.readline():
    argv, env, inp, out, err = json.loads(line)
    pid = os.fork()
    if pid == 0:
        run_command(argv, env, inp, out, err)
    print(pid, flush=True)
    sys.stdin.readline()        # reaped only when asked: until then its pid is not reused, a kill lands
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


def run_command(argv: list[str], env: dict, inp: str | None, out: str, err: str, reap: bool = False) -> None:
    """In a process just forked from a driver that imported the CLI: ``python -m app ARGV`` as
    the interpreter runs it, then ``os._exit`` with its exit status. stdin is the file ``inp``
    (else ``/dev/null``, never the driver's pipe of commands), stdout and stderr the files ``out``
    and ``err``. ``reap``: the reading child is closed and waited for, as at an interpreter's exit
    (a measure of the command's peak memory counts it only so); otherwise it ends with the command
    (``PR_SET_PDEATHSIG``), without finishing a prestart's imports first."""
    from app.cli import main
    from loaders.sandbox import POOL

    os.dup2(os.open(inp or os.devnull, os.O_RDONLY), 0)
    sys.stdin = open(0, closefd=False)
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    os.environ.update(env)
    rc = 1
    try:
        rc = main(argv) or 0
    except SystemExit as exc:                       # what the interpreter makes of it
        rc = exc.code or 0
        if not isinstance(rc, int):
            print(rc, file=sys.stderr)
            rc = 1
    except BaseException:
        traceback.print_exc()
    finally:
        if reap:
            POOL.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(rc))


class ForkedCli:
    """``start(*argv)`` forks ``python -m app ARGV`` and returns its pid; ``wait()`` its
    ``CompletedProcess`` (returncode negative: the signal that ended it); ``run`` both."""

    def __init__(self, folder: Path, preexec_fn=None):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        script = self.folder / "forked_cli_driver.py"
        script.write_text(_DRIVER.format(root=str(ROOT)))
        self.proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, preexec_fn=preexec_fn,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert self.proc.stdout.readline().strip() == "ready"
        self.runs = 0
        self.pid: int | None = None

    def _send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def start(self, *argv: str, env: dict | None = None, input: str | None = None) -> int:
        self.runs += 1
        self.argv = list(argv)
        self.out, self.err, inp = (self.folder / f"run-{self.runs}.{n}" for n in ("out", "err", "in"))
        if input is not None:
            inp.write_text(input)
        self._send(json.dumps([self.argv, env or {}, None if input is None else str(inp),
                               str(self.out), str(self.err)]))
        self.pid = int(self.proc.stdout.readline())
        return self.pid

    def wait(self, timeout: float | None = None, text: bool = True) -> subprocess.CompletedProcess:
        """The run's exit status and output (``text`` False: bytes, for names that are not UTF-8);
        past ``timeout`` seconds it is killed and ``TimeoutExpired`` raised."""
        self._send("wait")
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:                                    # not reaped yet: the pid is still its own
            os.kill(self.pid, signal.SIGKILL)
        rc = int(self.proc.stdout.readline())
        if not ready:
            raise subprocess.TimeoutExpired(self.argv, timeout)
        read = (lambda p: p.read_text()) if text else (lambda p: p.read_bytes())
        return subprocess.CompletedProcess(self.argv, rc, read(self.out), read(self.err))

    def run(self, *argv: str, env: dict | None = None, timeout: float | None = None,
            text: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        self.start(*argv, env=env, input=input)
        return self.wait(timeout, text)

    def timed(self, *argv: str, env: dict | None = None,
              timeout: float | None = None) -> tuple[subprocess.CompletedProcess, float]:
        """``run``, and its seconds from the fork to the exit status."""
        t0 = time.monotonic()
        proc = self.run(*argv, env=env, timeout=timeout)
        return proc, time.monotonic() - t0

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def address_space(limit: int):
    """A ``preexec_fn`` that caps the driver's address space (``RLIMIT_AS``) at ``limit`` bytes;
    the commands forked from it inherit the cap."""
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


def module_driver(drivers: list[ForkedCli], tmp_path_factory, preexec_fn=None):
    """The body of a module-scoped fixture: one driver for the module's tests, kept on
    ``drivers`` (the module's own list, so its helpers reach it) and closed afterwards."""
    drivers.append(ForkedCli(tmp_path_factory.mktemp("cli"), preexec_fn=preexec_fn))
    try:
        yield drivers[-1]
    finally:
        drivers.pop().close()
