"""Training state to put back: the whole of it around micro-batch probes, and what one
failed step changed besides gradients before it is redone."""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ..common import nested
from ..precision import Precision


class TrainingSnapshot:
    """Weights (fp32, master copies included), optimizer, loss scaler and RNG, on the CPU.

    Copies live on the CPU so they do not count against the device memory being probed.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 precision: Precision, device: torch.device) -> None:
        self.model, self.optimizer, self.precision = model, optimizer, precision
        self.weights = {k: v.detach().to("cpu", copy=True)
                        for k, v in precision.fp32_state_dict(model).items()}
        self.optimizer_state = _cpu_copy(optimizer.state_dict())
        self.precision_state = copy.deepcopy(precision.state_dict())
        self.device = device
        self.rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def restore(self) -> None:
        """Put everything back as it was when the snapshot was taken."""
        self.model.zero_grad(set_to_none=True)
        self.optimizer.zero_grad(set_to_none=True)
        self.precision.load_fp32_state_dict(self.model, self.weights)
        # load_state_dict may keep references to the tensors it is given: hand it a copy.
        self.optimizer.load_state_dict(copy.deepcopy(self.optimizer_state))
        self.precision.load_state_dict(copy.deepcopy(self.precision_state))
        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state(self.cuda_rng, self.device)


class StepStart:
    """What a failed forward/backward changes besides gradients: RNG draws and module
    buffers (BatchNorm running statistics). Saved before every step so that a redo starts
    from exactly the same state; costs one multi-tensor copy and a 5 KB RNG copy per step,
    with no device sync."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.device = device
        self.buffers = list(model.buffers())
        self.saved = [b.detach().clone() for b in self.buffers]
        self.cpu_rng: torch.Tensor | None = None
        self.cuda_rng: torch.Tensor | None = None

    def save(self) -> None:
        """Remember the state at the start of this step."""
        self.cpu_rng = torch.get_rng_state()
        if self.device.type == "cuda":
            self.cuda_rng = torch.cuda.get_rng_state(self.device)
        if self.buffers:
            torch._foreach_copy_(self.saved, self.buffers)

    def restore(self) -> None:
        """Back to the state :meth:`save` remembered."""
        assert self.cpu_rng is not None, "restore() before save()"
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state(self.cuda_rng, self.device)
        if self.buffers:
            torch._foreach_copy_(self.buffers, self.saved)


def _cpu_copy(value: Any) -> Any:
    return nested.map_tensors(lambda tensor: tensor.detach().to("cpu", copy=True), value,
                              leaf=copy.deepcopy)
