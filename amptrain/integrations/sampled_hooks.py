"""The callbacks' hooks that stay attached for the whole run but take values only on the
steps a :class:`~.core.DiagnoseSession` samples: range statistics (gradients unscaled by the
loss scale) and the non-finite watch. On the other steps each hook returns at once."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..diagnose.ranges import RangeRecorder, RangeStats
from ..precision.nonfinite import NonFiniteWatch

#: Streams whose values a loss scale multiplies (recorded unscaled).
GRADIENTS = ("gradient", "param_gradient")

class SampledStats(RangeStats):
    """Range statistics that only take values while ``active``; gradient values are
    multiplied by ``grad_factor`` (1 / loss scale) first."""

    def __init__(self) -> None:
        super().__init__()
        self.active = False
        self.grad_factor: torch.Tensor | None = None

    def add_peak(self, key: Any, tensor: torch.Tensor) -> None:
        if self.active:
            super().add_peak(key, tensor)

    def add(self, key: Any, tensor: torch.Tensor) -> None:
        if not self.active:
            return
        if key[1] in GRADIENTS and self.grad_factor is not None:
            tensor = tensor.detach().float() * self.grad_factor
        super().add(key, tensor)


class SampledRecorder(RangeRecorder):
    """A :class:`RangeRecorder` whose hooks return at once unless its stats are active."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.stats: SampledStats = SampledStats()

    def _forward_hook(self, label: str) -> Any:
        record = super()._forward_hook(label)

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if self.stats.active:
                record(module, args, output)
        return hook


class GatedWatch(NonFiniteWatch):
    """A :class:`NonFiniteWatch` whose hooks return at once unless ``active``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.active = False
        super().__init__(*args, **kwargs)

    def _forward_hook(self, label: str) -> Any:
        watch = super()._forward_hook(label)

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if self.active:
                watch(module, args, output)
        return hook


__all__ = ["GRADIENTS", "GatedWatch", "SampledRecorder", "SampledStats"]
