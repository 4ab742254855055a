"""Hugging Face model names resolved in a local cache built here (``loaders.hub_names``).

The cache is laid out as ``huggingface_hub`` lays it out (``file_download.py``,
``hf_hub_download``): ``models--org--name/blobs/<git sha1 or sha256>``,
``refs/main`` holding the commit hash, ``snapshots/<commit>/<file>`` relative
symbolic links ``../../blobs/<hash>``; ``huggingface_hub.scan_cache_dir`` reads
it back as a cached repo, so the layout is the library's. No network: every
test runs with ``HF_HUB_OFFLINE=1``.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch

from loaders.checkpoints import open_checkpoint
from loaders.errors import HubModelError
from loaders.hub_names import cache_dir, needed_files, repo_id_of, resolve

COMMIT = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"


def git_blob_sha1(data: bytes) -> str:
    """The name git (and the Hub cache) gives a small file's blob."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def hf_cache(cache: Path, repo_id: str, files: dict[str, bytes], commit: str = COMMIT) -> Path:
    """``files`` (name -> bytes) as huggingface_hub caches repo ``repo_id`` at ``commit``
    on ``main``: LFS files (safetensors, .bin) under their sha256, others under
    their git sha1. Returns the repo folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)            # no newline, as the library writes it
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for name, data in files.items():
        lfs = name.endswith((".safetensors", ".bin"))
        blob = hashlib.sha256(data).hexdigest() if lfs else git_blob_sha1(data)
        (repo / "blobs" / blob).write_bytes(data)
        os.symlink(os.path.join("..", "..", "blobs", blob), snap / name)
    return repo


def tiny_gpt2_files(tmp: Path) -> dict[str, bytes]:
    """config.json and model.safetensors of a 2-layer GPT-2 as transformers writes them."""
    from transformers import GPT2Config, GPT2LMHeadModel   # test-only use of the runtime dependency

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=32,
                               bos_token_id=0, eos_token_id=0)).save_pretrained(tmp, safe_serialization=True)
    return {n: (tmp / n).read_bytes() for n in ("config.json", "model.safetensors")}


@pytest.fixture
def cached_gpt2(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    repo = hf_cache(cache, "openai-community/gpt2", tiny_gpt2_files(tmp_path / "written"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return cache, repo


def test_the_layout_is_huggingface_hubs(cached_gpt2):
    from huggingface_hub import scan_cache_dir

    cache, _ = cached_gpt2
    info = scan_cache_dir(cache)
    assert info.warnings == []
    (repo,) = info.repos
    assert (repo.repo_id, repo.repo_type) == ("openai-community/gpt2", "model")
    (rev,) = repo.revisions
    assert (rev.commit_hash, set(rev.refs)) == (COMMIT, {"main"})
    assert sorted(f.file_name for f in rev.files) == ["config.json", "model.safetensors"]


def test_repo_id_and_cache_folder_resolve_to_the_main_snapshot(cached_gpt2):
    cache, repo = cached_gpt2
    snap = repo / "snapshots" / COMMIT
    assert resolve("openai-community/gpt2") == snap
    assert resolve("models--openai-community--gpt2") == snap         # the folder's name alone
    assert resolve(repo) == snap                                      # the folder itself
    with open_checkpoint(resolve("openai-community/gpt2")) as ckpt:
        assert (ckpt.meta.architecture, ckpt.meta.n_layers, ckpt.meta.n_heads, ckpt.meta.d_model) == (
            "gpt2", 2, 4, 32)


def test_a_path_that_exists_wins_over_a_repo_id(cached_gpt2, tmp_path):
    local = tmp_path / "openai-community" / "gpt2"
    local.mkdir(parents=True)
    assert resolve("openai-community/gpt2") == Path("openai-community/gpt2")


def test_not_cached_and_offline_says_how_to_fetch(cached_gpt2):
    cache, _ = cached_gpt2
    with pytest.raises(HubModelError) as e:
        resolve("BrainChip-AI/qkv-fineweb-300m")
    assert str(e.value) == (
        f"BrainChip-AI/qkv-fineweb-300m: no such file or folder, and BrainChip-AI/qkv-fineweb-300m is "
        f"not in the Hugging Face cache ({cache}); fetch it with --download, or: "
        f"hf download BrainChip-AI/qkv-fineweb-300m")


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.delenv("HF_HOME")
    assert cache_dir() == Path("~/.cache/huggingface/hub").expanduser()


def test_names():
    assert repo_id_of("openai-community/gpt2") == "openai-community/gpt2"
    assert repo_id_of("models--BrainChip-AI--qkv-fineweb-300m") == "BrainChip-AI/qkv-fineweb-300m"
    assert repo_id_of("runs/a/b") is None and repo_id_of("ckpt.pt") is None
    # a name the Hub would refuse is no name: a missing path, for the readers to report
    assert resolve("runs/x--y.pt") == Path("runs/x--y.pt")


def test_download_fetches_only_what_a_checkpoint_needs():
    repo = ["config.json", "model.safetensors", "model.safetensors.index.json", "modeling_x.py",
            "pytorch_model.bin", "tokenizer.json", "onnx/model.safetensors", "README.md"]
    assert needed_files(repo) == ["config.json", "model.safetensors", "model.safetensors.index.json"]
    # pickle weights only where no safetensors exist (read with weights_only=True); never code
    assert needed_files(["config.json", "pytorch_model-00001-of-00002.bin", "pytorch_model.bin.index.json",
                         "configuration_x.py", "training_args.bin"]) == [
        "config.json", "pytorch_model-00001-of-00002.bin", "pytorch_model.bin.index.json"]
    # a paper's released torch checkpoint, where neither exists
    assert needed_files(["README.md", "qkv_keqv_300m_fineweb_edu.pt", "train.py", "training_args.bin"]) == [
        "qkv_keqv_300m_fineweb_edu.pt"]


def test_download_asks_for_the_needed_files_only(tmp_path, monkeypatch):
    """--download, with huggingface_hub's network calls replaced by recorders (no network)."""
    import huggingface_hub

    calls = {}
    files = ["README.md", "config.json", "model.safetensors", "modeling_custom.py", "pytorch_model.bin",
             "tokenizer.json"]
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", lambda self, repo: files)

    def snapshot_download(repo, **kw):
        calls.update(repo=repo, **kw)
        return str(tmp_path / "snap")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve("org/name", download=True) == tmp_path / "snap"
    assert calls == {"repo": "org/name", "cache_dir": tmp_path / "hub",
                     "allow_patterns": ["config.json", "model.safetensors"]}


def test_download_of_a_repo_without_weights_is_refused(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", lambda self, repo: ["config.json", "model.py"])
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: pytest.fail("nothing to fetch"))
    with pytest.raises(HubModelError) as e:
        resolve("org/code-only", download=True)
    assert str(e.value) == ("org/code-only: org/code-only has no safetensors, pytorch_model.bin or torch "
                            "checkpoint (.pt/.pth/.ckpt/.bin) at its top level; nothing to read")
