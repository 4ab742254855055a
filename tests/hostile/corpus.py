"""The hostile corpus: every file here was made by someone who wants qkvscope
to run their code, fill the disk, hang, or corrupt the database. Built in code
(nothing binary is checked in), one builder per case.

``build(root)`` writes every case under ``root`` and returns ``Case`` rows:
the path, what ``ingest`` must report for it (status and exact reason) and
the exact one-line error ``info`` must print. ``MARKER_NAME`` is the file a
pickle payload would create if it ever ran.
"""
from __future__ import annotations

import json
import os
import pickle
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from loaders.logs import CHECKPOINT_LOG_FORMATS, READERS

MARKER_NAME = "PAYLOAD_RAN"
EXPECTED = ("expected a safetensors, PyTorch (.bin/.pt/.pth/.ckpt) or zip file, "
            "or a folder with config.json")
HINT = "  (qkvscope loads only plain tensors and containers; re-save the weights with safetensors)"
NOT_READ = "not a checkpoint or a training log qkvscope reads"
NOT_A_LOG = "not a training log qkvscope reads: "
#: Every reader detection asks, in its order (the registry's list; its order is tested in test_readers).
LOG_EXPECTED = "expected a training log (" + ", ".join(
    n for n in READERS if n not in CHECKPOINT_LOG_FORMATS) + ")"


class Payload:
    """Unpickling this runs ``touch MARKER``: what a malicious checkpoint does."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def refused(func: str = f"{os.system.__module__}.system") -> str:
    return f"refused to unpickle: the pickle calls {func}, which is not a tensor or container{HINT}"


@dataclass
class Case:
    name: str
    path: Path
    status: str          # what ingest reports for the file: 'error' or 'skipped'
    reason: str          # the report's reason, exactly (for errors: "PATH: problem")
    info: str            # what `info` prints on stderr, exactly (without "error: ")


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"transformer.h.0.attn.c_attn.weight": torch.randn(24, 8, generator=g),
            "transformer.h.0.attn.c_proj.weight": torch.randn(8, 8, generator=g)}


def st_bytes(header: dict, data: bytes, *, length: int | None = None) -> bytes:
    """A safetensors file by hand: u64 little-endian header length, JSON header, data."""
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h) if length is None else length) + h + data


def _zip(path: Path, entries: list[tuple[zipfile.ZipInfo | str, bytes]], **kw) -> Path:
    with zipfile.ZipFile(path, "w", **kw) as zf:
        for info, data in entries:
            zf.writestr(info, data)
    return path


def _symlink(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = 0o120777 << 16             # S_IFLNK | 0777 in the high 16 bits
    return info


def build(root: Path) -> list[Case]:
    """Write every hostile case under ``root``; the payload marker goes in ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    marker = root / MARKER_NAME
    evil = {"model": _weights(), "x": Payload(marker)}
    cases: list[Case] = []

    def err(name: str, path: Path, problem: str, *, info_problem: str | None = None,
            status: str = "error") -> None:
        reason = f"{path}: {problem}" if status == "error" else problem
        cases.append(Case(name, path, status, reason, f"{path}: {info_problem or problem}"))

    # -- pickle payloads --------------------------------------------------------
    d = root / "pickle"
    d.mkdir()
    p = d / "evil.pt"
    torch.save(evil, p)
    err("pickle_pt_zip", p, refused())
    p = d / "pytorch_model.bin"
    torch.save(evil, p, _use_new_zipfile_serialization=False)
    err("pickle_bin_legacy", p, refused())
    p = d / "last.ckpt"
    p.write_bytes(pickle.dumps(evil, protocol=4))
    err("pickle_ckpt_raw", p, refused())
    p = d / "upload.zip"
    inner = d / "inner.pt"
    torch.save(evil, inner)
    _zip(p, [("run/ckpt.pt", inner.read_bytes())])
    inner.unlink()
    err("pickle_in_zip_upload", p, f"run/ckpt.pt: {refused()}")
    p = d / "model_args.pkl"
    p.write_bytes(pickle.dumps({"n_layer": 2, "x": Payload(marker)}, protocol=2))
    err("pickle_model_args_pkl", p, NOT_READ, info_problem=refused(), status="skipped")
    hf = d / "hf_evil"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1}))
    torch.save(evil, hf / "pytorch_model.bin")
    inner = hf / "pytorch_model.bin"                # the folder's error names the file inside
    cases.append(Case("pickle_in_hf_folder", hf, "error", f"{inner}: {refused()}", f"{inner}: {refused()}"))

    # -- zip uploads --------------------------------------------------------------
    d = root / "zips"
    d.mkdir()
    p = _zip(d / "traversal.zip", [("../evil.pt", b"x")])
    err("zip_dotdot", p, "zip entry '../evil.pt' climbs out of the folder with '..'; refused")
    p = _zip(d / "absolute.zip", [(zipfile.ZipInfo("/tmp/qkvscope-evil.pt"), b"x")])
    err("zip_absolute", p, "zip entry '/tmp/qkvscope-evil.pt' has an absolute path; refused")
    p = _zip(d / "symlink.zip", [(_symlink("run/model.safetensors"), b"/etc/passwd")])
    err("zip_symlink", p, "zip entry 'run/model.safetensors' is a symbolic link; refused")
    p = _zip(d / "bomb.zip", [("bomb.bin", b"\0" * (16 << 20))], compression=zipfile.ZIP_DEFLATED)
    with zipfile.ZipFile(p) as zf:
        i = zf.getinfo("bomb.bin")
    err("zip_bomb_ratio", p, f"zip entry 'bomb.bin' expands {i.file_size / i.compress_size:.0f}x "
                             f"({i.file_size} bytes from {i.compress_size}), over the 200x limit; "
                             f"refused as a zip bomb")
    p = _zip(d / "many.zip", [(f"f{k}.txt", b"") for k in range(10_001)])
    err("zip_too_many_entries", p, "zip has 10001 entries, over the 10000-entry limit")

    # -- safetensors ----------------------------------------------------------------
    d = root / "safetensors"
    d.mkdir()
    t = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
    p = d / "past_end.safetensors"
    p.write_bytes(st_bytes({"w": t}, bytes(16), length=4096))
    err("st_header_past_file", p,
        f"safetensors header says 4096 bytes but the file has {p.stat().st_size - 8} after the length prefix")
    p = d / "overlap.safetensors"
    p.write_bytes(st_bytes({"a": t, "b": {**t, "data_offsets": [8, 24]}}, bytes(24)))
    err("st_overlap", p, "safetensors tensors 'a' and 'b' overlap (bytes 8..16 of the data area)")
    p = d / "out_of_range.safetensors"
    p.write_bytes(st_bytes({"w": {**t, "data_offsets": [1 << 40, (1 << 40) + 16]}}, bytes(16)))
    err("st_offsets_out_of_range", p, f"safetensors tensor 'w' data_offsets [{1 << 40}, {(1 << 40) + 16}] "
                                      f"end beyond the data area of 16 bytes")
    p = d / "dtype.safetensors"
    p.write_bytes(st_bytes({"w": {**t, "dtype": "Q4_K"}}, bytes(16)))
    err("st_unknown_dtype", p, "safetensors tensor 'w' has unknown dtype 'Q4_K' (known: BF16, BOOL, C64, "
                               "F16, F32, F64, F8_E4M3, F8_E5M2, F8_E8M0, I16, I32, I64, I8, U16, U32, "
                               "U64, U8)")
    p = d / "huge_header.safetensors"
    n = 100_000_001
    with open(p, "wb") as f:                        # a real 100 MB header of padding
        f.write(struct.pack("<Q", n) + b"{" + b" " * (n - 2) + b"}")
    err("st_100mb_header", p, f"safetensors header length is {n} bytes, over the 100000000-byte limit")
    p = d / "numel_overflow.safetensors"
    p.write_bytes(st_bytes({"w": {"dtype": "F32", "shape": [1 << 40, 1 << 40], "data_offsets": [0, 16]}},
                           bytes(16)))
    err("st_shape_overflow", p, f"safetensors tensor 'w' has 16 bytes at data_offsets [0, 16] but shape "
                                f"[{1 << 40}, {1 << 40}] of F32 needs {4 << 80}")

    # -- logs -------------------------------------------------------------------------
    d = root / "logs"
    d.mkdir()
    p = d / "train.log"
    p.write_bytes(bytes(range(256)) * 64 + os.urandom(4096))
    err("log_binary_garbage", p, f"{NOT_A_LOG}{LOG_EXPECTED}; found binary data (first bytes "
                                 f"00 01 02 03 04 05 06 07)", status="skipped",
        info_problem=f"unrecognised content (first bytes {bytes(range(8)).hex()}); {EXPECTED}")
    p = d / "oneline.log"
    first = b"iter 0: loss 1.0"
    with open(p, "wb") as f:                        # 50 MB, no newline
        f.write(first + b"x" * (50 << 20))
    err("log_50mb_single_line", p, "expected a first line of at most QKVSCOPE_CSV_LINE_BYTES (2097152 bytes; "
                                   "raise it in the environment to read this file), found a longer one",
        info_problem=f"unrecognised content (first bytes {first[:8].hex()}); {EXPECTED}")
    p = d / "latin1.csv"
    p.write_bytes(b"step,metric,value\n0,train_loss,1.0\n1,\xe9t\xe9,0.5\n")
    err("log_non_utf8", p, "expected UTF-8 text, found byte 0xe9 at offset 37 that is not valid UTF-8",
        info_problem=f"unrecognised content (first bytes {b'step,met'.hex()}); {EXPECTED}")
    return cases


#: A progress line of ``ingest`` (``app.commands.ingest.Progress``), written once an ingest has
#: run 5 s: how many lines there are depends on the machine's speed, not on the files.
PROGRESS_LINE = re.compile(r"^ingest: \d+/\d+ files, \d+ s$")


def errors_only(stderr: str | bytes) -> str:
    """``stderr`` without ``ingest``'s progress lines: what a command said about the files."""
    text = stderr.decode() if isinstance(stderr, bytes) else stderr
    return "".join(line for line in text.splitlines(keepends=True) if not PROGRESS_LINE.match(line.rstrip("\n")))
