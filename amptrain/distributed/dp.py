"""``nn.DataParallel``: one process driving all visible GPUs."""
from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from .base import Strategy

log = logging.getLogger("amptrain")


class _AutocastForward(nn.Module):
    """Runs the wrapped module's forward under the precision's autocast.

    DataParallel runs each replica's forward in its own thread, and autocast state is
    thread-local; torch re-enables autocast there but with the default dtype (fp16 on
    CUDA), so a bf16 run would silently compute in fp16. Autocast inside each replica's
    forward gives every replica the mode's own dtype.
    """

    def __init__(self, module: nn.Module, precision: Any) -> None:
        super().__init__()
        self.module = module
        self.precision = precision

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision.autocast():
            return self.module(*args, **kwargs)


class DataParallelStrategy(Strategy):
    """``nn.DataParallel`` over all visible GPUs from one process (DDP is faster)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self._precision: Any = None
        log.warning("--strategy dp: DataParallel runs one Python thread per GPU and copies the "
                    "model every step; DDP is faster: `amptrain train --nproc-per-node N`")

    def wrap_model(self, model: nn.Module, precision: Any,
                      optimizer: torch.optim.Optimizer | None = None) -> nn.Module:
        self._precision = precision
        return model

    def wrap(self, model: nn.Module) -> nn.Module:
        if self._precision is None:
            raise RuntimeError("DataParallelStrategy.wrap_model() must run before wrap()")
        device_ids = None
        if self.device.type == "cuda":
            first = self.device.index or 0
            device_ids = [first] + [i for i in range(torch.cuda.device_count()) if i != first]
        return nn.DataParallel(_AutocastForward(model, self._precision), device_ids=device_ids)
