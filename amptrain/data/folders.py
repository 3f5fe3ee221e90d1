"""``imagefolder:DIR``: one subfolder of images per class, decoded with Pillow.

Streamed: only the file list is held; each image is decoded when its batch is read, in
DataLoader worker processes (``--num-workers``), and travels as uint8 until the device,
where :class:`~amptrain.data.augment.DeviceImages` standardises (and augments) the batch.
The per-channel statistics, and with ``channels=auto`` whether the images are grayscale,
come from a fixed sample of :data:`STATS_SAMPLE` training images, so start-up does not
grow with the folder.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..common.errors import UserError
from .augment import DeviceImages
from .core import SPLIT_SEED, DataBundle, DataOptions, path_and_options, register, split_indices

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm",
                  ".pgm", ".pbm"}
GRAY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F"}
#: Subfolders that, next to ``train/``, hold the validation split (first found wins).
VAL_DIRS = ("val", "valid", "validation", "test")
#: Training images decoded at start-up for the channel statistics.
STATS_SAMPLE = 256


class ImageFiles(Dataset):
    """Image files decoded on demand to uint8 ``C x size x size`` (and their labels);
    :attr:`on_device` finishes each batch on the device."""

    def __init__(self, samples: list[tuple[Path, int]], size: int, channels: int, spec: str,
                 on_device: DeviceImages) -> None:
        self.samples = samples
        self.size = size
        self.channels = channels
        self.spec = spec
        self.on_device = on_device

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        image, _ = decode(path, self.size, self.spec)
        return torch.from_numpy(_to_channels(image, self.channels).copy()), label


def class_folders(root: Path) -> list[Path]:
    """The visible subfolders of ``root``, sorted by name."""
    return sorted((p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")),
                  key=lambda p: p.name)


def image_files(folder: Path) -> list[Path]:
    """Image files anywhere below ``folder`` (by extension), sorted for a stable order."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in
                  IMAGE_SUFFIXES and not p.name.startswith("."))


def scan(root: Path, class_names: list[str] | None, spec: str) -> list[tuple[Path, int]]:
    """(file, class index) for every image; classes are ``class_names`` or the folders."""
    folders = class_folders(root)
    if not folders:
        raise UserError(f"--data {spec}: {root} has no class subfolders (expected "
                        f"{root}/<class>/<image>.png)")
    names = class_names or [f.name for f in folders]
    index = {n: i for i, n in enumerate(names)}
    samples = []
    for folder in folders:
        if folder.name not in index:
            raise UserError(f"--data {spec}: class folder {folder.name!r} in {root} is not one "
                            f"of the training classes ({', '.join(names[:8])})")
        files = image_files(folder)
        if not files:
            raise UserError(f"--data {spec}: class folder {folder} has no images "
                            f"({', '.join(sorted(IMAGE_SUFFIXES))})")
        samples += [(f, index[folder.name]) for f in files]
    return samples


def decode(path: Path, size: int, spec: str) -> tuple[np.ndarray, bool]:
    """One image as size x size (x 3) uint8 and whether it is grayscale.

    Resized so that the shorter side is ``size``, then centre-cropped: no distortion.
    """
    from PIL import Image, ImageOps

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                gray = img.mode in GRAY_MODES
                img = img.convert("L" if gray else "RGB")
                img = ImageOps.fit(img, (size, size), Image.Resampling.BILINEAR)
                return np.asarray(img, dtype=np.uint8), gray
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError,
            Image.DecompressionBombWarning) as exc:
        raise UserError(f"--data {spec}: cannot decode image {path} "
                        f"({exc.__class__.__name__}); remove or replace it") from None


def load_images(samples: list[tuple[Path, int]], size: int, channels: int | None, spec: str
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode all samples: (N x C x size x size floats in [0, 1], labels).

    ``channels`` None: 1 when every image is grayscale, else 3."""
    decoded = [decode(path, size, spec) for path, _ in samples]
    channels = channels or (1 if all(gray for _, gray in decoded) else 3)
    arrays = [_to_channels(a, channels) for a, _ in decoded]
    x = torch.from_numpy(np.stack(arrays).astype(np.float32) / 255.0)
    y = torch.tensor([label for _, label in samples], dtype=torch.long)
    return x, y


def _to_channels(image: np.ndarray, channels: int) -> np.ndarray:
    """H x W (gray) or H x W x 3 (RGB) uint8 to C x H x W with C = ``channels``."""
    if image.ndim == 2:
        image = image[None]
        return np.repeat(image, 3, axis=0) if channels == 3 else image
    image = image.transpose(2, 0, 1)
    if channels == 1:  # ITU-R 601 luma, as Pillow's convert("L")
        luma = image[0] * 0.299 + image[1] * 0.587 + image[2] * 0.114
        return np.clip(np.rint(luma), 0, 255).astype(np.uint8)[None]
    return image


@register("imagefolder")
def imagefolder(argument: str, options: DataOptions) -> DataBundle:
    """``imagefolder:DIR[,size=32][,channels=auto|1|3]``: DIR/<class>/<image>, or
    DIR/train/<class>/... with DIR/val/<class>/... (or valid/, validation/, test/) as the
    validation split; without one a seeded share of the images validates.

    Every image is resized (shorter side to ``size``, centre crop) to size x size, made
    grayscale (1 channel) when the sampled training images all are, RGB otherwise, and
    standardised per channel with the training split's statistics (see the module
    docstring); ``--augment`` applies to training batches.
    """
    spec = f"imagefolder:{argument}"
    root, o = path_and_options(argument, {"size": 32, "channels": "auto"}, spec, what="directory")
    if o["channels"] not in ("auto", "1", "3"):
        raise UserError(f"--data {spec}: channels must be auto, 1 or 3 (got {o['channels']})")
    if o["size"] < 1:
        raise UserError(f"--data {spec}: size must be >= 1 (got {o['size']})")
    channels = None if o["channels"] == "auto" else int(o["channels"])
    train_root, val_root = root, None
    if (root / "train").is_dir():
        train_root = root / "train"
        val_root = next((root / d for d in VAL_DIRS if (root / d).is_dir()), None)
    known = (options.fitted or {}).get("class_names")
    train_samples = scan(train_root, known, spec)
    class_names = known or [f.name for f in class_folders(train_root)]
    if len(class_names) < 2:
        raise UserError(f"--data {spec}: needs at least two class folders, found "
                        f"{len(class_names)} in {train_root}")
    fitted = options.fitted or {}
    if channels is None and "mean" in fitted:
        channels = len(fitted["mean"])  # as the training run decided
    if val_root is not None:
        val_samples = scan(val_root, class_names, spec)
    else:
        train_idx, val_idx = split_indices(len(train_samples), options.val_fraction)
        train_samples, val_samples = ([train_samples[i] for i in train_idx.tolist()],
                                      [train_samples[i] for i in val_idx.tolist()])
    channels, mean, std = _statistics(train_samples, o["size"], channels, fitted, spec)
    augment = options.images.augment
    train = ImageFiles(train_samples, o["size"], channels, spec,
                       DeviceImages(mean, std, augment))
    val = ImageFiles(val_samples, o["size"], channels, spec, DeviceImages(mean, std))
    return DataBundle(train, val, len(class_names), (channels, o["size"], o["size"]), "image",
                      class_names=class_names,
                      fitted={"mean": mean, "std": std, "class_names": class_names})


def _statistics(samples: list[tuple[Path, int]], size: int, channels: int | None,
                fitted: dict[str, Any], spec: str) -> tuple[int, list[float], list[float]]:
    """(channels, per-channel mean, std): a training run's, or from a seeded sample."""
    if "mean" in fitted and "std" in fitted and channels is not None:
        return channels, list(fitted["mean"]), list(fitted["std"])
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(SPLIT_SEED))
    picked = [samples[i] for i in sorted(order[:STATS_SAMPLE].tolist())]
    x, _ = load_images(picked, size, channels, spec)
    flat = x.transpose(0, 1).reshape(x.shape[1], -1).double()
    return (int(x.shape[1]), flat.mean(dim=1).tolist(),
            flat.std(dim=1).clamp(min=1e-6).tolist())
