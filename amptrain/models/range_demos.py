"""Two small models whose values leave fp16's range on purpose (for ``diagnose`` demos).

``demo-overflow`` multiplies its hidden activations by 1e5 (above fp16's max 65504), and
``demo-underflow`` by 1e-4, which pushes the gradients flowing back through it below
fp16's smallest normal. ``demo-overflow:1e6`` sets another factor.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..common.errors import UserError
from .core import ModelInputs, register


class Scale(nn.Module):
    """Multiplies by a constant: a stand-in for a layer whose outputs leave fp16's range."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor

    def extra_repr(self) -> str:
        return f"factor={self.factor:g}"


class RangeDemo(nn.Module):
    """Flatten -> Linear -> Tanh (``body``), then ``scale``, then a Linear ``head``."""

    def __init__(self, in_features: int, num_classes: int, factor: float, hidden: int = 64):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.Tanh())
        self.scale = Scale(factor)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.scale(self.body(x)))


def _demo(argument: str, inputs: ModelInputs, default: float, name: str) -> nn.Module:
    try:
        factor = float(argument) if argument else default
    except ValueError:
        raise UserError(f"--model {name}:{argument}: the argument is the scale factor, "
                        f"e.g. {name}:{default:g}") from None
    if inputs.kind == "sequence":
        raise UserError(f"--model {name} takes images or features, not token sequences")
    return RangeDemo(math.prod(inputs.input_shape), inputs.num_classes, factor)


@register("demo-overflow")
def demo_overflow(argument: str, inputs: ModelInputs) -> nn.Module:
    return _demo(argument, inputs, 1e5, "demo-overflow")


@register("demo-underflow")
def demo_underflow(argument: str, inputs: ModelInputs) -> nn.Module:
    return _demo(argument, inputs, 1e-3, "demo-underflow")
