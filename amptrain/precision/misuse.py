"""What a library caller can do out of order with a :class:`~amptrain.precision.Precision`,
refused with amptrain's own error instead of torch's assert or shape error.

* a loss that is not one number (``backward`` of a per-sample loss);
* ``step`` with no ``backward`` since the last step (torch's scaler asserts "No inf checks
  were recorded"; without a scaler the step silently does nothing);
* a second model/optimizer pair set up in a mode with fp32 master weights, whose masters
  belong to the first pair (one Precision per pair for now, e.g. a GAN's two networks).
"""
from __future__ import annotations

import torch

from ..errors import UserError


class CallOrder:
    """Tracks ``setup``/``backward``/``step`` of one Precision and refuses misuse."""

    def __init__(self) -> None:
        self.pairs = 0              # model/optimizer pairs set up
        self.backward_since_step = False

    def setup(self, name: str, master_weights: bool, has_optimizer: bool) -> None:
        """Called by ``Precision.setup`` before it changes anything."""
        if not has_optimizer:
            return
        if master_weights and self.pairs:
            raise UserError(f"this Precision ({name}) already keeps fp32 master weights for "
                            f"one model and optimizer; a second pair needs a Precision of its "
                            f"own (Precision('{name}') per model, e.g. a GAN's generator and "
                            f"discriminator)")
        self.pairs += 1

    def backward(self, loss: object) -> None:
        """Called by ``Precision.backward`` with the caller's loss."""
        if not isinstance(loss, torch.Tensor):
            raise UserError(f"backward() needs the loss as a torch.Tensor (got "
                            f"{type(loss).__name__})")
        if loss.numel() != 1:
            raise UserError(f"backward() needs a scalar loss (one number), got shape "
                            f"{tuple(loss.shape)}: reduce it first, e.g. loss.mean()")
        self.backward_since_step = True

    def step(self) -> None:
        """Called by ``Precision.step_async`` before the optimizer steps."""
        if not self.backward_since_step:
            raise UserError("step() came without a backward() since the last step: call "
                            "precision.backward(loss) first (there are no gradients to "
                            "apply)")
        self.backward_since_step = False
