"""Images as PNG files without torchvision: one image, or a grid of them (numpy + Pillow).

torchvision's CPU wheel does not import next to this torch (see :mod:`amptrain.data.augment`),
so ``save_image``/``make_grid`` are not available; this is the small part of them that
``eval/samples.png`` and ``amptrain generate --samples`` need.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from ..common.outdir import write_bytes


def to_uint8(images: torch.Tensor, low: Sequence[float] | float | None = None,
             high: Sequence[float] | float | None = None) -> np.ndarray:
    """``N x C x H x W`` floats to ``N x H x W x C`` uint8 (C is 1 or 3).

    Values map linearly from [``low``, ``high``] (per channel, or one for all) to 0..255
    and are clipped; without bounds the batch's own minimum and maximum are used.
    """
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"images must be N x C x H x W with C 1 or 3 (got {tuple(images.shape)})")
    x = images.detach().to("cpu", torch.float32)
    channels = x.shape[1]
    lo = x.amin() if low is None else torch.as_tensor(low, dtype=torch.float32)
    hi = x.amax() if high is None else torch.as_tensor(high, dtype=torch.float32)
    lo, hi = lo.reshape(-1, 1, 1), hi.reshape(-1, 1, 1)
    if lo.shape[0] not in (1, channels) or hi.shape[0] not in (1, channels):
        raise ValueError(f"low/high need 1 or {channels} values")
    span = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
    scaled = ((x - lo) / span).nan_to_num(0.0).clamp(0.0, 1.0)
    return (scaled * 255.0).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()


def grid(images: np.ndarray, columns: int | None = None, padding: int = 2,
         background: int = 0) -> np.ndarray:
    """``N x H x W x C`` uint8 images tiled into one ``rows x columns`` image (``H' x W' x
    C``) with ``padding`` pixels of ``background`` around each; ``columns`` defaults to
    the square root of N rounded up."""
    if images.ndim != 4 or images.dtype != np.uint8:
        raise ValueError("grid() takes N x H x W x C uint8 images")
    n, h, w, c = images.shape
    if n == 0:
        raise ValueError("grid() needs at least one image")
    columns = max(1, min(columns or math.ceil(math.sqrt(n)), n))
    rows = math.ceil(n / columns)
    out = np.full((rows * (h + padding) + padding, columns * (w + padding) + padding, c),
                  background, dtype=np.uint8)
    for i in range(n):
        top = padding + (i // columns) * (h + padding)
        left = padding + (i % columns) * (w + padding)
        out[top:top + h, left:left + w] = images[i]
    return out


def save_png(image: np.ndarray, path: str | Path, scale: int = 1, *,
             replace: bool = True) -> Path:
    """Write an ``H x W x C`` (C 1 or 3) uint8 image as PNG, each pixel ``scale`` x
    ``scale`` (nearest neighbour: 8x8 digits stay visible).

    Written as every file of the package is (:func:`amptrain.common.outdir.write_bytes`):
    never through a link, FIFO or device; ``replace=False`` also refuses an existing file
    (``generate``'s images in a directory that holds the user's own)."""
    import io

    from PIL import Image


    if image.ndim != 3 or image.shape[2] not in (1, 3) or image.dtype != np.uint8:
        raise ValueError("save_png() takes an H x W x C uint8 image with C 1 or 3")
    if scale > 1:
        image = image.repeat(scale, axis=0).repeat(scale, axis=1)
    picture = Image.fromarray(image[:, :, 0] if image.shape[2] == 1 else image,
                              mode="L" if image.shape[2] == 1 else "RGB")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    encoded = io.BytesIO()
    picture.save(encoded, format="PNG")
    return write_bytes(path, encoded.getvalue(), replace=replace)


def upscale_for(size: int, target: int = 64) -> int:
    """The nearest-neighbour factor that shows an image of side ``size`` at about
    ``target`` pixels (1 for images already that large)."""
    return max(1, target // max(1, size))


def save_grid(images: torch.Tensor, path: str | Path, *, low: Sequence[float] | float | None = None,
              high: Sequence[float] | float | None = None, columns: int | None = None,
              replace: bool = True) -> Path:
    """``N x C x H x W`` float images as one PNG grid (see :func:`to_uint8` for the value
    mapping); small images are enlarged so that each is about 64 pixels wide. ``replace``
    as for :func:`save_png`."""
    pixels = to_uint8(images, low, high)
    return save_png(grid(pixels, columns), path, scale=upscale_for(min(pixels.shape[1:3])),
                    replace=replace)


__all__ = ["grid", "save_grid", "save_png", "to_uint8", "upscale_for"]
