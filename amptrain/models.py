"""Built-in models: a registry of factories from a spec string to an ``nn.Module``.

Every factory receives the data's shape (:class:`ModelInputs`) so models size their
first and last layers to it. Classifier outputs are called ``head`` in every built-in
model, so ``--keep-fp32 head`` works everywhere.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .errors import UserError


@dataclass(frozen=True)
class ModelInputs:
    """What a model factory knows about the data."""

    num_classes: int
    input_shape: tuple[int, ...]
    kind: str = "image"             # "image", "sequence" or "features"
    vocab_size: int | None = None


ModelFactory = Callable[[str, ModelInputs], nn.Module]
MODELS: dict[str, ModelFactory] = {}


def register(name: str) -> Callable[[ModelFactory], ModelFactory]:
    """Add a factory to :data:`MODELS` under ``name``."""
    def decorate(factory: ModelFactory) -> ModelFactory:
        MODELS[name] = factory
        return factory
    return decorate


def build_model(spec: str, inputs: ModelInputs) -> nn.Module:
    """Build the model named by ``spec`` (``name`` or ``name:argument``) for ``inputs``."""
    name, _, argument = spec.partition(":")
    factory = MODELS.get(name)
    if factory is None:
        raise UserError(f"unknown --model {spec!r}; choose one of {', '.join(sorted(MODELS))}")
    return factory(argument, inputs)


def is_conv_net(model: nn.Module) -> bool:
    """True when the model has 2-d convolutions (channels_last helps those)."""
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


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
    hidden = int(argument) if argument else 256
    if inputs.kind == "sequence":
        raise UserError("--model mlp takes images or features; use --model lstm or "
                        "transformer for token sequences")
    return MLP(math.prod(inputs.input_shape), inputs.num_classes, hidden)


def _conv_block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                         nn.ReLU(inplace=True))


class SmallCNN(nn.Module):
    """Three conv-BN-ReLU blocks with one 2x down-sampling, global pooling and a head."""

    def __init__(self, in_channels: int, num_classes: int, width: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(_conv_block(in_channels, width), _conv_block(width, 2 * width),
                                      nn.MaxPool2d(2), _conv_block(2 * width, 4 * width),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def _image_channels(inputs: ModelInputs, name: str) -> int:
    if inputs.kind != "image" or len(inputs.input_shape) != 3:
        raise UserError(f"--model {name} needs images (channels x height x width); this data "
                        f"has inputs of shape {tuple(inputs.input_shape)}: try --model mlp")
    return inputs.input_shape[0]


@register("cnn")
def cnn(argument: str, inputs: ModelInputs) -> nn.Module:
    width = int(argument) if argument else 32
    return SmallCNN(_image_channels(inputs, "cnn"), inputs.num_classes, width)


from . import range_demos  # noqa: E402,F401  (registers demo-overflow / demo-underflow)
