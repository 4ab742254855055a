"""Memory and time bombs (issue "Files and links built to attack"): files of a
few KB that describe gigabytes. Each attack is built here and run through the
real CLI in a process of its own under an address-space limit of 4 GiB and a time
limit: exit 2, one line ``error: PATH: what``, no traceback, and ``ingest``
leaves the database byte-identical. Budgets: ``loaders/budgets.py``.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from loaders.errors import CheckpointFormatError
from loaders.ingest import ingest_paths
from loaders.sources import SafetensorsSource, TorchSource, content_hash
from loaders.store import Store
from tests.forked_cli import ForkedCli, address_space, module_driver

AS_LIMIT = 4 << 30
TIMEOUT_S = 60


_limit = address_space(AS_LIMIT)
_CLI: list[ForkedCli] = []


@pytest.fixture(scope="module", autouse=True)
def forked_cli(tmp_path_factory):
    """One process under the address-space limit that imported the CLI; each command is forked
    from it (tests/forked_cli.py)."""
    yield from module_driver(_CLI, tmp_path_factory, _limit)


def cli(*args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """``python -m app ARGS`` under RLIMIT_AS 4 GiB and a 60 s timeout, and its seconds (called
    from another module: a driver of its own)."""
    if _CLI:
        return _CLI[-1].timed(*args, env=env, timeout=TIMEOUT_S)
    with tempfile.TemporaryDirectory() as d:
        driver = ForkedCli(Path(d), preexec_fn=_limit)
        try:
            return driver.timed(*args, env=env, timeout=TIMEOUT_S)
        finally:
            driver.close()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """A database holding one good run, so that 'byte-identical' means something."""
    d = tmp_path_factory.mktemp("seed")
    (d / "good").mkdir()
    (d / "good" / "metrics.csv").write_text("step,train_loss\n0,2.5\n1,2.4\n")
    db = d / "seed.duckdb"
    assert [f.status for f in ingest_paths(Store(db), [d / "good"]).files] == ["added"]
    return db


@pytest.fixture
def db(seeded, tmp_path):
    (tmp_path / "db").mkdir()
    return Path(shutil.copy(seeded, tmp_path / "db" / "q.duckdb"))


def one_error_line(proc: subprocess.CompletedProcess, path: Path, *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {path}"), lines[0]
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


#: The files ``refused_by_info_and_ingest`` is given, built by the tests' builders below:
#: name -> build(folder) -> (the path given to the CLI, the path its error names)
REFUSED: dict[str, object] = {}


def refused_file(name: str):
    """Register the decorated ``build(folder)`` under ``name`` in ``REFUSED``."""
    def register(build):
        REFUSED[name] = build
        return build
    return register


@pytest.fixture(scope="module")
def refused(forked_cli, seeded, tmp_path_factory):
    """Every file of ``REFUSED``, each in a folder of its own, given to ONE ``ingest`` (one process
    and one reading child instead of one per file): the paths, that run's output, and whether the
    database stayed byte-identical (so that no file stored anything)."""
    root = tmp_path_factory.mktemp("refused")
    paths = {}
    for name, build in REFUSED.items():
        (root / name).mkdir()
        paths[name] = build(root / name)
    db = Path(shutil.copy(seeded, root / "q.duckdb"))
    before = digest(db)
    proc, _ = cli("ingest", *(str(given) for given, _ in paths.values()), "--db", str(db))
    return paths, proc, digest(db) == before


def refused_by_info_and_ingest(refused, name: str, *needles: str) -> None:
    """``info`` of the file ``name`` of ``REFUSED``: exit 2 and one line naming it with ``needles``;
    in the shared ``ingest``: exit 2, no traceback, one line naming it with ``needles``, and the
    database byte-identical."""
    paths, proc, unchanged = refused
    path, where = paths[name]
    one_error_line(cli("info", str(path))[0], where, *needles)
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if str(where) in ln]
    assert len(lines) == 1, proc.stdout + proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    assert unchanged


def gpt2_state(d: int = 8, vocab: int = 16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)       # noqa: E731
    return {"wte.weight": r(vocab, d), "wpe.weight": r(8, d),
            "h.0.ln_1.weight": torch.ones(d), "h.0.ln_1.bias": torch.zeros(d),
            "h.0.attn.c_attn.weight": r(d, 3 * d), "h.0.attn.c_attn.bias": torch.zeros(3 * d),
            "h.0.attn.c_proj.weight": r(d, d), "h.0.attn.c_proj.bias": torch.zeros(d),
            "h.0.ln_2.weight": torch.ones(d), "h.0.ln_2.bias": torch.zeros(d),
            "h.0.mlp.c_fc.weight": r(d, 4 * d), "h.0.mlp.c_fc.bias": torch.zeros(4 * d),
            "h.0.mlp.c_proj.weight": r(4 * d, d), "h.0.mlp.c_proj.bias": torch.zeros(d),
            "ln_f.weight": torch.ones(d), "ln_f.bias": torch.zeros(d)}


NANOGPT_ARGS = {"n_layer": 1, "n_head": 2, "n_embd": 8, "vocab_size": 16, "block_size": 8, "bias": True}


def st_header(shapes: dict[str, list[int]]) -> tuple[bytes, int]:
    """A valid F32 safetensors header for ``shapes`` and the data area's size."""
    header, pos = {}, 0
    for name, shape in shapes.items():
        n = 4 * int(torch.tensor(shape).prod()) if shape else 4
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [pos, pos + n]}
        pos += n
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw, pos


# -- 1. tensors that do not own their storage ------------------------------------

@refused_file("zero_stride")
def _zero_stride(folder: Path) -> tuple[Path, Path]:
    p = folder / "expand.pt"
    state = gpt2_state()
    state["h.0.attn.c_attn.weight"] = torch.zeros(1).expand(73728, 24576)
    torch.save({"model": state}, p)
    assert p.stat().st_size < 10_000
    return p, p


def test_zero_stride_tensor_in_a_checkpoint(refused):
    """Before: 2.7 KB -> over 12 GB in 19 s in ``info``."""
    refused_by_info_and_ingest(refused, "zero_stride", "tensor 'h.0.attn.c_attn.weight' shape [73728, 24576] "
                                                       "with strides [0, 0] reuses its storage's elements")


@refused_file("overlapping_strides")
def _overlapping_strides(folder: Path) -> tuple[Path, Path]:
    p = folder / "overlap.pt"
    state = gpt2_state()
    base = torch.zeros(8 * 24 + 1)
    state["h.0.attn.c_attn.weight"] = base.as_strided((8, 24), (1, 1))    # rows overlap
    torch.save({"model": state}, p)
    return p, p


def test_overlapping_strides_are_refused_too(refused):
    refused_by_info_and_ingest(refused, "overlapping_strides", "strides [1, 1] reuses its storage's elements")


def test_query_free_loss_tensor_with_zero_strides(tmp_path, db):
    """Before: ``zeros(1).expand(10**9, 3)`` as ``tensor.pt``: 6 GB in 6.6 s in ``ingest``."""
    run = tmp_path / "qf_run"
    run.mkdir()
    p = run / "tensor.pt"
    torch.save(torch.zeros(1).expand(10**9, 3), p)
    before = digest(db)
    proc, _ = cli("ingest", str(p), "--db", str(db))
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in text, text
    assert f"{p}: loss tensor shape [1000000000, 3] with strides [0, 0] reuses" in text, text
    assert digest(db) == before


@refused_file("sparse_safetensors")
def _sparse_safetensors(folder_: Path) -> tuple[Path, Path]:
    d, vocab = 24576, 16
    shapes = {k: list(v.shape) for k, v in gpt2_state(d=8, vocab=vocab).items()}
    shapes = {k: [d if s == 8 else 3 * d if s == 24 else 4 * d if s == 32 else s for s in shape]
              for k, shape in shapes.items()}
    head, data = st_header(shapes)
    folder = folder_ / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "n_layer": 1, "n_head": 96, "n_embd": d, "vocab_size": vocab,
        "n_positions": 8}))
    p = folder / "model.safetensors"
    with open(p, "wb") as f:
        f.write(head)
        f.truncate(len(head) + data)                 # a hole: nothing written
    assert p.stat().st_size > 20e9 and p.stat().st_blocks * 512 < 1 << 20
    return folder, p


def test_sparse_safetensors_with_a_valid_header(refused):
    """Before: a sparse 27 GB file: 6 GB RSS in 7.5 s (one layer read whole)."""
    refused_by_info_and_ingest(refused, "sparse_safetensors", "lies in a hole of a sparse file")


@refused_file("header_claiming_more")
def _header_claiming_more(folder: Path) -> tuple[Path, Path]:
    head, data = st_header({"w": [4096, 4096]})
    p = folder / "short.safetensors"
    p.write_bytes(head + bytes(1000))
    return p, p


def test_safetensors_header_claiming_more_bytes_than_the_file_has(refused):
    refused_by_info_and_ingest(refused, "header_claiming_more", "end beyond the data area of 1000 bytes")


# -- 2. side data ---------------------------------------------------------------------

def _laughs(levels: int = 9):
    x = ["lol"]
    for _ in range(levels):
        x = [x] * 10                                 # pickled once, referenced 10 times (memo)
    return x


def _side_bomb(kind: str):
    def build(folder: Path) -> tuple[Path, Path]:
        if kind == "laughs":
            side = _laughs()
        elif kind == "selfref":
            side = []
            side.append(side)
        elif kind == "deep":
            side = None
            for _ in range(40):
                side = {"d": side}
        else:
            side = "x" * (2 << 20)
        p = folder / "side.pt"
        torch.save({"model": gpt2_state(), "laughs": side}, p)
        return p, p
    return build


SIDE_BOMBS = [
    ("laughs", "side entry 'laughs': side data holds more values than allowed"),
    ("deep", "side data nested more than 32 levels deep"),
    ("selfref", "side data nested more than 32 levels deep (or a container that holds itself)"),
    ("text", "side data holds more bytes of text than allowed"),
]
for _kind, _ in SIDE_BOMBS:
    refused_file(f"side_{_kind}")(_side_bomb(_kind))


@pytest.mark.parametrize("kind, needle", SIDE_BOMBS, ids=[k for k, _ in SIDE_BOMBS])
def test_side_data_bombs(refused, kind, needle):
    """Before: a memo billion laughs of 35 KB -> 9 GB after 277 s, still growing."""
    refused_by_info_and_ingest(refused, f"side_{kind}", needle, "QKVSCOPE_SIDE_")


def test_a_side_budget_is_raised_from_the_environment(tmp_path):
    p = tmp_path / "side.pt"
    torch.save({"model": gpt2_state(), "model_args": NANOGPT_ARGS, "losses": list(range(20_000))}, p)
    proc, _ = cli("info", str(p))
    one_error_line(proc, p, "QKVSCOPE_SIDE_ITEMS")
    proc, _ = cli("info", str(p), env={"QKVSCOPE_SIDE_ITEMS": "50000"})
    assert proc.returncode == 0, proc.stderr


@refused_file("self_referencing_mapping")
def _self_referencing_mapping(folder: Path) -> tuple[Path, Path]:
    loop: dict = {"w": torch.zeros(2)}
    loop["again"] = loop
    p = folder / "loop.pt"
    torch.save({"model": gpt2_state(), "extra": loop}, p)
    return p, p


def test_self_referencing_weight_mapping(refused):
    refused_by_info_and_ingest(refused, "self_referencing_mapping", "QKVSCOPE_SIDE_DEPTH")


# -- 3. YAML alias bombs ------------------------------------------------------------

YAML_BOMB = ('a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
             + "".join(f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]\n"
                       for p, c in zip("abcdefgh", "bcdefghi")))


def test_yaml_bomb_as_lightning_hparams(tmp_path, db):
    """Before: 342 bytes as ``hparams.yaml`` beside ``metrics.csv``: over 8 GB in 77 s."""
    assert len(YAML_BOMB) < 400
    run = tmp_path / "lightning_logs" / "version_0"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text("epoch,step,train_loss\n0,0,2.5\n0,1,2.4\n")
    (run / "hparams.yaml").write_text(YAML_BOMB)
    before = digest(db)
    proc, secs = cli("ingest", str(run / "metrics.csv"), "--db", str(db))
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in text, text
    assert f"{run / 'hparams.yaml'}: config YAML expands (aliases counted in full)" in text, text
    assert digest(db) == before and secs < 30


def test_yaml_bomb_as_model_config_beside_a_checkpoint(tmp_path):
    """Before: ``info`` ran past 90 s. (``ingest`` stores the .pt on its own and
    lists the YAML as the run's configuration file, not read for the checkpoint.)"""
    run = tmp_path / "run"
    run.mkdir()
    torch.save(gpt2_state(), run / "final.pt")
    (run / "model_config.yaml").write_text(YAML_BOMB)
    proc, secs = cli("info", str(run))
    one_error_line(proc, run / "model_config.yaml", "model config: YAML expands", "QKVSCOPE_SIDE_ITEMS")
    assert secs < 30


def test_a_large_yaml_file_is_refused_by_size(tmp_path):
    p = tmp_path / "run"
    p.mkdir()
    torch.save(gpt2_state(), p / "final.pt")
    (p / "model_config.yaml").write_text("n_embd: 8\n" + "# pad\n" * 200_000)
    proc, _ = cli("info", str(p))
    one_error_line(proc, p / "model_config.yaml", "larger than 1,048,576 bytes", "QKVSCOPE_YAML_BYTES")


# -- 4. TFRecord length -----------------------------------------------------------------

def _record(data: bytes) -> bytes:
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    head = struct.pack("<Q", len(data))
    return head + struct.pack("<I", masked_crc32c(head)) + data + struct.pack("<I", masked_crc32c(data))


def test_tfevents_record_claiming_4_gib(tmp_path, db):
    """Before: a sparse file whose second record claims 4 GiB: over 9 GB in 13 s."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    run = tmp_path / "tb"
    run.mkdir()
    p = run / "events.out.tfevents.1.host"
    first = _record(Event(wall_time=1.0, file_version="brain.Event:2").SerializeToString())
    length = struct.pack("<Q", 4 << 30)
    with open(p, "wb") as f:
        f.write(first + length + struct.pack("<I", masked_crc32c(length)))
        f.truncate(len(first) + 12 + (4 << 30) + 4)
    before = digest(db)
    proc, secs = cli("ingest", str(p), "--db", str(db))
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in text, text
    assert (f"{p}: TensorBoard record at byte {len(first)} claims 4,294,967,296 bytes, over the budget "
            f"of 67,108,864 (QKVSCOPE_RECORD_BYTES") in text, text
    assert digest(db) == before and secs < 30


# -- 5. safetensors header validated before hashing ------------------------------------

def test_bad_safetensors_header_is_refused_before_hashing(tmp_path, db):
    """Before: ``ingest`` hashed a 20 GB file first (46 s; ``info`` 4.9 s)."""
    raw = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    p = tmp_path / "bad.safetensors"
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + (20 << 30))        # data area of 20 GiB, tensors end at byte 8
    t0 = time.monotonic()
    with pytest.raises(CheckpointFormatError, match="tensors end at byte 8"):
        content_hash(p)
    assert time.monotonic() - t0 < 1
    before = digest(db)
    proc, secs = cli("ingest", str(p), "--db", str(db))
    assert proc.returncode == 2 and "tensors end at byte 8" in proc.stdout + proc.stderr
    assert digest(db) == before and secs < 30


# -- 6. zip entries that overlap -----------------------------------------------------

def overlapping_zip(zp: Path) -> Path:
    """20 entries of 64 KiB zeros where entry 0's compressed size in the central directory
    reaches into entry 1, as in the overlapping-entry zip bombs."""
    with zipfile.ZipFile(zp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for k in range(20):
            zf.writestr(f"run/part{k:02d}.bin", bytes(1 << 16))
    raw = bytearray(zp.read_bytes())
    cd = raw.index(b"PK\x01\x02")
    size = struct.unpack_from("<I", raw, cd + 20)[0]
    struct.pack_into("<I", raw, cd + 20, size + 200)     # entry 0 reaches into entry 1
    zp.write_bytes(bytes(raw))
    return zp


refused_file("overlapping_zip")(lambda folder: (overlapping_zip(folder / "overlap.zip"),) * 2)


def test_zip_entries_that_overlap(refused):
    """Before: 20 overlapping entries, each 188:1 (under the 200:1 check): 1.4 MB ->
    5.37 GB written. Here entry k's compressed size in the central directory
    reaches over every later entry, as in such a zip."""
    refused_by_info_and_ingest(refused, "overlapping_zip", "zip entries 'run/part00.bin' and 'run/part01.bin' "
                                                           "overlap")


# -- files cut while they are read -------------------------------------------------------

@pytest.mark.parametrize("reader", ["mmap", "pread"])
def test_safetensors_truncated_between_open_and_read(tmp_path, reader):
    p = tmp_path / "m.safetensors"
    save_file({"a": torch.ones(1 << 20), "b": torch.ones(1 << 20)}, str(p))
    src = SafetensorsSource(p, reader=reader)
    try:
        os.truncate(p, 4096)
        with pytest.raises(CheckpointFormatError,
                           match=r"file changed while it was read \(size 8,388,7\d\d -> 4,096 bytes"):
            src.get("b")
    finally:
        src.close()


def test_pytorch_zip_truncated_between_open_and_read(tmp_path):
    p = tmp_path / "ckpt.pt"
    torch.save(gpt2_state(), p)
    src = TorchSource(p)
    os.truncate(p, 1024)
    with pytest.raises(CheckpointFormatError, match="file changed while it was read"):
        src.get("h.0.attn.c_attn.weight")
    src.close()
