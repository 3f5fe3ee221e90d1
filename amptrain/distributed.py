"""Process-group strategies: how a model is wrapped, and how ranks agree.

The Trainer only talks to the :class:`Strategy` protocol; the single-device strategy
is the trivial implementation that a distributed one extends.
"""
from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import torch
from torch import nn


class Strategy:
    """One process on one device (the default)."""

    world_size = 1
    rank = 0

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @property
    def is_main(self) -> bool:
        """True on the rank that writes logs, reports and checkpoints."""
        return self.rank == 0

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module the training loop calls (e.g. a DDP wrapper around ``model``)."""
        return model

    def accumulation_context(self, model: nn.Module, boundary: bool) -> ContextManager:
        """Context for one micro-batch's forward/backward; off-boundary ones skip grad sync."""
        return contextlib.nullcontext()

    def reduce_mean(self, value: torch.Tensor) -> torch.Tensor:
        """Mean of a tensor over ranks (identity for one process)."""
        return value

    def reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        """Sum of a tensor over ranks (identity for one process)."""
        return value

    def gather(self, value: torch.Tensor) -> torch.Tensor:
        """Concatenate a 1-d tensor from all ranks along dim 0 (identity for one process)."""
        return value

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's value on every rank."""
        return value

    def barrier(self) -> None:
        """Wait for all ranks."""

    def teardown(self) -> None:
        """Release the process group, if this strategy made one."""
