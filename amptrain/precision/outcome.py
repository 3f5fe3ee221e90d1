"""What a step's guard decided: skipped or not (kept on the device until asked), and the
halt that ends a run whose steps keep failing."""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..common.errors import TrainingHalted, flag
from .hardware.advice import range_safe_choice


#: True inside a diagnosis's own runs, whose halts must not send the user to diagnose.
_DIAGNOSING: contextvars.ContextVar[bool] = contextvars.ContextVar("amptrain_diagnosing",
                                                                   default=False)


@contextlib.contextmanager
def diagnosing() -> Iterator[None]:
    """Within this block a halt says the diagnosis names the modules (diagnose's runs)."""
    token = _DIAGNOSING.set(True)
    try:
        yield
    finally:
        _DIAGNOSING.reset(token)


def diagnose_hint() -> str:
    """Where to find the modules: the command, or its library entry point."""
    if _DIAGNOSING.get():
        return "the report of this diagnosis"
    return "`amptrain diagnose`" if flag("lr").startswith("--") else \
        "amptrain.diagnose_model(model, train_data, loss_fn=...)"


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

    __slots__ = ("found_inf", "owner", "_host", "_event")

    def __init__(self, found_inf: torch.Tensor | None, host_buffer: torch.Tensor | None = None,
                 owner: int | None = None):
        self.found_inf = found_inf
        self.owner = owner   # which model/optimizer pair stepped (its registration index)
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


@dataclass
class SkipCounter:
    """Skipped optimizer steps (of one optimizer): in all, in a row, and where the current
    run of skips began; and when they must stop training."""

    skipped: int = 0
    consecutive: int = 0
    first_bad_step: int | None = None

    def count(self, skipped: bool, step: int | None) -> None:
        """Account for one confirmed step."""
        if not skipped:
            self.consecutive, self.first_bad_step = 0, None
            return
        self.skipped += 1
        self.consecutive += 1
        if self.first_bad_step is None:
            self.first_bad_step = step

    def check(self, *, scale: float | None, min_scale: float, max_bad_steps: int,
              step: int | None, device: torch.device) -> None:
        """Raise :class:`NonFiniteHalt` when the loss scale (None: no scaler) reached its
        floor, or (no scaler) ``max_bad_steps`` steps in a row were skipped."""
        where = f" at step {step}" if step is not None else ""
        if scale is not None and scale <= min_scale:
            raise NonFiniteHalt(
                f"fp16 loss scale fell to {scale:g} ({flag('min_scale')} {min_scale:g})"
                f"{where} after {self.consecutive} consecutive overflowing steps: the "
                f"model overflows fp16 even unscaled. Train with "
                f"{range_safe_choice(device)}, keep the overflowing modules in fp32 with "
                f"{flag('keep_fp32')}, or find them with {diagnose_hint()}", step)
        if scale is None and self.consecutive >= max_bad_steps:
            first = f" (first at step {self.first_bad_step})" \
                if self.first_bad_step is not None else ""
            raise NonFiniteHalt(
                f"{self.consecutive} consecutive steps had a non-finite loss or gradient"
                f"{where}{first} ({flag('max_bad_steps')} {max_bad_steps}); lower "
                f"{flag('lr')}, set "
                f"{flag('clip_grad_norm')}, or run {diagnose_hint()}", step)
