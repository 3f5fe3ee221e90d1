"""FSDP2 (``fully_shard``): parameters sharded across ranks, gathered per forward."""
from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from ..errors import UserError
from .ddp import ProcessGroupStrategy


class FSDPStrategy(ProcessGroupStrategy):
    """FSDP2: every rank holds a shard of each parameter (fp32), gathered per forward.

    Mixed precision comes from the precision layer's ``MixedPrecisionPolicy``; modules
    that must stay fp32 (``--keep-fp32`` islands, norm layers) get groups of their own.
    Checkpoints are gathered into full fp32 state dicts that load on one device.
    """

    uneven_evaluation = False

    def prepare_model(self, model: nn.Module, precision: Any,
                      optimizer: torch.optim.Optimizer | None = None) -> nn.Module:
        from torch.distributed.fsdp import fully_shard

        if optimizer is not None:
            raise UserError("--strategy fsdp replaces the model's parameters by shards: let "
                            "amptrain build the optimizer (pass none to fit())")
        super().prepare_model(model, precision, optimizer)
        policy = precision.fsdp_policy()
        fp32_modules = precision.fsdp_fp32_modules(model)
        fp32_ids = {id(m) for m in fp32_modules}
        # Innermost groups first: a group owns the parameters its sub-groups do not.
        for module in fp32_modules:
            if any(True for _ in module.parameters()):
                fully_shard(module, mp_policy=precision.fsdp_policy(fp32=True))
        for block in _shard_units(model):
            if id(block) not in fp32_ids:
                fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        return model

    def model_state_dict(self, model: nn.Module, precision: Any) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        # A module's full state dict holds tensors only; torch types it as any state value.
        state = cast(dict[str, torch.Tensor], get_model_state_dict(
            model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))
        return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}

    def load_model_state_dict(self, model: nn.Module, precision: Any,
                              state: dict[str, torch.Tensor]) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
        )

        # torch types the state as an invariant dict[str, ValueType]; a Tensor is a ValueType.
        set_model_state_dict(model, state,  # type: ignore[arg-type]
                             options=StateDictOptions(full_state_dict=True))

    def optimizer_state_dict(self, model: nn.Module,
                             optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))

    def load_optimizer_state_dict(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                                  state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        set_optimizer_state_dict(model, optimizer, state,
                                 options=StateDictOptions(full_state_dict=True))


def _shard_units(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a model: parameter-holding children of ``Sequential`` and
    ``ModuleList`` containers (transformer layers, ResNet blocks, MLP layers), outermost
    first found, innermost first returned (``fully_shard`` wants children before parents)."""
    units: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        container = isinstance(module, (nn.Sequential, nn.ModuleList))
        for child in module.children():
            if container and any(True for _ in child.parameters()):
                units.append(child)
            else:
                visit(child)

    visit(model)
    return units
