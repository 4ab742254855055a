"""``open_source``: a checkpoint file, sharded index, folder or zip -> the
``TensorSource`` of its format.

Dispatches on ``sniff._file_kind`` (content first, the suffix breaking ties)
to ``SafetensorsSource``, ``TorchSource``, ``ShardedSource``, ``ZipSource``
or ``loaders.llama2c.Llama2cSource``; a folder is read from the file its plan
names (``folder._folder_plan``), with its ``config.json`` or
``model_config.yaml``. A file opened by itself whose content brings no config
(a Hugging Face ``model.safetensors``, a bare state dict) takes the
``config.json`` beside it, named in ``extras["config_file"]``. Reads nothing beyond what those readers read; their
budgets hold. Errors: ``CheckpointFormatError`` (or ``UnsafeCheckpointError``)
naming the file, what was expected and what was found.

Each reader but the safetensors one is imported in the branch that opens its
format: a safetensors file loads no pickle, zip, llama2.c or folder reader.
"""
from __future__ import annotations

from pathlib import Path

from loaders.checkpoint_names import EXPECTED, HF_WEIGHT_FILES
from loaders.errors import CheckpointFormatError
from loaders.sources.safetensors_file import SafetensorsSource
from loaders.sources.sniff import _file_kind
from loaders.tensor_source import TensorSource


def open_source(path: str | Path) -> TensorSource:
    """Open a checkpoint file, sharded index, folder or zip as a ``TensorSource``.

    Raises ``CheckpointFormatError`` (or its subclass ``UnsafeCheckpointError``)
    naming the file, what was expected and what was found. Call ``close()`` on
    the result when done (it deletes a zip's temporary folder).
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointFormatError(p, f"no such file or folder; {EXPECTED}")
    if p.is_dir():
        return _open_folder(p)
    src = _open_file(p)
    beside = p.parent / "config.json"
    if not src.config and beside.is_file():
        # a Hugging Face weight file opened by itself: its model's config sits beside it
        from loaders.sources.folder import _read_json_config  # here: only a file with a config.json beside it

        try:
            src.config = _read_json_config(beside)
        except BaseException:
            src.close()
            raise
        src.extras["config_file"] = beside.name
    return src


def _open_file(p: Path) -> TensorSource:
    # each reader imported in its own branch (the module docstring)
    if p.name.endswith(".index.json"):
        from loaders.sources.sharded import ShardedSource  # here: a sharded index only

        return ShardedSource(p)
    kind = _file_kind(p)
    if kind == "safetensors":
        return SafetensorsSource(p)
    if kind in ("torch_zip", "torch_legacy"):
        from loaders.sources.torch_file import TorchSource  # here: a PyTorch file only

        return TorchSource(p, _kind=kind)
    if kind == "zip":
        from loaders.sources.zip_upload import ZipSource  # here: a zip upload only

        return ZipSource(p)
    if kind == "llama2c":
        from loaders.llama2c import Llama2cSource  # here: a llama2.c export only

        return Llama2cSource(p)
    raise CheckpointFormatError(p, f"unrecognised content; {EXPECTED}")


def _open_folder(d: Path) -> TensorSource:
    from loaders.sources.folder import _folder_plan, _read_json_config, _read_yaml_config  # here: folders only

    plan = _folder_plan(d)
    src = _open_file(plan.target)
    try:
        if plan.config_file is not None and plan.config_file.name == "config.json":
            # a Hugging Face folder's config.json is its config; beside another
            # checkpoint file it fills in only when the file brought none
            if plan.target.name in HF_WEIGHT_FILES or not src.config:
                src.config = _read_json_config(plan.config_file)
        elif plan.config_file is not None and "model_config" not in src.extras:
            src.config = _read_yaml_config(plan.config_file)
        src.extras["folder_file"] = plan.target.name
        if plan.note:
            src.extras["folder_note"] = plan.note
        src.path = str(d)
        return src
    except BaseException:
        src.close()
        raise
