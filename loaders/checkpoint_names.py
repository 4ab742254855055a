"""The file names and suffixes that mark a checkpoint, in one place.

Standard library only, so the ingest walk (``loaders/ingest.py``, which the
parent of ``loaders/sandbox.py`` runs without importing torch) and the
readers of ``loaders/sources/`` share them.
"""
from __future__ import annotations

#: What a checkpoint may be, quoted in errors about unrecognised input.
EXPECTED = ("expected a safetensors, PyTorch (.bin/.pt/.pth/.ckpt) or zip file, "
            "or a folder with config.json")
#: Suffixes ``loaders.sources.is_checkpoint_candidate`` accepts (with matching magic bytes).
CHECKPOINT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".zip")
#: ``torch.save`` files (zip or legacy pickle; ``.bin`` may also be a llama2.c export).
TORCH_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
#: A Hugging Face folder's weights beside ``config.json``, in the order they are preferred.
HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json",
                   "pytorch_model.bin", "pytorch_model.bin.index.json")
