"""Inspector uploads: written to disk in chunks straight from the upload (no
``getvalue()`` copy held beside it), names the file system cannot take are one
line, and a failed upload leaves no temporary folder behind."""
from __future__ import annotations

import errno
import io
import tempfile
from pathlib import Path

import pytest

from app import pickers
from app.pages.inspector import held_upload
from loaders.errors import QkvscopeError


class Upload(io.BytesIO):
    """Streamlit's ``UploadedFile`` is a BytesIO; copying it whole is what must not happen."""

    def getvalue(self):
        raise AssertionError("the upload was copied whole")


def upload_folders() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob(pickers.UPLOAD_PREFIX + "*")}


def test_an_upload_is_streamed_to_its_file(tmp_path):
    data = bytes(range(256)) * 12_289                # 3 MiB and a bit: several chunks
    up = Upload(data)
    up.seek(100)                                     # wherever the uploader left it
    holder, target = held_upload([("model.safetensors", up)])
    try:
        assert target.name == "model.safetensors" and target.read_bytes() == data
    finally:
        holder.cleanup()


def test_two_205_character_names_make_a_folder_the_file_system_takes():
    before = upload_folders()
    a, b = "a" * 192 + ".safetensors", "c" * 200 + ".json"          # 204 and 205 characters
    holder, target = held_upload([(a, Upload(b"w")), (b, Upload(b"{}"))])
    assert len(target.name.encode()) == pickers.NAME_MAX and target.name.endswith("...")
    assert target.name.startswith(a + " + ccc")
    assert sorted(p.name for p in target.iterdir()) == sorted([a, b])
    holder.cleanup()
    assert upload_folders() == before


def test_a_name_longer_than_the_file_system_takes_is_one_line_and_leaves_no_folder():
    before = upload_folders()
    name = "m" * 290 + ".safetensors"
    with pytest.raises(QkvscopeError) as exc:
        held_upload([(name, Upload(b"w"))])
    assert str(exc.value) == (f"uploaded file name {'m' * 40!r}... is 302 bytes long; the server's file "
                              "system takes at most 255: rename the file")
    assert upload_folders() == before


def test_a_full_disk_during_an_upload_is_one_line_and_leaves_no_folder(monkeypatch):
    def full(src, dst, length=0):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr("app.pages.inspector.shutil.copyfileobj", full)
    before = upload_folders()
    with pytest.raises(QkvscopeError) as exc:
        held_upload([("model.safetensors", Upload(b"w"))])
    assert str(exc.value) == "the upload could not be written on the server: No space left on device"
    assert upload_folders() == before
