"""The bombs through the Inspector's upload door, as the page takes them.

``app.pages.inspector._from_upload`` saves the uploaded files with
``upload_names`` / ``pickers.upload_folder`` / ``save_uploads`` and reads them
with ``loaders.sandbox.ingest_checkpoint`` (the reading child, under the
memory and time budgets). Each bomb that arrives as an upload (a
checkpoint file, several files of a folder, a zip) must end as one line naming
the upload, leave the database byte-identical and run no payload, while this
process (the server's stand-in) stays small. The browser test
(``test_dashboard_bombs.py``) drives one upload through Chromium; this one takes
every bomb through the same functions.
"""
from __future__ import annotations

import io
import json
import resource
from pathlib import Path

import pytest
import torch

from app import pickers
from app.pages.inspector import save_uploads, upload_names
from loaders.errors import QkvscopeError
from loaders.sandbox import Sandbox, ingest_checkpoint
from loaders.store import Store
from tests.hostile.corpus import MARKER_NAME, build
from tests.hostile.test_bombs import (NANOGPT_ARGS, YAML_BOMB, _laughs, digest, gpt2_state, overlapping_zip,
                                      st_header)

#: The corpus's cases that are uploads (a checkpoint file or a zip of a folder).
UPLOADED = (".pt", ".bin", ".ckpt", ".pth", ".safetensors", ".zip")


def _zero_stride(d: Path) -> list[Path]:
    state = gpt2_state()
    state["h.0.attn.c_attn.weight"] = torch.zeros(1).expand(73728, 24576)
    torch.save({"model": state}, d / "expand.pt")
    return [d / "expand.pt"]


def _laughs_side(d: Path) -> list[Path]:
    torch.save({"model": gpt2_state(), "laughs": _laughs()}, d / "side.pt")
    return [d / "side.pt"]


def _yaml_beside(d: Path) -> list[Path]:
    torch.save({"model": gpt2_state(), "model_args": NANOGPT_ARGS}, d / "model.pt")
    (d / "model_config.yaml").write_text(YAML_BOMB)
    return [d / "model.pt", d / "model_config.yaml"]


def _sparse_header(d: Path) -> list[Path]:
    """A safetensors whose header claims 4096 x 4096 floats the file does not hold."""
    head, _ = st_header({"h.0.attn.c_attn.weight": [4096, 3 * 4096]})
    (d / "model.safetensors").write_bytes(head + bytes(1000))
    (d / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_head": 32,
                                               "n_embd": 4096, "vocab_size": 16, "n_positions": 8}))
    return [d / "config.json", d / "model.safetensors"]


def _overlapping_zip(d: Path) -> list[Path]:
    return [overlapping_zip(d / "overlap.zip")]


BOMBS = {"zero_stride": _zero_stride, "billion_laughs_side_data": _laughs_side,
         "yaml_alias_bomb_beside": _yaml_beside, "header_past_the_file": _sparse_header,
         "overlapping_zip": _overlapping_zip}


def _upload(store: Store, files: list[Path], reader: Sandbox) -> int:
    """What ``_from_upload`` does with the browser's files (name, a readable file as Streamlit's
    ``UploadedFile`` is)."""
    uploaded = [(p.name, io.BytesIO(p.read_bytes())) for p in files]
    holder, dest = pickers.upload_folder(upload_names(uploaded))
    try:
        target = save_uploads(uploaded, dest)
        report = ingest_checkpoint(store, target, reader=reader)
        if report.checkpoint_id is None:
            raise QkvscopeError(f"{target}: not a checkpoint qkvscope can read ({report.reason or report.status})")
        return int(report.checkpoint_id)
    finally:
        holder.cleanup()


def _cases(root: Path) -> dict[str, list[Path]]:
    cases = {c.name: [c.path] for c in build(root / "corpus")
             if c.path.is_file() and c.path.suffix in UPLOADED}
    for name, make in BOMBS.items():
        d = root / name
        d.mkdir()
        cases[name] = make(d)
    return cases


def test_every_uploaded_bomb_is_one_line_and_changes_nothing(tmp_path):
    db = tmp_path / "db.duckdb"
    store = Store(db)
    good = tmp_path / "good"
    good.mkdir()
    torch.save({"model": gpt2_state(), "model_args": NANOGPT_ARGS}, good / "ok.pt")
    with Sandbox() as reader:
        first = _upload(store, [good / "ok.pt"], reader)       # one stored checkpoint: "unchanged" means something
        cases = _cases(tmp_path)
        assert len(cases) >= 12, sorted(cases)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for name, files in cases.items():
            before = digest(db)
            with pytest.raises(QkvscopeError) as err:
                _upload(store, files, reader)
            line = str(err.value)
            assert "\n" not in line and "Traceback" not in line, (name, line)
            assert any(p.name in line for p in files) or "upload" in line, (name, line)
            assert digest(db) == before, name
        # the reading child took each bomb; this process grew by less than 300 MiB (ru_maxrss: KiB)
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 300 * 1024
        assert _upload(store, [good / "ok.pt"], reader) == first          # the door still works after them
        # and a model_config.yaml uploaded beside its checkpoint is read as its config (it was
        # sniffed as a checkpoint file and refused as "unrecognised content")
        (good / "model_config.yaml").write_text("n_layer: 1\nn_head: 2\n")
        assert _upload(store, [good / "ok.pt", good / "model_config.yaml"], reader) > first
    assert not list(tmp_path.rglob(MARKER_NAME)), "a pickle payload ran"
