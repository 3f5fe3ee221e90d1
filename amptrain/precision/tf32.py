"""Process-global maths switches that a precision mode sets: TF32 for fp32 matmul and
convolution on CUDA. They live outside any model, so whoever alternates steps of several
precisions in one process (``compare``'s interleaved timing) must restore each mode's."""
from __future__ import annotations

import logging

import torch

from ..common.errors import warn
from .modes import ModeSpec

log = logging.getLogger("amptrain")


def set_tf32(spec: ModeSpec, device: torch.device) -> None:
    """TF32 on for ``tf32``, off for ``32-true``, PyTorch's defaults for the other modes."""
    if device.type != "cuda":
        if spec.tf32:
            warn(f"tf32 has no effect on {device.type}: training as 32-true")
        return
    # Set every time: these switches are process-global and a previous run in the same
    # process (compare) may have changed them.
    matmul, cudnn = (True, True) if spec.tf32 else \
        (False, False) if spec.strict_fp32 else (False, True)
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = cudnn
    if spec.tf32 and torch.cuda.get_device_capability(device)[0] < 8:
        warn("this GPU has no TF32 (compute capability < 8.0): tf32 trains as 32-true")


class MathSwitches:
    """The switches as one Trainer's precision left them, to put back before its steps."""

    def __init__(self) -> None:
        self.values = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)

    def apply(self) -> None:
        """Restore the captured switches."""
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.values
