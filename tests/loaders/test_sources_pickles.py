"""The pickle allow-list (loaders/sources/pickles.py): every global a pickle may
import is listed here, and one gadget of each refused kind is built by hand
(opcodes written out) in each container, refused with its exact message, and
never run (its ``touch MARKER`` leaves no file)."""
from __future__ import annotations

import collections
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from loaders.errors import CheckpointFormatError, UnsafeCheckpointError
from loaders.sources import load_plain_pickle, open_source
from loaders.sources.pickles import _PLAIN_GLOBALS, _numpy_safe_globals, _torch_load

HINT = ("  (qkvscope loads only plain tensors and containers; "
        "re-save the weights with safetensors)")
PLAIN = "which is not a plain value (a vocabulary pickle holds only dicts, strings and numbers)"


def qualname(g) -> str:
    return f"{g.__module__}.{g.__qualname__}"


# ----------------------------------------------------------------------------
# What is allowed
# ----------------------------------------------------------------------------

def test_numpy_globals_added_to_torchs_allow_list_are_exactly_these():
    assert [qualname(g) for g in _numpy_safe_globals()] == [
        "numpy.dtype", "numpy._core.multiarray.scalar", "numpy.dtypes.Float64DType",
        "numpy.dtypes.Float32DType", "numpy.dtypes.Int64DType", "numpy.dtypes.Int32DType",
        "numpy.dtypes.BoolDType"]


def test_torchs_own_allow_list_beyond_torch_is_exactly_these():
    allowed = pytest.importorskip("torch._weights_only_unpickler")._get_allowed_globals()
    assert sorted(k for k in allowed if not k.startswith("torch")) == [
        "_codecs.encode", "builtins.bytearray", "builtins.complex", "builtins.set",
        "collections.Counter", "collections.OrderedDict"]


def test_globals_never_blamed_for_a_refusal_are_exactly_these():
    assert _PLAIN_GLOBALS == frozenset({
        "collections.OrderedDict", "collections.Counter", "_codecs.encode",
        "builtins.set", "builtins.frozenset", "builtins.bytearray", "builtins.bytes",
        "builtins.complex", "builtins.slice", "builtins.range",
        "numpy.dtype", "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar"})


ALLOWED = {
    "OrderedDict": collections.OrderedDict(a=1), "Counter": collections.Counter("aab"),
    "set": {1, 2}, "bytearray": bytearray(b"xy"), "complex": complex(1, 2),
    "bytes (_codecs.encode)": b"ab", "float64": np.float64(1.5), "float32": np.float32(2.5),
    "int64": np.int64(3), "int32": np.int32(4), "bool_": np.bool_(True), "dtype": np.dtype("float32"),
}


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_every_allowed_global_loads_as_saved(tmp_path, legacy):
    p = tmp_path / "ok.pt"
    torch.save({"model": {"w": torch.ones(1)}, **ALLOWED}, p, _use_new_zipfile_serialization=not legacy)
    obj = _torch_load(p, "torch_legacy" if legacy else "torch_zip")
    for name, value in ALLOWED.items():
        assert type(obj[name]) is type(value) and obj[name] == value, name


@pytest.mark.parametrize("value, zip_name, legacy_name", [
    (frozenset({1}), "frozenset", "__builtin__.frozenset"),
    (slice(1, 2), "slice", "__builtin__.slice"),
    (range(3), "range", "__builtin__.xrange"),
])
def test_plain_globals_torch_refuses_are_named_by_torch(tmp_path, value, zip_name, legacy_name):
    for legacy, name in ((False, zip_name), (True, legacy_name)):
        p = tmp_path / f"{legacy}.pt"
        torch.save({"model": {"w": torch.ones(1)}, "x": value}, p, _use_new_zipfile_serialization=not legacy)
        with pytest.raises(UnsafeCheckpointError) as exc:
            open_source(p)
        assert str(exc.value) == f"{p}: {calls(name)}"


def test_plain_pickle_loads_plain_values_only(tmp_path):
    p = tmp_path / "meta.pkl"
    p.write_bytes(pickle.dumps({"vocab_size": 3, "itos": {0: "a", 1: "b"}, "x": [1.5, None]}))
    assert load_plain_pickle(p) == {"vocab_size": 3, "itos": {"0": "a", "1": "b"}, "x": [1.5, None]}


# ----------------------------------------------------------------------------
# Gadgets: one per refused kind, opcodes written out
# ----------------------------------------------------------------------------

def _u(s: str) -> bytes:
    """BINUNICODE: a str argument."""
    b = s.encode()
    return b"X" + len(b).to_bytes(4, "little") + b


def gadgets(marker: Path) -> dict[str, bytes]:
    touch = _u(f"touch {marker}")
    run = _u(f"__import__('os').system('touch {marker}')")
    return {
        # GLOBAL os.system, REDUCE (protocol 2)
        "global": b"\x80\x02cos\nsystem\n" + touch + b"\x85R.",
        # STACK_GLOBAL (protocol 4)
        "stack_global": b"\x80\x04" + _u("os") + _u("system") + b"\x93" + touch + b"\x85R.",
        # INST (protocol 0): class and call in one opcode
        "inst": b"(S'touch " + str(marker).encode() + b"'\nios\nsystem\n.",
        # OBJ (protocol 1)
        "obj": b"\x80\x01(cos\nsystem\n" + touch + b"o.",
        "eval": b"\x80\x02cbuiltins\neval\n" + run + b"\x85R.",
        "getattr": b"\x80\x02cbuiltins\ngetattr\ncos\nenviron\n" + _u("get") + b"\x86R.",
        # a torch callable outside torch's allow-list
        "torch_callable": b"\x80\x02ctorch.hub\nload\n" + _u("x") + b"\x85R.",
        # numpy's classic gadget
        "numpy_runstring": (b"\x80\x02cnumpy.testing._private.utils\nrunstring\n" + run
                            + b"}\x86R."),
        # EXT1: a callable from the copyreg extension registry
        "ext": b"\x80\x02\x82\x01)R.",
        # a persistent id: an object from outside the pickle
        "persistent_id": b"\x80\x02" + _u("x") + b"Q.",
        # BUILD with __setstate__ = os.system on an allowed container
        "build_setstate": (b"\x80\x02ccollections\nOrderedDict\n)R}" + _u("__setstate__")
                           + b"cos\nsystem\nsb" + touch + b"b."),
    }


def plain(name: str) -> str:
    return f"refused to unpickle: the pickle calls {name}, {PLAIN}"


def unsafe(what: str) -> str:
    return f"refused to unpickle: {what}{HINT}"


def calls(name: str) -> str:
    return unsafe(f"the pickle calls {name}, which is not a tensor or container")


NOT_A_PICKLE = ("unrecognised content (first bytes {}); expected a safetensors, PyTorch "
                "(.bin/.pt/.pth/.ckpt) or zip file, or a folder with config.json")
TORCH_REFUSED = unsafe("torch's weights-only loader refused it")

#: kind -> (as a raw .pt file, as data.pkl of a torch zip, as a plain pickle)
EXPECTED = {
    "global": (calls("os.system"), calls("os.system"), plain("os.system")),
    "stack_global": (calls("os.system"), unsafe("Unsupported operand 147"), plain("os.system")),
    "inst": (NOT_A_PICKLE.format("285327746f756368"), unsafe("Unsupported operand 83"),
             plain("os.system")),
    "obj": (NOT_A_PICKLE.format("800128636f730a73"), calls("os.system"), plain("os.system")),
    "eval": (calls("builtins.eval"), calls("eval"), plain("builtins.eval")),
    "getattr": (calls("builtins.getattr"), calls("getattr"), plain("builtins.getattr")),
    "torch_callable": (calls("torch.hub.load"), calls("torch.hub.load"), plain("torch.hub.load")),
    "numpy_runstring": (calls("numpy.testing._private.utils.runstring"),
                        calls("numpy.testing._private.utils.runstring"),
                        plain("numpy.testing._private.utils.runstring")),
    "ext": (unsafe("Unsupported operand 130"), unsafe("Unsupported operand 130"),
            "pickle cannot be read (unregistered extension code 1); it is truncated or corrupt"),
    "persistent_id": (TORCH_REFUSED, TORCH_REFUSED, "refused to unpickle: the pickle refers to outside objects (persistent ids)"),
    "build_setstate": (calls("os.system"), calls("os.system"), plain("collections.OrderedDict")),
}


def _as_torch_zip(path: Path, data_pkl: bytes) -> None:
    """A real torch zip whose ``data.pkl`` is replaced by ``data_pkl``."""
    torch.save({"w": torch.ones(1)}, path)
    with zipfile.ZipFile(path) as zin:
        items = [(info, zin.read(info)) for info in zin.infolist()]
    with zipfile.ZipFile(path, "w") as zout:
        for info, data in items:
            zout.writestr(info, data_pkl if info.filename.endswith("data.pkl") else data)


def _message(exc: Exception, path: Path) -> str:
    prefix = f"{path}: "
    assert str(exc).startswith(prefix), str(exc)
    return str(exc)[len(prefix):]


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_gadget_is_refused_in_every_container_and_never_runs(tmp_path, kind):
    marker = tmp_path / "MARKER"
    raw = gadgets(marker)[kind]
    as_pt, as_zip, as_plain = EXPECTED[kind]
    pt, zp, pkl = tmp_path / "evil.pt", tmp_path / "evil_zip.pt", tmp_path / "meta.pkl"
    pt.write_bytes(raw)
    _as_torch_zip(zp, raw)
    pkl.write_bytes(raw)
    for path, loader, expected in ((pt, open_source, as_pt), (zp, open_source, as_zip),
                                   (pkl, load_plain_pickle, as_plain)):
        with pytest.raises(CheckpointFormatError) as exc:
            loader(path)
        assert _message(exc.value, path) == expected, path.name
        assert (type(exc.value) is UnsafeCheckpointError) == expected.startswith("refused"), path.name
    assert not marker.exists()
