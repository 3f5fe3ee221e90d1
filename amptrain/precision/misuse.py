"""What a library caller can do out of order with a :class:`~amptrain.precision.Precision`,
refused with amptrain's own error instead of torch's assert or shape error.

* a loss that is not one number (``backward`` of a per-sample loss);
* ``step`` with no ``backward`` since the last step (torch's scaler asserts "No inf checks
  were recorded"; without a scaler the step silently does nothing);
* with several optimizers, a second ``step`` of one optimizer before ``update()``: the
  once-per-iteration ``update()`` was forgotten and the loss scale would never move (torch's
  scaler raises "step() has already been called since the last update()").
"""
from __future__ import annotations

import torch

from ..errors import UserError


class CallOrder:
    """Tracks ``backward``/``step``/``update`` of one Precision and refuses misuse."""

    def __init__(self) -> None:
        self._backwards = 0                 # backward() calls so far
        self._seen: dict[int, int] = {}     # id(optimizer) -> backwards at its last step
        self._stepped: set[int] = set()     # optimizers stepped since the last update()

    def backward(self, loss: object) -> None:
        """Called by ``Precision.backward`` with the caller's loss."""
        if not isinstance(loss, torch.Tensor):
            raise UserError(f"backward() needs the loss as a torch.Tensor (got "
                            f"{type(loss).__name__})")
        if loss.numel() != 1:
            raise UserError(f"backward() needs a scalar loss (one number), got shape "
                            f"{tuple(loss.shape)}: reduce it first, e.g. loss.mean()")
        self._backwards += 1

    def step(self, optimizer: object, several: bool) -> None:
        """Called by ``Precision.step_async`` before ``optimizer`` steps; ``several``: more
        than one optimizer is set up (then update() is the caller's, once per iteration)."""
        if self._seen.get(id(optimizer), 0) == self._backwards:
            raise UserError("step() came without a backward() since the last step: call "
                            "precision.backward(loss) first (there are no gradients to "
                            "apply)")
        if several and id(optimizer) in self._stepped:
            raise UserError(f"step() of this {type(optimizer).__name__} came twice without "
                            "precision.update(): with several optimizers, call update() once "
                            "per iteration, after every optimizer's step")
        self._seen[id(optimizer)] = self._backwards
        self._stepped.add(id(optimizer))

    def updated(self) -> bool:
        """Called by ``Precision.update``: True when some optimizer stepped since the last."""
        stepped = bool(self._stepped)
        self._stepped.clear()
        return stepped
