"""The net under every budget: untrusted files are read in the sandbox's child process
(``loaders/sandbox.py``) with a memory limit (RLIMIT_DATA) and a time limit, running only
the jobs of its table.

First the mechanism, with functions that behave like bombs
(``tests/hostile/parse_targets.py``): memory, time, a memory-mapped file
truncated mid-read (SIGBUS). Then real files through the CLI, with the
specific budget that would catch them switched off so that only the net is
left: one line, exit 2, the other files of the folder stored, the database
unchanged by the bomb.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from loaders.errors import FileError
from loaders.sandbox import Sandbox, reading_size
from tests.hostile import light_targets, parse_targets
from tests.hostile.test_bombs import digest, gpt2_state, one_error_line, st_header

ROOT = Path(__file__).resolve().parents[2]
call = parse_targets.call


def test_an_allocation_over_the_limit_is_one_line_and_the_child_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("QKVSCOPE_PARSE_MEMORY_MB", "1024")
    f = tmp_path / "bomb.bin"
    f.write_bytes(b"x" * 1000)
    with Sandbox(parse_targets) as reader:
        with pytest.raises(FileError) as err:
            reader.request(f, "grow")
        first = reader.pid
        assert reader.request(f, "pid") == first     # same process, still usable
    limit_gib = ((1024 << 20) + reading_size(f)) / (1 << 30)     # the budget plus what the file holds
    assert str(err.value) == (
        f"{f}: reading it needed more than {limit_gib:.1f} GiB of memory (limit "
        f"QKVSCOPE_PARSE_MEMORY_MB=1,024 plus the file's size; set it in the environment to raise it)")
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"largest child peak RSS so far {peak_mib:.0f} MiB (this one under a 1 GiB memory limit)")


def test_the_budget_is_for_the_file_not_the_childs_own_imports(tmp_path, monkeypatch):
    """Before: the limit was the whole address space, and the child holds ~0.9 GB after importing
    torch and the readers, so a 1 GiB budget failed every file and 1.5 GiB every analysis (glibc
    exit 127, "cannot allocate memory for thread-local data"). Now the budget is on top of what the
    child holds when the file's request starts: 256 MiB lets a 128 MiB read through, not 512 MiB.
    Exit status 127 (glibc out of address space) is the memory line naming the budget."""
    monkeypatch.setenv("QKVSCOPE_PARSE_MEMORY_MB", "256")
    f = tmp_path / "f.bin"
    f.write_bytes(b"x")
    limit = "reading it needed more than 0.3 GiB of memory (limit QKVSCOPE_PARSE_MEMORY_MB=256 plus the file's size"
    with Sandbox(parse_targets) as reader:
        assert reader.request(f, "allocate", mib=128) == 128 << 20
        with pytest.raises(FileError) as err:
            reader.request(f, "allocate", mib=512)
        assert str(err.value).startswith(f"{f}: {limit}")
        with pytest.raises(FileError) as err:
            reader.request(f, "glibc_gives_up")
    assert str(err.value) == (f"{f}: {limit}; set it in the environment to raise it) [the reading process could "
                              "not start a thread or load a library within its limit: exit status 127]")


@pytest.mark.slow
def test_the_budget_does_not_shrink_with_the_machines_cores(tmp_path, monkeypatch, capsys):
    """The limit counts memory (RLIMIT_DATA), not address space: each thread of torch and
    DuckDB reserves a glibc malloc arena of 64 MiB (up to 8 per core), which an address-space
    limit counted. Emulating 16 cores (16 torch threads, glibc's 128 arenas), ``analyze`` of a
    small ``transformers`` Llama under a 512 MiB budget failed (DuckDB "Out of Memory Error:
    Allocation failure", as on a 16-core GPU machine at the default 4 GiB) where 2 threads
    passed. Ingesting a 0.4 GB checkpoint grew the address space by 0.9 GB on 2 threads and
    2.9 GB on 16, its VmData by 0.07 and 0.24 GB. Allocating past the budget still fails."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path / "llama"
    torch.manual_seed(0)
    # the arenas are per thread, not per weight: a model of d_model 64 asks what one of 256 does
    LlamaForCausalLM(LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, intermediate_size=128, vocab_size=256)
                     ).save_pretrained(folder, safe_serialization=True)
    from app.cli import main
    from loaders.sandbox import POOL

    for k, v in {"QKVSCOPE_PARSE_MEMORY_MB": "512", "OMP_NUM_THREADS": "16", "MALLOC_ARENA_MAX": "128"}.items():
        monkeypatch.setenv(k, v)                                 # the children inherit them
    # `analyze` through the CLI's entry point in this process: the file is ingested and analysed in
    # the reading child, started here under those settings (none pooled from before: the pool's
    # key is the budgets, not the thread counts)
    POOL.close()
    try:
        assert main(["analyze", str(folder), "--db", str(tmp_path / "q.duckdb"), "--json"]) == 0
    finally:
        POOL.close()
    assert len(json.loads(capsys.readouterr().out)["metrics"]) > 100
    f = tmp_path / "bomb.bin"
    f.write_bytes(b"x")
    with Sandbox(parse_targets) as reader, pytest.raises(FileError) as err:
        reader.request(f, "allocate", mib=1024)
    assert "reading it needed more than 0.5 GiB of memory (limit QKVSCOPE_PARSE_MEMORY_MB=512" in str(err.value)


@pytest.mark.slow
def test_past_the_time_limit_the_child_is_killed_and_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("QKVSCOPE_PARSE_TIMEOUT_S", "3")
    f = tmp_path / "stall.bin"
    f.write_bytes(b"x")
    with Sandbox(light_targets) as reader:
        reader.request(f, "pid")        # the child's imports are not timed below
        first = reader.pid
        t0 = time.monotonic()
        with pytest.raises(FileError) as err:
            reader.request(f, "stall")
        took = time.monotonic() - t0
        assert reader.request(f, "pid") != first
    assert str(err.value) == (f"{f}: reading it took more than 3 s (limit QKVSCOPE_PARSE_TIMEOUT_S; "
                              f"set it in the environment to raise it)")
    assert took >= 3                                  # stall() never returns: it was killed


def test_a_memory_mapped_checkpoint_truncated_mid_read_is_one_line_not_a_bus_error(tmp_path):
    """Before: ``info`` on a ``ckpt.pt`` a training run rewrote: "Bus error", exit 135."""
    f = tmp_path / "ckpt.pt"
    torch.save({"w": torch.ones(1 << 20)}, f)
    with pytest.raises(FileError) as err:
        call("read_while_truncated", f)
    assert str(err.value) == (f"{f}: changed while it was read (bus error: a memory-mapped file was "
                              f"truncated or rewritten); read it again once it is written")


def test_the_limit_counts_what_a_file_holds_not_its_holes(tmp_path):
    dense = tmp_path / "dense.bin"
    dense.write_bytes(b"\x01" * (1 << 20))
    sparse = tmp_path / "sparse.bin"
    with open(sparse, "wb") as fh:
        fh.truncate(1 << 34)                                  # 16 GiB of hole
    assert reading_size(dense) == 1 << 20
    assert reading_size(sparse) < 1 << 20
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"\x01" * 8192)
    (folder / "b.bin").write_bytes(b"\x01" * 8192)
    assert reading_size(folder) == 16384


_MEASURING = r"""
import json, os, resource, sys, time
import torch, duckdb, pandas
from app.cli import command_module
from tests.forked_cli import run_command
for name in ("ingest", "info"):
    command_module(name)
print("ready", flush=True)
while line := sys.stdin.readline():
    argv, env, out, err, peak = json.loads(line)
    t0 = time.monotonic()
    x = os.fork()
    if x == 0:                      # X forks the command and reads the peak RSS of it and its children
        y = os.fork()
        if y == 0:
            run_command(argv, env, None, out, err, reap=True)
        rc = os.waitstatus_to_exitcode(os.waitpid(y, 0)[1])
        with open(peak, "w") as fh:
            json.dump([rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss], fh)
        os._exit(0)
    os.waitpid(x, 0)
    print(json.dumps(time.monotonic() - t0), flush=True)
"""
_MEASURER: list[subprocess.Popen] = []


@pytest.fixture(scope="module")
def measuring(tmp_path_factory):
    """One process that imported the CLI (no address-space limit of its own); ``measured``
    forks each command from it (the imports paid once, as in tests/forked_cli.py)."""
    proc = subprocess.Popen([sys.executable, "-c", _MEASURING], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "ready"
    _MEASURER.append(proc)
    yield tmp_path_factory.mktemp("measured")
    _MEASURER.remove(proc)
    proc.stdin.close()
    proc.wait(60)


def measured(folder: Path, *args: str, env: dict) -> tuple[subprocess.CompletedProcess, float, int]:
    """``python -m app ARGS`` (forked from ``measuring``'s process) with NO outer address-space
    limit (only the reading process's own), its time, and the peak RSS in bytes of it and its
    children."""
    out, err, peak = (folder / f"run.{n}" for n in ("out", "err", "peak"))
    driver = _MEASURER[-1]
    driver.stdin.write(json.dumps([list(args), env, str(out), str(err), str(peak)]) + "\n")
    driver.stdin.flush()
    took = json.loads(driver.stdout.readline())
    rc, peak_kib = json.loads(peak.read_text())
    return subprocess.CompletedProcess(args, rc, out.read_text(), err.read_text()), took, peak_kib * 1024


#: d_model of a sparse GPT-2 whose c_attn weight is 805,306,368 bytes, over a 512 MiB budget, and
#: the whole file 3.2 GB of hole (hashing it reads 3.2 GB of zeros): tests/hostile/test_dashboard_bombs.py
SPARSE_D = 8192


def _sparse_gpt2(folder: Path, d: int = 15360, n_head: int = 96) -> Path:
    """A Hugging Face GPT-2 folder whose model.safetensors is all hole: 11 GB at the default
    d_model 15,360, whose c_attn weight needs 2,831,155,200 bytes
    (``test_bombs.test_sparse_safetensors_with_a_valid_header``)."""
    vocab = 16
    shapes = {k: list(v.shape) for k, v in gpt2_state(d=8, vocab=vocab).items()}
    shapes = {k: [d if s == 8 else 3 * d if s == 24 else 4 * d if s == 32 else s for s in shape]
              for k, shape in shapes.items()}
    head, data = st_header(shapes)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "n_layer": 1, "n_head": n_head, "n_embd": d, "vocab_size": vocab,
        "n_positions": 8}))
    p = folder / "model.safetensors"
    with open(p, "wb") as fh:
        fh.write(head)
        fh.truncate(len(head) + data)
    return p


@pytest.mark.slow
def test_a_memory_bomb_no_budget_catches_fails_its_file_only(tmp_path, measuring):
    """The sparse safetensors with its own check switched off
    (``QKVSCOPE_ALLOW_SPARSE=1``): before, one layer read whole (6 GB RSS in
    7.5 s at 27 GB); now the reading process stops at its limit (512 MiB here,
    on top of what the child holds after its imports, under the 588 MiB layer of
    d_model 7,168: a 2.5 GB file of hole, which each command hashes)
    and the folder's other files are stored."""
    root = tmp_path / "runs"
    for name in ("a_good", "c_good"):
        (root / name).mkdir(parents=True)
        (root / name / "metrics.csv").write_text("step,train_loss\n0,2.5\n1,2.4\n")
    d = 7168
    bomb = _sparse_gpt2(root / "b_bomb", d=d, n_head=64)
    layer = 4 * d * 3 * d                                     # bytes of h.0.attn.c_attn.weight
    assert layer > 512 << 20
    env = {"QKVSCOPE_ALLOW_SPARSE": "1", "QKVSCOPE_PARSE_MEMORY_MB": "512"}
    proc, took, peak = measured(measuring, "info", str(bomb.parent), env=env)
    # The pread reader turns the failed allocation into its own message.
    line = one_error_line(proc, bomb, f"safetensors tensor 'h.0.attn.c_attn.weight' needs {layer:,} "
                                      "bytes, more memory than this process may use")
    print(f"info: {took:.1f} s, peak RSS {peak / 2**30:.2f} GiB: {line}")
    assert peak < layer                                      # no process held the layer
    db = tmp_path / "db.duckdb"
    proc, took, peak = measured(measuring, "ingest", str(root), "--db", str(db), env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, (proc.stdout, proc.stderr)
    errors = [ln for ln in proc.stdout.splitlines() if ln.startswith("error")]
    assert len(errors) == 1 and str(bomb) in errors[0], proc.stdout
    assert f"needs {layer:,} bytes, more memory than this process may use" in errors[0]
    assert "2 added" in proc.stdout.splitlines()[-1], proc.stdout
    print(f"ingest: {took:.1f} s, peak RSS {peak / 2**30:.2f} GiB")
    assert peak < layer


@pytest.mark.slow
def test_a_time_bomb_no_budget_catches_leaves_the_database_unchanged(tmp_path, measuring):
    """The pickle-memo billion laughs with its item budget switched off
    (before: 9 GB after 277 s, still growing): at QKVSCOPE_PARSE_TIMEOUT_S (2 s here;
    the child's start is not timed) the reading process is killed; nothing of the file
    is stored."""
    from loaders.ingest import ingest_paths
    from loaders.store import Store
    from tests.hostile.test_bombs import _laughs

    good = tmp_path / "good"
    good.mkdir()
    (good / "metrics.csv").write_text("step,train_loss\n0,2.5\n1,2.4\n")
    db = tmp_path / "db.duckdb"
    ingest_paths(Store(db), [good])
    bomb = tmp_path / "side.pt"
    torch.save({"model": gpt2_state(), "laughs": _laughs()}, bomb)
    env = {"QKVSCOPE_SIDE_ITEMS": str(10**15), "QKVSCOPE_SIDE_BYTES": str(10**15),
           "QKVSCOPE_PARSE_TIMEOUT_S": "2"}
    before = digest(db)
    proc, took, peak = measured(measuring, "ingest", str(bomb), "--db", str(db), env=env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert f"{bomb}: reading it took more than 2 s (limit QKVSCOPE_PARSE_TIMEOUT_S" in proc.stdout
    assert digest(db) == before
    print(f"ingest: {took:.1f} s, peak RSS {peak / 2**30:.2f} GiB")


def test_the_child_dies_with_its_parent(tmp_path):
    """``kill -9`` of ``ingest`` must not leave its reading process writing on."""
    script = tmp_path / "parent.py"
    script.write_text(f"import sys, time\nsys.path.insert(0, {str(ROOT)!r})\n"
                      "from loaders.sandbox import Sandbox\nfrom tests.hostile import light_targets\n"
                      "r = Sandbox(light_targets)\nr._start()\n"
                      "print(r.pid, flush=True)\ntime.sleep(300)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{child}/stat") as fh:
            if fh.read().split(")")[-1].split()[0] == "Z":      # dead, waiting for init to reap it
                return
        time.sleep(0.1)
    os.kill(child, 9)
    raise AssertionError("the reading process outlived its parent")


def test_sizing_a_fifo_named_zip_does_not_open_it(tmp_path):
    """The parent sizes the limit from ``stat`` alone: ``open`` on a FIFO blocks for ever."""
    fifo = tmp_path / "upload.zip"
    os.mkfifo(fifo)
    assert reading_size(fifo) == 0
    import zipfile

    z = tmp_path / "small.zip"
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("model.safetensors", b"\0" * (1 << 20))
    assert reading_size(z) == 1 << 20              # what it declares, more than its few KB


def test_analyze_path_ingests_and_analyses_in_one_pooled_child(tmp_path):
    """``analyze PATH``: the checkpoint is ingested (``resolve``) and then analysed in one child
    of ``app.sandbox_jobs`` (a second start cost 2-3 s of imports); ``info`` borrows it too; a
    child killed between requests is replaced, and the store still gets the file."""
    from app import jobs
    from app.cli import main
    from loaders.sandbox import POOL, ingest_checkpoint
    from loaders.store import Store
    from tests.app.test_batch import make_checkpoints

    POOL.close()
    ckpt = make_checkpoints(tmp_path / "ckpts")[0]
    store = Store(tmp_path / "p.duckdb")
    cid = jobs.resolve(store, str(ckpt))
    [(key, child)] = POOL._idle                                           # the ingest's child, handed back
    assert key[0] == "app.sandbox_jobs"
    first = child.pid
    assert jobs.analyze(store, cid)[0].kind == "weights"
    assert [r.pid for _, r in POOL._idle] == [first]                      # the analysis ran in it
    assert main(["info", str(ckpt), "--json"]) == 0                      # `info` borrows it too
    assert [r.pid for _, r in POOL._idle] == [first]
    os.kill(first, 9)
    time.sleep(0.2)
    assert jobs.analyze(store, cid, force=True)[0].kind == "weights"      # a fresh child took over
    [(_, second)] = POOL._idle
    assert second.pid != first
    with Sandbox() as own:                                                # a caller's own child stays its own
        assert ingest_checkpoint(store, ckpt, reader=own).status == "unchanged" and own.pid != second.pid
    POOL.close()


def _until_dead(pid: int) -> None:
    """Wait until ``pid`` has ended (a zombie: dead, not yet reaped by its parent)."""
    for _ in range(500):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return
        time.sleep(0.01)
    raise AssertionError(f"{pid} did not end")


def test_a_kept_child_that_died_idle_is_replaced_and_the_job_runs_once(tmp_path):
    """A kept child killed while idle (the out-of-memory killer, a user's ``kill``) is dead before
    its parent has reaped it, and then ``poll()`` cannot tell: the next job was written to it, its
    stdout closed, and the file was reported as having needed more memory than its budget. The
    child acknowledges each request before it runs it now; without that, the job goes to a fresh
    child. A child killed *while running* a job (after the acknowledgement) is still that job's
    failure, and the job is not run again."""
    f = tmp_path / "runs.txt"
    f.write_text("")
    with Sandbox(light_targets) as box:
        first = box.request(f, "pid")
        os.kill(first, 9)
        _until_dead(first)
        box._proc.poll = lambda: None                                    # not reaped yet, as it was in CI
        second = box.request(f, "pid")
        assert second != first
        with pytest.raises(FileError) as err:
            box.request(f, "killed")
        assert "[the reading process was killed, as by the out-of-memory killer]" in str(err.value)
        assert f.read_text() == "ran\n"                                  # run once, not retried
        assert box.request(f, "pid") not in (first, second)


def test_a_job_outside_the_table_is_refused_by_the_parent_and_by_the_child(tmp_path):
    """No string names a function across the boundary: a name not in the entry's table is
    refused before anything is sent, and a child sent one anyway refuses it and goes on."""
    from loaders.sandbox import SandboxRefused

    names = ", ".join(sorted(parse_targets.JOBS))
    with Sandbox(light_targets) as box:
        with pytest.raises(SandboxRefused) as err:
            box.request(tmp_path, "os:system", command="true")
        assert str(err.value) == (f"the sandbox runs only the jobs of its table ({names}); "
                                  "'os:system' is not one")
        assert box.pid is None                                            # nothing was started for it
        first = box.request(tmp_path, "pid")
        box.jobs["os:system"] = ("os", "system")                          # a parent that lets it through
        with pytest.raises(SandboxRefused) as err:
            box.request(tmp_path, "os:system", command="true")
        assert str(err.value) == (f"the sandbox runs only the jobs of its table ({names}); "
                                  "'os:system' is not one")
        assert box.request(tmp_path, "pid") == first                      # the same child goes on


def test_a_request_may_import_only_its_entrys_on_demand_modules(tmp_path):
    """``imports`` names modules of the entry's ``ON_DEMAND`` only: another name is refused by
    the parent before anything is sent, and by a child sent one anyway, which goes on."""
    from loaders.sandbox import SandboxRefused

    with Sandbox(light_targets) as box:
        with pytest.raises(SandboxRefused) as err:
            box.request(tmp_path, "pid", imports=["os"])
        assert str(err.value) == "the sandbox imports on request only loaders.checkpoints; 'os' is not one"
        assert box.pid is None
        first = box.request(tmp_path, "pid")
        box.entry = type("Lenient", (), {"ON_DEMAND": ("os",), "__name__": "tests.hostile.light_targets"})
        with pytest.raises(SandboxRefused) as err:
            box.request(tmp_path, "pid", imports=["os"])
        assert str(err.value) == "the sandbox imports on request only loaders.checkpoints; 'os' is not one"
        assert box.request(tmp_path, "pid") == first


def test_the_checkpoint_readers_are_imported_outside_the_files_budget(tmp_path, monkeypatch):
    """torch is imported by a child at the first request that reads a checkpoint, before that
    file's memory limit is set: under a 32 MiB budget (torch holds about 120 MiB) the import goes
    through, and a log's requests never bring it in."""
    monkeypatch.setenv("QKVSCOPE_PARSE_MEMORY_MB", "32")
    with Sandbox(light_targets) as box:
        assert box.request(tmp_path, "loaded", module="torch") is False
        assert box.request(tmp_path, "loaded", module="torch", imports=["loaders.checkpoints"]) is True


def test_a_log_ingest_never_imports_torch_and_a_checkpoint_brings_it_in(tmp_path):
    """The child of ``loaders.sandbox`` preloads the log readers only: a folder of logs is
    ingested without torch (1.3 CPU-s and 120 MiB of imports a log never uses), and the first
    checkpoint of the same child imports it."""
    from loaders.sandbox import PRELOAD, ingest_paths
    from loaders.store import Store
    from tests.app.test_batch import make_checkpoints

    code = f"import sys, importlib; [importlib.import_module(m) for m in {PRELOAD!r}]; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
    logs = tmp_path / "logs" / "run1"
    logs.mkdir(parents=True)
    (logs / "metrics.csv").write_text("step,train_loss\n0,2.5\n1,2.4\n")
    store = Store(tmp_path / "p.duckdb")
    with Sandbox(light_targets) as box:
        assert [f.status for f in ingest_paths(store, [tmp_path / "logs"], reader=box).files] == ["added"]
        assert box.request(tmp_path, "loaded", module="torch") is False
        ckpt = make_checkpoints(tmp_path / "ckpts")[0]
        assert [f.status for f in ingest_paths(store, [ckpt], reader=box).files] == ["added"]
        assert box.request(tmp_path, "loaded", module="torch") is True


def test_a_child_outlives_the_thread_that_started_it(tmp_path):
    """Each Streamlit script run is a thread that ends with the run. The child asks to be killed
    when its parent dies (PR_SET_PDEATHSIG), which Linux reads as the parent *thread*: started by
    the run, the pooled child was killed once the page was drawn, and every later request (a
    head picked in the Inspector) paid a fresh start. Children are started by one long-lived
    thread now; this failed before (the second pid differed, the first child was gone)."""
    import threading

    from loaders.sandbox import POOL

    POOL.close()
    got = {}
    run = threading.Thread(target=lambda: got.update(pid=light_targets.call("pid", tmp_path, pooled=True)))
    run.start()
    run.join()
    time.sleep(0.3)                                          # the kernel's signal would have landed by now
    assert light_targets.call("pid", tmp_path, pooled=True) == got["pid"]    # the same child, not a fresh one
    with Sandbox(light_targets) as own:                                     # a Sandbox used from another thread alike
        starter = threading.Thread(target=lambda: got.update(own=own.request(tmp_path, "pid")))
        starter.start()
        starter.join()
        time.sleep(0.3)
        assert own.request(tmp_path, "pid") == got["own"]
    POOL.close()
