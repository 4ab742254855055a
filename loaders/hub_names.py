"""Hugging Face model names: a repo id (``openai-community/gpt2``) or a cache
folder (``models--openai-community--gpt2``) resolved to the snapshot folder
that holds its files, in the local cache, with ``huggingface_hub``.

The cache (``huggingface_hub``'s layout, ``file_download.py``):
``<cache>/models--<org>--<name>/`` holds ``blobs/<hash>`` (the files' contents:
the git sha1 of a small file, the sha256 of an LFS one), ``refs/<branch>`` (a
text file holding the commit hash the branch points at) and
``snapshots/<commit>/<path>``, a relative symbolic link
``../../blobs/<hash>`` per file. ``resolve`` reads the ref ``main`` and gives
``snapshots/<commit>``, the folder every reader of ``loaders.sources`` opens
like any Hugging Face folder. The cache is ``$HF_HUB_CACHE``, else
``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``, read when called.

Rules:

* A path that exists always wins over a repo id: ``runs/gpt2`` on disk is that
  folder. An existing ``models--org--name`` folder is read at its ``main`` ref.
* Nothing is fetched unless ``download=True`` (``--download`` on the command
  line). Then only the files a checkpoint needs, at the top level of the repo:
  ``config.json``, ``*.safetensors`` and their ``*.safetensors.index.json``;
  only a repo without safetensors gets its ``pytorch_model*.bin`` (and index),
  and one without either its torch checkpoint files (``*.pt``: the papers
  release theirs so), which ``loaders.sources`` reads with
  ``torch.load(weights_only=True)``. Never model code (``*.py``), never
  ``trust_remote_code``.
* Offline and not cached: ``HubModelError``, one line saying so and how to
  fetch it (``--download``, or ``hf download ORG/NAME``).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from loaders.errors import HubModelError

#: ``org/name`` as the Hub spells repo ids (letters, digits, ``-``, ``_``, ``.``).
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*$")
_CACHE_FOLDER = re.compile(r"^models--(?P<org>[^/]+?)--(?P<name>[^/]+)$")


def cache_dir() -> Path:
    """``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path("~/.cache/huggingface")
    return Path(home).expanduser() / "hub"


def repo_id_of(name: str) -> str | None:
    """The repo id ``name`` spells (``org/name`` or ``models--org--name``), else None."""
    m = _CACHE_FOLDER.match(name)
    if m:
        return f"{m.group('org')}/{m.group('name')}"
    return name if _REPO_ID.match(name) else None


def is_cache_folder(path: Path) -> bool:
    """A ``models--org--name`` folder of the cache (``refs/`` and ``snapshots/`` in it)."""
    return bool(_CACHE_FOLDER.match(path.name)) and (path / "snapshots").is_dir()


def resolve(name: str | Path, *, download: bool = False) -> Path:
    """The path to read for ``name``: itself when it exists (a cache folder: its
    ``main`` snapshot), else the cached snapshot of the repo id it spells,
    fetched first when ``download``. ``HubModelError`` otherwise."""
    text = str(name)
    path = Path(text).expanduser()
    if path.exists():
        if path.is_dir() and is_cache_folder(path):
            return _cached(repo_id_of(path.name), path.parent, text)
        return path
    repo = repo_id_of(text)
    if repo is None or not _valid(repo):
        return path                         # not a name: the readers say "no such file or folder"
    cache = cache_dir()
    if download:
        return _download(repo, cache, text)
    return _cached(repo, cache, text)


def _valid(repo: str) -> bool:
    """Whether the Hub would accept ``repo`` as a repo id (``huggingface_hub``'s own check:
    no ``--`` or ``..``, at most 96 characters, ...)."""
    # imported here: huggingface_hub is needed only when a model name is given
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError:
        return False
    return True


def _cached(repo: str, cache: Path, shown: str) -> Path:
    # imported here: huggingface_hub is needed only when a model name is given
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError:
        raise HubModelError(
            shown, f"no such file or folder, and {repo} is not in the Hugging Face cache ({cache}); "
                   f"fetch it with --download, or: hf download {repo}") from None


def needed_files(repo_files: list[str]) -> list[str]:
    """The files of a repo a checkpoint needs (module docstring): top-level ``config.json``
    and the first weights found of: safetensors (+ index); ``pytorch_model*.bin`` (+ index);
    torch checkpoint files (``*.pt``, ``*.pth``, ``*.ckpt``, ``*.bin``: a paper's released
    ``final_model.pt``). The pickles are read with ``torch.load(weights_only=True)``."""
    top = [f for f in repo_files if "/" not in f]
    for kind in (r".+\.safetensors(\.index\.json)?", r"pytorch_model(-\d+-of-\d+)?\.bin(\.index\.json)?",
                 r".+\.(pt|pth|ckpt|bin)"):
        weights = [f for f in top if re.fullmatch(kind, f) and f != "training_args.bin"]
        if weights:
            break
    return sorted(f for f in top if f == "config.json") + sorted(weights)


def _download(repo: str, cache: Path, shown: str) -> Path:
    # imported here: huggingface_hub's network client, only for --download
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        files = needed_files(HfApi().list_repo_files(repo))
        if not any(f != "config.json" for f in files):
            raise HubModelError(shown, f"{repo} has no safetensors, pytorch_model.bin or torch checkpoint "
                                       f"(.pt/.pth/.ckpt/.bin) at its top level; nothing to read")
        return Path(snapshot_download(repo, cache_dir=cache, allow_patterns=files))
    except RepositoryNotFoundError:
        raise HubModelError(shown, f"no model {repo} on the Hugging Face Hub (or it is private)") from None
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HubModelError(shown, f"cannot fetch {repo} from the Hugging Face Hub ({first})") from None
