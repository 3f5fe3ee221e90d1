"""An own loop's halt, explained as the Trainer's is: the first module whose output held
inf/NaN on the last batch, and where to look further (:func:`amptrain.diagnose_model`).

The Trainer reruns its last batch itself; an own loop's batch is the caller's, so from its
first :meth:`~amptrain.precision.Precision.step` on, each set-up model keeps a reference to
its last forward's inputs (no copy, no device read), read only once a halt is raised.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, ContextManager

import torch
from torch import nn

from .nonfinite import first_nonfinite_module
from .outcome import NonFiniteHalt


class LastForward:
    """The inputs of ``model``'s last forward, by reference."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.args: tuple[Any, ...] | None = None
        self.kwargs: dict[str, Any] = {}
        self._handle = model.register_forward_pre_hook(self._keep, with_kwargs=True)

    def _keep(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.args, self.kwargs = args, kwargs

    def remove(self) -> None:
        self._handle.remove()

    def explain(self, halt: NonFiniteHalt, autocast: Callable[[], ContextManager]
                ) -> NonFiniteHalt:
        """``halt`` with the first module whose forward output on the last inputs held
        inf/NaN (the forward is run again, without gradients)."""
        if self.args is None:
            return halt
        args, kwargs = self.args, self.kwargs

        def rerun() -> None:
            with torch.no_grad(), autocast():
                self.model(*args, **kwargs)

        where = first_nonfinite_module(self.model, rerun)
        if where is None:
            return NonFiniteHalt(f"{halt}. The model's forward on the last batch is finite: "
                                 f"the overflow is in the loss or the backward", halt.step)
        return NonFiniteHalt(f"{halt}. First non-finite value: module '{where[0]}' "
                             f"({where[1]}, on the last batch)", halt.step)
