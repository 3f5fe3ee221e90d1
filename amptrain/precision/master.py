"""Half-precision model weights, with or without fp32 master copies (Apex O2 semantics).

The model runs in fp16/bf16; with master weights the optimizer owns an fp32 copy of
every half parameter: gradients are copied up before unscaling, the optimizer updates
the fp32 copy, and the result is copied back down into the model.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from ..common.errors import UserError, flag

#: Norm layers whose statistics stay fp32 in half-weight modes (Apex O2's
#: keep_batchnorm_fp32): their running variance is where fp16 loses first.
FP32_NORM_TYPES: tuple[type[nn.Module], ...] = (nn.modules.batchnorm._BatchNorm,)


def modules_kept_fp32(model: nn.Module, islands: Iterable[nn.Module]) -> set[nn.Module]:
    """All modules whose own parameters stay fp32: the islands' subtrees and norm layers."""
    kept: set[nn.Module] = set()
    for root in islands:
        kept.update(root.modules())
    kept.update(m for m in model.modules() if isinstance(m, FP32_NORM_TYPES))
    return kept


def check_no_shared_kept(model: nn.Module, kept_fp32: set[nn.Module], mode: str
                         ) -> set[nn.Module]:
    """``kept_fp32``, after refusing an fp32 module whose parameter another, half module
    shares (tied weights): one tensor cannot be fp32 in one place and half in the other."""
    owners = {id(p): name for name, m in model.named_modules() if m not in kept_fp32
              for p in m.parameters(recurse=False)}
    for name, module in model.named_modules():
        if module not in kept_fp32:
            continue
        for param in module.parameters(recurse=False):
            if id(param) in owners:
                raise UserError(
                    f"{flag('keep_fp32')}: '{name}' shares its weight with "
                    f"'{owners[id(param)]}' (tied weights), which {mode} stores in half "
                    f"precision; use a mode with fp32 weights (bf16-mixed) or keep "
                    f"another module in fp32")
    return kept_fp32


def cast_model(model: nn.Module, dtype: torch.dtype, kept_fp32: set[nn.Module]) -> None:
    """Cast parameters and floating buffers to ``dtype`` in place, except in ``kept_fp32``.

    ``param.data`` is replaced rather than the Parameter, so optimizers built on the
    model keep pointing at the same parameter objects.
    """
    for module in model.modules():
        if module in kept_fp32:
            continue
        for param in module.parameters(recurse=False):
            if param.is_floating_point():
                param.data = param.data.to(dtype)
        for name, buf in module.named_buffers(recurse=False):
            if buf is not None and buf.is_floating_point():
                setattr(module, name, buf.to(dtype))


class MasterWeights:
    """fp32 master copies of a half model's parameters, swapped into the optimizer."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 dtype: torch.dtype, kept_fp32: set[nn.Module]) -> None:
        if optimizer.state:
            raise UserError("Precision.setup() must be called before the optimizer's first "
                            "step (its state would be tied to the half weights)")
        casted = {id(p) for m in model.modules() if m not in kept_fp32
                  for p in m.parameters(recurse=False) if p.is_floating_point()}
        # Masters are cloned before the cast so they keep every fp32 bit of the weights.
        self._master_of: dict[int, nn.Parameter] = {}
        self.model_params: list[nn.Parameter] = []
        self.masters: list[nn.Parameter] = []
        for group in optimizer.param_groups:
            new_params = []
            for p in group["params"]:
                if id(p) in casted:
                    master = nn.Parameter(p.detach().clone().float(), requires_grad=p.requires_grad)
                    self._master_of[id(p)] = master
                    self.model_params.append(p)
                    self.masters.append(master)
                    new_params.append(master)
                else:
                    new_params.append(p)
            group["params"] = new_params
        cast_model(model, dtype, kept_fp32)

    def masters_by_name(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The fp32 masters under their parameters' names in ``model``."""
        return {name: self._master_of[id(p)].detach() for name, p in model.named_parameters()
                if id(p) in self._master_of}

    def map_params(self, params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
        """Replace model parameters by their masters (others pass through)."""
        return [self._master_of.get(id(p), p) for p in params]

    def copy_grads_to_masters(self) -> None:
        """Move the half gradients into fp32 master gradients and free the half ones."""
        for param, master in zip(self.model_params, self.masters):
            if param.grad is None:
                master.grad = None
            else:
                master.grad = param.grad.to(torch.float32)
                param.grad = None

    @torch.no_grad()
    def copy_masters_to_model(self) -> None:
        """Write the updated fp32 masters back into the half model."""
        if self.model_params:
            # torch's stub takes list[Tensor] (invariant); Parameters are Tensors.
            torch._foreach_copy_(self.model_params, self.masters)  # type: ignore[arg-type]

    @torch.no_grad()
    def load_fp32(self, named_values: dict[int, torch.Tensor]) -> None:
        """Set masters from fp32 values keyed by id(model_param) (used when loading)."""
        for param, master in zip(self.model_params, self.masters):
            value = named_values.get(id(param))
            if value is not None:
                master.copy_(value)
