"""Vision transformers of every attention variant, and the image data they train on.

Paper B (arXiv 2606.04032) tests its variants on image classification as much
as on language (MNIST, FashionMNIST, CIFAR-10/100, TinyImageNet, ImageNet with
ViT-S/16). :class:`ViT` is the same pre-norm block stack as
:class:`experiments.model.GPT` (same attention variants and head sharing, same
state-dict names ``blocks.N.attn.*``, so the ``qkvscope`` layout reads it),
as an encoder (``causal=False``), after a patch embedding:

* an image ``[C, H, W]`` is cut into ``(H/p) * (W/p)`` patches of ``p x p``;
  each flattened patch (``C*p*p`` values) is a token: ``patch.weight``
  ``[d_model, C*p*p]``;
* a learned ``cls`` token ``[1, 1, d_model]`` is put in front, learned
  positions ``wpe.weight`` ``[n_patches + 1, d_model]`` are added;
* the class logits are ``head(ln_f(x[:, 0]))`` (``head.weight``
  ``[n_classes, d_model]``).

Data (:func:`load_images`): ``digits`` is scikit-learn's bundled 8x8 digits
set (1,797 images, 10 classes, no download); a path is an ``.npz`` with ``x``
``(N, H, W)`` or ``(N, H, W, C)`` and ``y`` ``(N,)``, or a folder of class
subfolders of images (read with Pillow, converted to greyscale or RGB as the
first image is, resized to the first image's size). Pixels are scaled to
[0, 1] by the data's own maximum and standardised per channel with the
training split's mean and std. The train/validation split is fixed by
``split_seed`` (default 0): a stratified 80/20 split, the same for every run.
"""
from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from experiments.model import Block, GPTConfig, make_norm
from loaders.errors import FileError

#: Images are read from these suffixes in a class-folder dataset.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
#: Most images a dataset may hold (a budget: the whole set is held in memory).
MAX_IMAGES = 2_000_000
#: Most pixel values (N * C * H * W) a dataset may hold: 2 GiB of float32.
MAX_VALUES = 2**29
VAL_FRACTION = 0.2


class ImageDataError(FileError):
    """An image dataset that cannot be read (names the file and what is wrong)."""


@dataclass
class ImageData:
    """Standardised images ``train_x`` ``[N, C, H, W]`` float32 with labels ``[N]`` int64,
    the same for validation; ``info`` goes into the run's config.json."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    n_classes: int
    info: dict

    @property
    def image_size(self) -> int:
        return int(self.train_x.shape[-1])

    @property
    def channels(self) -> int:
        return int(self.train_x.shape[1])


def default_patch_size(image_size: int) -> int:
    """A 4 x 4 grid of patches for small images (<= 32 px: digits 8 -> 2, MNIST 28 -> 7,
    CIFAR 32 -> 8), ViT's 16 px patches for larger ones; always a divisor of the side."""
    p = image_size // 4 if image_size <= 32 else 16
    while p > 1 and image_size % p:
        p -= 1
    return max(p, 1)


def _digits() -> tuple[np.ndarray, np.ndarray, dict]:
    from sklearn.datasets import load_digits  # here: scikit-learn loads only for the digits

    d = load_digits()
    x = d.images.astype(np.float32)                       # (1797, 8, 8), values 0..16
    return x, d.target.astype(np.int64), {"dataset": "digits", "source": "sklearn.datasets.load_digits"}


def _npz(path: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    try:
        with np.load(path, allow_pickle=False) as f:      # never unpickle a user's file
            if "x" not in f or "y" not in f:
                raise ImageDataError(path, f"expected arrays 'x' (N, H, W[, C]) and 'y' (N,), found "
                                           f"{', '.join(sorted(f.files)) or 'none'}")
            x, y = f["x"], f["y"]
    except ImageDataError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ImageDataError(path, f"not a readable .npz file ({exc})") from None
    return x, y, {"dataset": str(path), "format": "npz"}


def _folder(path: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    from PIL import Image, UnidentifiedImageError  # here: Pillow loads only for a folder of images

    classes = sorted(p.name for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise ImageDataError(path, f"expected a folder of at least 2 class subfolders of images, found "
                                   f"{len(classes)}")
    files = [(c, f) for i, c in enumerate(classes) for f in sorted((path / c).iterdir())
             if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        raise ImageDataError(path, f"no images ({', '.join(IMAGE_SUFFIXES)}) in its class folders")
    if len(files) > MAX_IMAGES:
        raise ImageDataError(path, f"{len(files):,} images exceed the limit of {MAX_IMAGES:,}")
    images, labels, mode, size = [], [], None, None
    for c, f in files:
        try:
            with Image.open(f) as im:
                if mode is None:
                    mode = "L" if im.mode in ("1", "L", "P", "I", "F", "LA") else "RGB"
                    size = im.size
                    if size[0] * size[1] * len(files) * (1 if mode == "L" else 3) > MAX_VALUES:
                        raise ImageDataError(path, f"{len(files):,} images of {size[0]}x{size[1]} exceed "
                                                   f"the limit of {MAX_VALUES:,} pixel values")
                images.append(np.asarray(im.convert(mode).resize(size), dtype=np.float32))
        except (UnidentifiedImageError, OSError) as exc:
            raise ImageDataError(f, f"not a readable image ({exc})") from None
        labels.append(classes.index(c))
    return np.stack(images), np.asarray(labels, dtype=np.int64), {
        "dataset": str(path), "format": "folder", "classes": classes}


def _as_nchw(x: np.ndarray, source) -> np.ndarray:
    if x.ndim == 3:
        x = x[:, None]                                    # (N, 1, H, W)
    elif x.ndim == 4:
        x = x.transpose(0, 3, 1, 2)                       # (N, H, W, C) -> (N, C, H, W)
    else:
        raise ImageDataError(source, f"expected images of shape (N, H, W) or (N, H, W, C), found {x.shape}")
    if x.shape[2] != x.shape[3]:
        raise ImageDataError(source, f"expected square images, found {x.shape[2]}x{x.shape[3]}")
    return x


def load_images(dataset: str, *, split_seed: int = 0, max_images: int | None = None) -> ImageData:
    """``digits`` or a path (``.npz`` or a folder of class folders), split and standardised."""
    path = Path(dataset).expanduser()
    if dataset == "digits":
        x, y, info = _digits()
    elif path.is_dir():
        x, y, info = _folder(path)
    elif path.is_file() and path.suffix == ".npz":
        x, y, info = _npz(path)
    elif path.exists():
        raise ImageDataError(path, "expected 'digits', an .npz file with x and y, or a folder of class "
                                   "subfolders of images")
    else:
        raise ImageDataError(path, "no such file or folder; expected 'digits', an .npz or a folder of "
                                   "class subfolders")
    x = _as_nchw(np.asarray(x), path)
    y = np.asarray(y).reshape(-1)
    if x.size > MAX_VALUES:
        raise ImageDataError(path, f"{x.size:,} pixel values exceed the limit of {MAX_VALUES:,}")
    if len(y) != len(x) or len(x) < 10:
        raise ImageDataError(path, f"expected one label per image and at least 10 images, found "
                                   f"{len(x)} images and {len(y)} labels")
    if not np.issubdtype(y.dtype, np.integer):
        raise ImageDataError(path, f"expected integer class labels, found dtype {y.dtype}")
    if not np.isfinite(x).all():
        raise ImageDataError(path, "images hold NaN or infinite values")
    classes, y = np.unique(y, return_inverse=True)       # labels 0..K-1 in sorted order
    if max_images is not None and len(x) > max_images:
        keep = np.random.default_rng(split_seed).permutation(len(x))[:max_images]
        x, y = x[keep], y[keep]
    x = x.astype(np.float32) / max(float(x.max()), 1e-12)
    # stratified split, fixed by split_seed: every class keeps VAL_FRACTION of its images
    rng = np.random.default_rng(split_seed)
    val = np.zeros(len(y), dtype=bool)
    for c in range(len(classes)):
        idx = rng.permutation(np.flatnonzero(y == c))
        val[idx[:max(1, int(round(VAL_FRACTION * len(idx))))]] = True
    tx, vx = x[~val], x[val]
    mean = tx.mean(axis=(0, 2, 3), keepdims=True)         # per channel, training split only
    std = tx.std(axis=(0, 2, 3), keepdims=True) + 1e-6
    digest = hashlib.sha256(np.ascontiguousarray(x).tobytes() + y.astype(np.int64).tobytes()).hexdigest()[:16]
    info = dict(info, n_train=int((~val).sum()), n_val=int(val.sum()), n_classes=int(len(classes)),
                image_size=int(x.shape[-1]), channels=int(x.shape[1]), split_seed=split_seed, sha256_16=digest)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    return ImageData(t((tx - mean) / std), t(y[~val]), t((vx - mean) / std), t(y[val]),
                     int(len(classes)), info)


def vision_config(data: ImageData, *, patch_size: int | None = None, **model) -> GPTConfig:
    """A ViT's GPTConfig for ``data``: an encoder over ``(side/p)^2 + 1`` tokens."""
    side = data.image_size
    p = patch_size or default_patch_size(side)
    if side % p:
        raise ValueError(f"patch size {p} does not divide the image side {side}")
    model = dict(model)
    model.pop("block_size", None)
    return GPTConfig(task="image", causal=False, image_size=side, patch_size=p, channels=data.channels,
                     n_classes=data.n_classes, block_size=(side // p) ** 2 + 1,
                     vocab_size=1, tie_embeddings=False, **model)


class ViT(nn.Module):
    """Vision transformer: patches + cls token + positions -> blocks -> head(cls).
    ``forward(images [B, C, H, W], targets=None) -> (logits [B, n_classes], loss)``."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.task != "image" or cfg.causal:
            raise ValueError("a ViT needs GPTConfig(task='image', causal=False)")
        self.cfg = cfg
        p, c = cfg.patch_size, cfg.channels
        self.patch = nn.Linear(c * p * p, cfg.d_model, bias=True)
        self.cls = nn.Parameter(torch.zeros(1, 1, cfg.d_model))
        self.wpe = nn.Embedding(cfg.block_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = make_norm(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.n_classes, bias=True)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        for name, prm in self.named_parameters():
            if name.endswith("attn.o.weight") or name.endswith("mlp.proj.weight"):
                nn.init.normal_(prm, 0.0, 0.02 / (2 * cfg.n_layer) ** 0.5)

    def patches(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W]`` -> ``[B, (H/p)*(W/p), C*p*p]``, patches in row-major order."""
        p = self.cfg.patch_size
        x = F.unfold(images, kernel_size=p, stride=p)     # (B, C*p*p, n_patches)
        return x.transpose(1, 2)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """The residual stream entering block 0: ``[B, n_patches + 1, d_model]``."""
        x = self.patch(self.patches(images))              # (B, n_patches, d)
        x = torch.cat((self.cls.expand(x.shape[0], -1, -1), x), dim=1)
        if x.shape[1] != self.cfg.block_size:
            raise ValueError(f"expected images of {self.cfg.image_size}x{self.cfg.image_size} "
                             f"({self.cfg.block_size - 1} patches), found {images.shape[-2]}x{images.shape[-1]}")
        return x + self.wpe.weight[None]

    def forward(self, images: torch.Tensor, targets: torch.Tensor | None = None,
                cache=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = self.embed(images)
        for i, block in enumerate(self.blocks):
            x = block(x, i, None)
        logits = self.head(self.ln_f(x[:, 0]))            # (B, n_classes)
        loss = F.cross_entropy(logits, targets) if targets is not None else None
        return logits, loss

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def n_attention_params(self) -> int:
        return sum(p.numel() for b in self.blocks for p in b.attn.parameters())

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone().contiguous() for k, v in self.state_dict().items()}

    @classmethod
    def from_state_dict(cls, cfg: GPTConfig, sd) -> "ViT":
        model = cls(cfg)
        own = model.state_dict()
        missing, unexpected = sorted(set(own) - set(sd)), sorted(set(sd) - set(own))
        if missing or unexpected:
            raise KeyError(f"state dict does not match a {cfg.variant} ViT: "
                           f"missing {missing}, unexpected {unexpected}")
        with torch.no_grad():
            for k, t in own.items():
                if tuple(sd[k].shape) != tuple(t.shape):
                    raise ValueError(f"{k}: expected shape {tuple(t.shape)}, found {tuple(sd[k].shape)}")
                t.copy_(sd[k])
        return model
