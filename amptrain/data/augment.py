"""Image batches on the device: uint8 in, standardised floats out, augmented when training.

Images travel as uint8 (4x smaller than float32) until they reach the device; there
:class:`DeviceImages` turns a whole micro-batch into floats, standardises it per channel
and, for training batches, augments it with batched torch ops -- no per-image Python
work, on the GPU when there is one. torchvision's transforms would be the obvious library,
but its CPU wheel does not import next to this torch (``operator torchvision::nms does not
exist``), and per-image CPU transforms would be the slow path anyway.

``--augment``:

* ``none`` -- standardise only;
* ``flip`` -- random horizontal flip;
* ``crop-flip`` -- zero-pad by size/8 and crop back at a random offset, plus flip (the
  CIFAR standard);
* ``rrc-flip`` -- random resized crop (8-100% of the area, aspect 3/4..4/3, bilinear)
  plus flip (the ImageNet standard).

Validation batches are never augmented (they are the centre crop the loader decoded).
The randomness comes from a generator seeded with (seed, epoch, window, micro-batch), so
augmentation is reproducible and a resumed run draws exactly what the uninterrupted one
did, whatever the number of DataLoader workers.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch.nn import functional as F

from ..common.choices import AUGMENTATIONS


def generator_for(device: torch.device, key: Sequence[int]) -> torch.Generator:
    """A generator on ``device`` seeded from ``key`` (seed, epoch, window, micro)."""
    seed = 0
    for part in key:
        seed = (seed * 1_000_003 + int(part)) % (2 ** 63 - 1)
    return torch.Generator(device=device).manual_seed(seed)


class DeviceImages:
    """Turns ``(uint8 images N x C x H x W, labels)`` into model inputs on the device."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], augment: str = "none"
                 ) -> None:
        if augment not in AUGMENTATIONS:
            raise ValueError(f"augment must be one of {AUGMENTATIONS}")
        self.mean = list(mean)
        self.std = list(std)
        self.augment = augment

    def __call__(self, batch: Any, *, training: bool, key: Sequence[int]) -> Any:
        x, *rest = batch
        x = x.float().div_(255.0)
        if training and self.augment != "none":
            x = augment(x, self.augment, generator_for(x.device, key))
        m = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        s = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        return (x.sub_(m).div_(s), *rest)


def augment(x: torch.Tensor, how: str, generator: torch.Generator) -> torch.Tensor:
    """``how`` applied to a float batch ``N x C x H x W`` (see the module docstring)."""
    if how == "crop-flip":
        x = pad_crop(x, max(1, x.shape[-1] // 8), generator)
    elif how == "rrc-flip":
        x = random_resized_crop(x, generator)
    return flip(x, generator)


def _uniform(n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.rand(n, generator=generator, device=device)


def flip(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Each image mirrored left-right with probability 1/2."""
    mask = _uniform(len(x), generator, x.device) < 0.5
    return torch.where(mask.view(-1, 1, 1, 1), x.flip(-1), x)


def pad_crop(x: torch.Tensor, pad: int, generator: torch.Generator) -> torch.Tensor:
    """Zero-pad by ``pad`` and crop back to the original size at a random offset per image
    (exact pixels: one gather, no interpolation)."""
    n, c, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    dy = (_uniform(n, generator, x.device) * (2 * pad + 1)).long().clamp(max=2 * pad)
    dx = (_uniform(n, generator, x.device) * (2 * pad + 1)).long().clamp(max=2 * pad)
    rows = (torch.arange(h, device=x.device).view(1, h) + dy.view(n, 1)).view(n, 1, h, 1)
    cols = (torch.arange(w, device=x.device).view(1, w) + dx.view(n, 1)).view(n, 1, 1, w)
    batch = torch.arange(n, device=x.device).view(n, 1, 1, 1)
    channel = torch.arange(c, device=x.device).view(1, c, 1, 1)
    return padded[batch, channel, rows, cols]


def random_resized_crop(x: torch.Tensor, generator: torch.Generator,
                        scale: tuple[float, float] = (0.08, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> torch.Tensor:
    """A random crop of each image (area share in ``scale``, aspect in ``ratio``) resized
    back to the full size, all images in one ``grid_sample``."""
    n = len(x)
    area = scale[0] + (scale[1] - scale[0]) * _uniform(n, generator, x.device)
    log_ratio = math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * _uniform(
        n, generator, x.device)
    aspect = torch.exp(log_ratio)
    width = torch.sqrt(area * aspect).clamp(max=1.0)    # shares of the full width/height
    height = torch.sqrt(area / aspect).clamp(max=1.0)
    cx = (2 * _uniform(n, generator, x.device) - 1) * (1 - width)   # centres in [-1, 1]
    cy = (2 * _uniform(n, generator, x.device) - 1) * (1 - height)
    theta = torch.zeros(n, 2, 3, device=x.device, dtype=x.dtype)
    theta[:, 0, 0], theta[:, 0, 2] = width, cx
    theta[:, 1, 1], theta[:, 1, 2] = height, cy
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection",
                         align_corners=False)


__all__ = ["AUGMENTATIONS", "DeviceImages", "augment", "flip", "generator_for", "pad_crop",
           "random_resized_crop"]
