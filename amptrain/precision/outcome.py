"""What a step's guard decided: skipped or not (kept on the device until asked), and the
halt that ends a run whose steps keep failing."""
from __future__ import annotations

import torch

from ..errors import TrainingHalted


class NonFiniteHalt(TrainingHalted):
    """Training stopped: too many consecutive non-finite steps, or the loss scale hit its floor."""

    def __init__(self, message: str, step: int | None) -> None:
        super().__init__(message)
        self.step = step


class StepOutcome:
    """Whether an optimizer step was skipped, kept on the device until someone asks.

    On CUDA the flag is copied to pinned host memory without blocking; by the time the
    Trainer reads it (one step later) the copy has landed, so the read does not stall.
    """

    __slots__ = ("found_inf", "_host", "_event")

    def __init__(self, found_inf: torch.Tensor | None, host_buffer: torch.Tensor | None = None):
        self.found_inf = found_inf
        self._host: torch.Tensor | None = None
        self._event: torch.cuda.Event | None = None
        if found_inf is not None and found_inf.is_cuda and host_buffer is not None:
            host_buffer.copy_(found_inf.detach().reshape(()), non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
            self._host = host_buffer

    def skipped(self) -> bool:
        """True when the optimizer did not update the weights (reads the flag)."""
        if self.found_inf is None:
            return False
        if self._event is not None:
            self._event.synchronize()
            assert self._host is not None  # set together with the event
            return bool(self._host.item())
        return bool(self.found_inf.item())
