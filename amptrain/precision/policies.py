"""How one optimizer's steps reach its model's weights: one policy object per registered
model/optimizer pair, chosen once by :func:`weight_policy` when the pair is set up.

* :class:`PlainWeights`: the optimizer steps the model's own parameters (fp32 weights,
  half weights rounded as torch rounds them, or weights a distributed strategy keeps).
* :class:`MasterCopies`: fp32 master copies in the optimizer (``X-master``, Apex O2):
  gradients are copied up before the check, the masters copied back down after the step.
* :class:`RoundingRule`: ``kahan`` or ``stochastic`` updates of half weights without
  masters (``X-true`` with ``--weight-update``; :mod:`.weight_update`).

The precision layer asks the policy, never which kind it has.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from .master import MasterWeights, cast_model
from .modes import ModeSpec
from .weight_update import WeightUpdate


class WeightPolicy:
    """The plain policy (and the protocol the others follow): nothing between the optimizer
    and the model's parameters."""

    kind = "plain"
    #: The ``kahan``/``stochastic`` rule this policy applies, if any.
    rule: WeightUpdate | None = None

    def __init__(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.optimizer = optimizer

    def stepped_params(self, params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
        """The tensors the optimizer steps for these model parameters (their masters)."""
        return list(params)

    def grad_links(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(where backward leaves a gradient, where the optimizer reads it) for each of
        the optimizer's parameters (:mod:`.loss_scales` unscales along these per loss)."""
        if self.optimizer is None:
            return []
        return [(p, p) for g in self.optimizer.param_groups for p in g["params"]]

    def gather_grads(self) -> None:
        """Put this step's gradients where the optimizer reads them (before the check)."""

    def gathered_elsewhere(self) -> None:
        """This step's gradients were put in place already (one loss at a time)."""

    def after_step(self) -> None:
        """After the optimizer stepped or skipped (also when the step raised)."""

    def fp32_weights(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """fp32 values this policy holds for ``model``'s parameters, by name (masters)."""
        return {}

    def load_fp32(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Set what :meth:`fp32_weights` returns from fp32 values by parameter name."""

    def buffers(self) -> list[torch.Tensor]:
        """What the policy keeps between steps besides the model and optimizer."""
        return []

    def state_dict(self) -> dict[str, Any] | None:
        """Checkpoint state beyond weights and optimizer state (None: nothing)."""
        return None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`state_dict`."""

    def remove(self) -> None:
        """Detach from the optimizer (teardown)."""


class PlainWeights(WeightPolicy):
    """The optimizer steps the model's own parameters."""


class MasterCopies(WeightPolicy):
    """fp32 master copies of the half parameters, swapped into the optimizer."""

    kind = "master"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, dtype: torch.dtype,
                 kept_fp32: set[nn.Module]) -> None:
        super().__init__(optimizer)
        self.master = MasterWeights(model, optimizer, dtype, kept_fp32)  # casts the model
        self._gathered = False
        # The optimizer holds the masters, so its zero_grad() would leave the half model's
        # gradients (another model's loss puts them there: a GAN's G loss on D) to be added
        # to the next step's. It clears them too, as Apex O2's patched zero_grad does.
        clear = optimizer.zero_grad
        half = self.master.model_params

        def zero_grad(set_to_none: bool = True) -> None:
            clear(set_to_none)
            for p in half:
                if set_to_none or p.grad is None:
                    p.grad = None
                else:
                    p.grad.detach_().zero_()

        optimizer.__dict__["zero_grad"] = zero_grad   # this instance only

    def stepped_params(self, params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
        return self.master.map_params(params)

    def grad_links(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        masters = {id(m) for m in self.master.masters}
        links: list[tuple[torch.Tensor, torch.Tensor]] = list(
            zip(self.master.model_params, self.master.masters))
        return links + [(p, q) for p, q in super().grad_links() if id(p) not in masters]

    def gather_grads(self) -> None:
        if not self._gathered:  # once per step: clip, grad_norm and step all call it
            self.master.copy_grads_to_masters()
            self._gathered = True

    def gathered_elsewhere(self) -> None:
        self._gathered = True

    def after_step(self) -> None:
        self._gathered = False
        # A skipped step left the masters unchanged, so copying back is harmless and
        # avoids reading the flag here.
        self.master.copy_masters_to_model()

    def fp32_weights(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return self.master.masters_by_name(model)

    def remove(self) -> None:
        assert self.optimizer is not None
        self.optimizer.__dict__.pop("zero_grad", None)   # the class's own again

    def load_fp32(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        self.master.load_fp32({id(p): state[name] for name, p in model.named_parameters()
                               if name in state})


class RoundingRule(WeightPolicy):
    """A ``kahan`` or ``stochastic`` update rule on half weights (step hooks on the optimizer)."""

    def __init__(self, rule: str, optimizer: torch.optim.Optimizer, *, seed: int) -> None:
        super().__init__(optimizer)
        self.kind = rule
        self.rule = WeightUpdate(rule, optimizer, seed=seed)

    def after_step(self) -> None:
        # The step's post hook restores the storages; this covers a step that raised.
        assert self.rule is not None
        self.rule.restore()

    def buffers(self) -> list[torch.Tensor]:
        assert self.rule is not None
        return self.rule.buffers()

    def state_dict(self) -> dict[str, Any] | None:
        assert self.rule is not None
        return self.rule.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state and self.rule is not None:
            self.rule.load_state_dict(state)

    def remove(self) -> None:
        assert self.rule is not None
        self.rule.remove()


def weight_policy(model: nn.Module, optimizer: torch.optim.Optimizer | None, spec: ModeSpec, *,
                  rule: str, kept_fp32: set[nn.Module], seed: int,
                  managed_elsewhere: bool = False) -> WeightPolicy:
    """The policy for a pair being set up, after casting ``model`` where the mode keeps half
    weights (except ``kept_fp32``). ``managed_elsewhere``: a distributed strategy keeps the
    fp32 weights and casts them per forward (nothing to cast or copy here). Without an
    optimizer (evaluation) half modes only cast."""
    if managed_elsewhere or not spec.half_weights:
        return PlainWeights(optimizer)
    if spec.master_weights and optimizer is not None:
        return MasterCopies(model, optimizer, spec.param_dtype, kept_fp32)
    cast_model(model, spec.param_dtype, kept_fp32)
    if optimizer is not None and rule != "plain":
        return RoundingRule(rule, optimizer, seed=seed)
    return PlainWeights(optimizer)
