"""Small models for small data: ``mlp`` and ``cnn``."""
from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import UserError
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
    return MLP(math.prod(inputs.input_shape), inputs.num_classes, o["hidden"])


def _conv_block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                         nn.ReLU(inplace=True))


class SmallCNN(nn.Module):
    """Three conv-BN-ReLU blocks with one 2x down-sampling, global pooling and a head."""

    def __init__(self, in_channels: int, num_classes: int, width: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(_conv_block(in_channels, width),
                                      _conv_block(width, 2 * width),
                                      nn.MaxPool2d(2), _conv_block(2 * width, 4 * width),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


@register("cnn")
def cnn(argument: str, inputs: ModelInputs) -> nn.Module:
    """``cnn[:width=32]``: :class:`SmallCNN` on images."""
    spec = f"cnn:{argument}" if argument else "cnn"
    o = parse_options(argument, {"width": 32}, spec, positional="width")
    require_positive(o, spec, "width")
    return SmallCNN(image_channels(inputs, spec), inputs.num_classes, o["width"])
