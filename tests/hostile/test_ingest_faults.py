"""Files and links built to hang or crash ``ingest`` and ``info``: FIFOs, devices and sockets named like checkpoints,
links out of the folder and in loops, nesting deeper than Python follows,
parser memory bombs, numbers DuckDB cannot hold, names with newlines or bytes
that are not UTF-8, files that change while they are read.

Each case is built in code beside two good logs (``a_good/``, ``z_good/``)
and run through the real CLI in a process of its own under a 4 GiB address-space
limit and a timeout: exit 2, one report line for the bad file, both good runs
stored, no traceback. Alone, the bad file leaves the database byte-identical.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch

from loaders.ingest import ingest_paths
from loaders.store import Store
from tests.forked_cli import ForkedCli, address_space, module_driver
from tests.hostile.corpus import _weights, errors_only

GOOD_LOG = "step,metric,value\n0,train_loss,4.0\n10,train_loss,3.5\n"
DEEP = 100_000
LIMIT_AS = 4 << 30


_limit = address_space(LIMIT_AS)
_CLI: list[ForkedCli] = []


@pytest.fixture(scope="module", autouse=True)
def forked_cli(tmp_path_factory):
    """One process under the address-space limit that imported the CLI; each command is forked
    from it (tests/forked_cli.py)."""
    yield from module_driver(_CLI, tmp_path_factory, _limit)


def cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m app ARGV`` under a 4 GiB address-space limit; stdout/stderr as bytes
    (a name that is not UTF-8 must survive)."""
    return _CLI[-1].run(*argv, timeout=timeout, text=False)


def digest(db: Path) -> str:
    return hashlib.sha256(db.read_bytes()).hexdigest()


def _deep_json(key: str | None = None) -> bytes:
    body = b"[" * DEEP + b"]" * DEEP
    return body if key is None else b'{"%s": ' % key.encode() + body + b"}"


def _st_bytes(header: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header)) + header + data


def _torch_zip(path: Path, pickle_bytes: bytes) -> Path:
    """A torch.save zip whose data.pkl is ``pickle_bytes`` (built by hand: the
    pickler itself recurses on deep containers)."""
    torch.save({"x": 1}, path)
    with zipfile.ZipFile(path) as zf:
        entries = [(i, zf.read(i)) for i in zf.infolist()]
    with zipfile.ZipFile(path, "w") as zf:
        for info, data in entries:
            zf.writestr(info, pickle_bytes if info.filename.endswith("/data.pkl") else data)
    return path


def _gpt2_config() -> str:
    return json.dumps({"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 8, "vocab_size": 16,
                       "n_positions": 16})


def _fifo(b: Path, name: str) -> Path:
    os.mkfifo(b / name)
    return b / name


def _socket(b: Path) -> Path:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(b / "model.pt"))
    s.close()                       # the socket file stays
    return b / "model.pt"


def _link(b: Path, target: str, name: str = "model.pt") -> Path:
    (b / name).symlink_to(target)
    return b / name


def _loop(b: Path) -> Path:
    (b / "model.pt").symlink_to(b / "model.pt")
    return b / "model.pt"


def _with_log(b: Path, name: str, data: bytes) -> Path:
    (b / "metrics.csv").write_text(GOOD_LOG)
    (b / name).write_bytes(data)
    return b / "metrics.csv"


def _hf(b: Path, files: dict[str, bytes]) -> Path:
    (b / "config.json").write_text(_gpt2_config())
    for name, data in files.items():
        (b / name).write_bytes(data)
    return b


def _deep_folder(b: Path) -> Path:
    deep = str(b)
    for _ in range(1500):            # one level at a time: Path.mkdir(parents=True) recurses
        deep = os.path.join(deep, "d")
        os.mkdir(deep)
    Path(deep, "metrics.csv").write_text(GOOD_LOG)
    return b.joinpath(*["d"] * 64)


@pytest.fixture(autouse=True)
def _remove_deep_folders(tmp_path):
    """pytest's own clean-up (``shutil.rmtree``) recurses: the 1,500-level folder goes first, bottom up."""
    yield
    _remove_deep(tmp_path / "runs" / "b_bad" / "d")


def _nanogpt_pt(b: Path, tensor=lambda t: t, **extra) -> Path:
    """A readable nanoGPT checkpoint (1 layer, 2 heads, d_model 8), each tensor passed through ``tensor``."""
    torch.save({"model": {k: tensor(v) for k, v in _weights().items()},
                "model_args": {"n_layer": 1, "n_head": 2, "n_embd": 8}, **extra}, b / "model.pt")
    return b / "model.pt"


def _fp8(b: Path) -> Path:
    """A Hugging Face GPT-2 folder whose weights are float8_e4m3fn (torch.isfinite has no FP8 kernel)."""
    from safetensors.torch import save_file

    w = {"transformer.h.0.attn.c_attn.weight": torch.randn(8, 24), "transformer.h.0.attn.c_attn.bias": torch.randn(24),
         "transformer.h.0.attn.c_proj.weight": torch.randn(8, 8)}
    save_file({k: v.to(torch.float8_e4m3fn) for k, v in w.items()}, str(b / "model.safetensors"))
    (b / "config.json").write_text(_gpt2_config())
    return b


#: name -> (build(b_bad) -> the path the report names, its status, a piece of its reason)
CASES = {
    "fifo_safetensors": (lambda b: _fifo(b, "model.safetensors"), "skipped", "is a FIFO"),
    "fifo_pt": (lambda b: _fifo(b, "model.pt"), "skipped", "is a FIFO"),
    "socket_pt": (_socket, "skipped", "is a socket"),
    "dev_zero_link": (lambda b: _link(b, "/dev/zero"), "skipped", "leads out of the ingested folder"),
    "proc_mem_link": (lambda b: _link(b, "/proc/self/mem"), "skipped", "leads out of the ingested folder"),
    "symlink_loop": (_loop, "skipped", "symbolic links that loop"),
    "fifo_in_hf_folder": (lambda b: (_hf(b, {}), _fifo(b, "model.safetensors"))[1], "skipped", "is a FIFO"),
    "deep_trainer_state": (lambda b: (b / "trainer_state.json").write_bytes(_deep_json("log_history"))
                           and b / "trainer_state.json", "error", "nested deeper"),
    "deep_config_json": (lambda b: _with_log(b, "config.json", _deep_json()), "error", "nested deeper"),
    "deep_index_json": (lambda b: _hf(b, {"model.safetensors.index.json": _deep_json("weight_map")}),
                        "error", "nested deeper"),
    "deep_safetensors_header": (lambda b: (b / "model.safetensors").write_bytes(_st_bytes(_deep_json()))
                                and b / "model.safetensors", "error", ""),
    "deep_pt": (lambda b: _torch_zip(b / "model.pt", b"\x80\x02" + b"]" * DEEP + b"a" * (DEEP - 1) + b"."),
                "error", ""),
    "self_referencing_pt": (lambda b: _torch_zip(b / "model.pt", b"\x80\x02}q\x00X\x05\x00\x00\x00modelq\x01"
                                                                 b"h\x00s."), "error", ""),
    "deep_yaml": (lambda b: _with_log(b, "hparams.yaml", b"[" * DEEP + b"]" * DEEP), "error", ""),
    "deep_folder": (_deep_folder, "skipped", "levels below"),
    "parser_memory_bomb": (lambda b: _with_log(b, "config_train.py", b"y = " + b"-" * 200_000 + b"1\n"),
                           "error", ""),
    "huge_step_pt": (lambda b: _nanogpt_pt(b, iter_num=10 ** 30), "error", ""),
    "fp8_safetensors": (_fp8, "added", ""),
    "meta_tensors_pt": (lambda b: _nanogpt_pt(b, lambda t: t.to("meta")), "error", ""),
    "sparse_tensors_pt": (lambda b: _nanogpt_pt(b, lambda t: t.to_sparse()), "error", ""),
    "nested_tensors_pt": (lambda b: _nanogpt_pt(b, lambda t: torch.nested.nested_tensor([t])), "error", ""),
}


def _build(root: Path, case: str) -> Path:
    for good in ("a_good", "z_good"):
        (root / good).mkdir(parents=True)
        (root / good / "metrics.csv").write_text(GOOD_LOG)
    b = root / "b_bad"
    b.mkdir()
    return CASES[case][0](b)


def _runs(db: Path) -> list[str]:
    with Store(db).connect(read_only=True) as con:
        return [r[0] for r in con.execute("SELECT name FROM runs ORDER BY name").fetchall()]


def _report_lines(out: str, name: str) -> list[str]:
    return [line for line in out.splitlines() if name in line]


def _remove_deep(top: Path) -> None:
    """Remove a 1,500-level folder bottom up (``shutil.rmtree`` recurses past Python's limit)."""
    if not top.is_dir():
        return
    deep = str(top)
    while os.path.isdir(os.path.join(deep, "d")):
        deep = os.path.join(deep, "d")
    for name in os.listdir(deep):
        os.unlink(os.path.join(deep, name))
    while len(deep) >= len(str(top)):
        os.rmdir(deep)
        deep = os.path.dirname(deep)


@pytest.fixture(scope="module")
def folder_runs(tmp_path_factory):
    """Every case in one folder beside the two good logs (``b_<case>/``), ingested by one CLI run
    per expected exit status: the cases that are skipped or added (exit 0: no file failed) and
    the cases that fail (exit 2). ``ingest`` exits 2 exactly when a file failed, so each group's
    status is each of its cases' status alone; two runs instead of one per case."""
    out, roots = {}, []
    # the 1,500-level folder goes even when a run fails: left behind, pytest's clean-up of old
    # runs (shutil.rmtree) recurses past Python's limit and ends later sessions with an error
    try:
        for group, statuses in (("ok", ("skipped", "added")), ("error", ("error",))):
            root = tmp_path_factory.mktemp(f"faults-{group}") / "runs"
            roots.append(root)
            bads = {}
            for case in sorted(c for c in CASES if CASES[c][1] in statuses):
                b = root / f"b_{case}"
                b.mkdir(parents=True)
                bads[case] = CASES[case][0](b)
            for good in ("a_good", "z_good"):
                (root / good).mkdir()
                (root / good / "metrics.csv").write_text(GOOD_LOG)
            db = root.parent / "q.duckdb"
            proc = cli("ingest", str(root), "--db", str(db), timeout=40 + 10 * len(bads))
            out[group] = (proc, bads, _runs(db))
        yield out
    finally:
        for root in roots:
            _remove_deep(root / "b_deep_folder" / "d")


@pytest.mark.parametrize("group", ["ok", "error"])
def test_a_folder_of_bad_files_exits_by_its_failures_and_stores_the_good_runs(folder_runs, group):
    proc, bads, runs = folder_runs[group]
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert "Traceback" not in err, err
    assert errors_only(err) == ""
    assert proc.returncode == (2 if group == "error" else 0), out
    assert out.splitlines()[-1].endswith(f"{len(bads) if group == 'error' else 0} errors"), out
    assert {"a_good", "z_good"} <= set(runs), out


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_bad_file_is_one_line_and_the_folder_is_ingested(folder_runs, case):
    status = CASES[case][1]
    proc, bads, _ = folder_runs["error" if status == "error" else "ok"]
    bad, out = bads[case], proc.stdout.decode()
    lines = [line for line in out.splitlines()[:-1] if f"{bad} " in line or line.endswith(str(bad))]
    assert len(lines) == 1, out
    assert lines[0].startswith(f"{status:<9}") and str(bad) in lines[0], out
    assert CASES[case][2] in lines[0], out


ALONE = ["fifo_pt", "deep_trainer_state", "deep_index_json", "huge_step_pt", "meta_tensors_pt", "deep_pt",
         "symlink_loop", "dev_zero_link", "nested_tensors_pt"]


def test_the_bad_files_alone_leave_the_database_byte_identical(tmp_path):
    """The bad files without any good one, given to one ``ingest`` (one process instead of one
    per case): not a byte of the database changes, so none of them stored anything."""
    bads = []
    for case in ALONE:
        b = tmp_path / "runs" / f"b_{case}"
        b.mkdir(parents=True)
        bads.append(CASES[case][0](b))
    db = tmp_path / "q.duckdb"
    Store(db).checkpoints()                       # create it
    before = digest(db)
    proc = cli("ingest", *map(str, bads), "--db", str(db), timeout=30 + 10 * len(bads))
    out = proc.stdout.decode()
    assert "Traceback" not in proc.stderr.decode()
    assert proc.returncode == 2, out              # some of them fail
    assert all(str(b) in out for b in bads), out  # each has its report line
    assert digest(db) == before


@pytest.mark.parametrize("case, problem", [
    ("fifo_pt", "is a FIFO, not a regular file"),
    ("fifo_safetensors", "is a FIFO, not a regular file"),
    ("socket_pt", "is a socket, not a regular file"),
    ("dev_zero_link", "is a link to /dev/zero, a character device, not a regular file"),
    ("symlink_loop", "symbolic links that loop"),
    ("fifo_in_hf_folder", "is a FIFO, not a regular file"),
    ("sparse_tensors_pt", ""),
    ("deep_index_json", "nested deeper"),
    ("deep_safetensors_header", ""),
    ("deep_pt", ""),
    ("self_referencing_pt", ""),
    ("meta_tensors_pt", ""),
])
def test_info_gives_one_line_and_exit_2(tmp_path, case, problem):
    bad = _build(tmp_path / "runs", case)
    proc = cli("info", str(bad), timeout=30)
    err = proc.stderr.decode()
    assert (proc.returncode, proc.stdout) == (2, b""), err
    assert err.startswith(f"error: {bad}: ") and err.count("\n") == 1, err
    assert problem in err


def test_info_refuses_what_stat_refuses_without_starting_a_reading_child(tmp_path, monkeypatch):
    """A FIFO (``open`` would block), a socket, a device, links that loop: ``info`` gives the
    reader's own line without starting a reading child for a file it would refuse anyway."""
    import app.sandbox_jobs
    from app.commands.info import read_info
    from loaders.errors import FileError

    def no_child(*args, **kwargs):
        raise AssertionError("a reading child was started")

    monkeypatch.setattr(app.sandbox_jobs, "call", no_child)
    for case, problem in (("fifo_pt", "is a FIFO, not a regular file"), ("socket_pt", "is a socket, not a regular file"),
                          ("symlink_loop", "is a chain of symbolic links that loop"),
                          ("dev_zero_link", "is a link to /dev/zero, a character device, not a regular file")):
        bad = _build(tmp_path / case, case)
        with pytest.raises(FileError) as err:
            read_info(str(bad))
        assert str(err.value) == f"{bad}: {problem}"


def test_a_newline_in_a_name_cannot_split_a_report_line(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    (root / "evil\nadded     csv_long           fake.jsonl").write_bytes(b'{"step": 1, "loss": 2.0}\n{"x": "\xff"}\n')
    (root / "good.csv").write_text(GOOD_LOG)
    proc = cli("ingest", str(root), "--db", str(tmp_path / "q.duckdb"))
    lines = proc.stdout.decode().splitlines()
    assert proc.returncode == 2, lines
    assert len(lines) == 3, lines                  # the error, the good log, the totals
    [bad] = [line for line in lines if line.startswith("error")]
    assert repr(str(root / "evil\nadded     csv_long           fake.jsonl")) in bad
    assert lines[-1] == "1 added, 0 appended, 0 unchanged, 0 skipped, 1 errors"


def test_a_name_that_is_not_utf8_is_one_error_line(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    os.makedirs(os.fsencode(root) + b"/b")
    (root / "good.csv").write_text(GOOD_LOG)
    with open(os.fsencode(root) + b"/b/\xff\xfe.csv", "w") as fh:
        fh.write(GOOD_LOG)
    proc = cli("ingest", str(root), "--db", str(tmp_path / "q.duckdb"))
    out = proc.stdout.decode()
    assert proc.returncode == 2 and errors_only(proc.stderr) == "", proc.stderr
    [bad] = [line for line in out.splitlines() if line.startswith("error")]
    assert "\\udcff\\udcfe.csv" in bad and "not valid UTF-8" in bad
    assert "1 added" in out


def test_a_200mb_csv_line_ends_in_no_traceback(tmp_path):
    """Before: a DuckDB error and a traceback. What the CSV reader makes of the
    line (an error, or the points before it) is its budget's business; here:
    no traceback, at most one error line, the good log stored."""
    root = tmp_path / "runs"
    (root / "b").mkdir(parents=True)
    (root / "a.csv").write_text(GOOD_LOG)
    with open(root / "b" / "metrics.csv", "w") as fh:
        fh.write("step,metric,value\n0,train_loss,1\n1,train_loss,")
        fh.write("x" * (200 << 20))
        fh.write("\n")
    proc = cli("ingest", str(root), "--db", str(tmp_path / "q.duckdb"), timeout=120)
    out = proc.stdout.decode()
    assert "Traceback" not in proc.stderr.decode(), proc.stderr
    errors = [line for line in out.splitlines() if line.startswith("error")]
    assert (proc.returncode, len(errors)) in ((0, 0), (2, 1)), out
    assert f"{root / 'a.csv'}, 2 points" in out


# -- files that change while they are read (in-process: the change is timed by a hook) ----

def _good_checkpoint(tmp_path: Path) -> Path:
    from safetensors.torch import save_file

    p = tmp_path / "runs" / "model.safetensors"
    p.parent.mkdir(parents=True)
    save_file(_weights(), str(p))
    return p


@pytest.mark.parametrize("change, problem", [
    ("grow", "changed while it was read (size {a} -> {b} bytes"),
    ("delete", "vanished while it was read"),
])
def test_a_checkpoint_that_changes_while_it_is_hashed_fails_with_one_line(tmp_path, monkeypatch, change,
                                                                         problem):
    import loaders.sources

    p = _good_checkpoint(tmp_path)
    size = p.stat().st_size
    real = loaders.sources.content_hash

    def hash_then_change(path):
        digest_ = real(path)
        if change == "grow":
            with open(p, "ab") as fh:
                fh.write(b"\0" * 16)
        else:
            p.unlink()
        return digest_

    monkeypatch.setattr(loaders.sources, "content_hash", hash_then_change)
    db = tmp_path / "q.duckdb"
    Store(db).checkpoints()
    before = digest(db)
    [f] = ingest_paths(Store(db), [tmp_path / "runs"]).files
    assert f.status == "error"
    assert f.reason.startswith(f"{p}: ")
    assert problem.format(a=size, b=size + 16) in f.reason
    assert digest(db) == before


def test_the_hash_and_the_geometry_are_read_side_by_side(tmp_path, monkeypatch):
    # both read the whole file: each waits here for the other, which only a second thread allows
    import threading

    import loaders.checkpoints
    import loaders.sources

    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    p = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=16, vocab_size=64)).save_pretrained(p)
    both = threading.Barrier(2, timeout=20)
    real_hash, real_inspect = loaders.sources.content_hash, loaders.checkpoints.inspect_checkpoint

    def hashing(path):
        both.wait()
        return real_hash(path)

    def inspecting(path):
        both.wait()
        return real_inspect(path)

    monkeypatch.setattr(loaders.sources, "content_hash", hashing)
    monkeypatch.setattr(loaders.checkpoints, "inspect_checkpoint", inspecting)
    [f] = ingest_paths(Store(tmp_path / "q.duckdb"), [p]).files
    assert f.status == "added", f.reason
    with Store(tmp_path / "q.duckdb").connect() as con:
        assert con.execute("SELECT sha256, n_heads FROM checkpoints").fetchall() == [(real_hash(p), 4)]


def test_when_both_fail_the_hashs_error_is_the_one_reported(tmp_path, monkeypatch):
    # the hash (its header checks) ran first before the two went side by side: its error still wins
    import loaders.checkpoints
    import loaders.sources
    from loaders.errors import CheckpointFormatError

    p = _good_checkpoint(tmp_path)

    def hashing(path):
        raise CheckpointFormatError(path, "the hash's problem")

    def inspecting(path):
        raise CheckpointFormatError(path, "the reader's problem")

    monkeypatch.setattr(loaders.sources, "content_hash", hashing)
    monkeypatch.setattr(loaders.checkpoints, "inspect_checkpoint", inspecting)
    [f] = ingest_paths(Store(tmp_path / "q.duckdb"), [p]).files
    assert f.status == "error" and f.reason == f"{p}: the hash's problem"


def test_a_keyboard_interrupt_is_not_swallowed_by_the_file_boundary(tmp_path, monkeypatch):
    import loaders.sources

    p = _good_checkpoint(tmp_path)

    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(loaders.sources, "content_hash", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ingest_paths(Store(tmp_path / "q.duckdb"), [p])
