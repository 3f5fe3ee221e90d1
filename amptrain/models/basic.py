"""Small models for small data: ``mlp`` and ``cnn``."""
from __future__ import annotations

import math

import torch
from torch import nn

from ..common.errors import UserError
from .core import ModelInputs, image_channels, parse_options, register, require_positive


class MLP(nn.Module):
    """Flatten, then two hidden ReLU layers."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 256) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(),
                                  nn.Linear(hidden, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


@register("mlp")
def mlp(argument: str, inputs: ModelInputs) -> nn.Module:
    """``mlp[:hidden=256]`` on images or feature vectors (flattened)."""
    spec = f"mlp:{argument}" if argument else "mlp"
    o = parse_options(argument, {"hidden": 256}, spec, positional="hidden")
    require_positive(o, spec, "hidden")
    if inputs.kind == "sequence":
        raise UserError(f"--model {spec} takes images or features; use --model lstm or "
                        "transformer for token sequences")
    if inputs.kind == "tokens":
        raise UserError(f"--model {spec} takes images or features; text for language "
                        f"modelling needs --model gpt (or hf:DIR, a causal LM)")
    return MLP(math.prod(inputs.input_shape), inputs.num_classes, o["hidden"])


def _conv_block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                         nn.ReLU(inplace=True))


def extra_stages(input_size: int | None) -> int:
    """2x down-samplings :class:`SmallCNN` adds for images of side ``input_size`` (the
    smaller of height and width): 0 below 16 pixels, then one per doubling (28 and 32
    pixels: 2; 64: 3)."""
    if not input_size or input_size < 16:
        return 0
    return max(1, math.ceil(math.log2(input_size / 8)))


class SmallCNN(nn.Module):
    """Conv-BN-ReLU blocks (width, 2x, 4x channels) with 2x down-sampling, global average
    pooling and a head; it grows with the input so that the last blocks see a few pixels.

    Up to 15 pixels (digits' 8x8) it is three blocks with one max-pool. From 16 pixels on,
    :func:`extra_stages` adds max-pools: the first right after the first block (which
    spares the expensive second block the full resolution), each further one after the
    third block and followed by a 4x-width block. At 28x28 and 32x32 the blocks then see
    28/14/7/4 (32/16/8/4) pixels, as a LeNet-class net does, instead of 28/28/14: a
    quarter of the compute and a receptive field that covers the digit. The head always
    gets ``4 * width`` features. Pools round up, so any input of at least one pixel fits.
    """

    def __init__(self, in_channels: int, num_classes: int, width: int = 32,
                 input_size: int | None = None) -> None:
        super().__init__()
        extra = extra_stages(input_size)
        layers: list[nn.Module] = [_conv_block(in_channels, width)]
        if extra:
            layers.append(nn.MaxPool2d(2, ceil_mode=True))
        layers += [_conv_block(width, 2 * width), nn.MaxPool2d(2, ceil_mode=bool(extra)),
                   _conv_block(2 * width, 4 * width)]
        for _ in range(extra - 1):
            layers += [nn.MaxPool2d(2, ceil_mode=True), _conv_block(4 * width, 4 * width)]
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


@register("cnn")
def cnn(argument: str, inputs: ModelInputs) -> nn.Module:
    """``cnn[:width=32]``: :class:`SmallCNN` on images, its depth set by their size."""
    spec = f"cnn:{argument}" if argument else "cnn"
    o = parse_options(argument, {"width": 32}, spec, positional="width")
    require_positive(o, spec, "width")
    channels = image_channels(inputs, spec)
    return SmallCNN(channels, inputs.num_classes, o["width"], min(inputs.input_shape[-2:]))
