"""FSDP2 (``fully_shard``): parameters sharded across ranks, gathered per forward."""
from __future__ import annotations

import warnings
from typing import Any, cast

import torch
from torch import nn

from ..common.errors import UserError
from ..precision import Precision
from ..precision.master import FP32_NORM_TYPES
from ..precision.islands import match_modules
from .ddp import ProcessGroupStrategy


def sharded_grad_scaler() -> type:
    """FSDP's ShardedGradScaler (it all-reduces found_inf across ranks itself), with flags
    that fused optimizers understand; the precision layer uses it for every loss scale."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    class _ScalarFlagShardedScaler(ShardedGradScaler):
        """torch 2.13's ShardedGradScaler flags have shape [1], which fused steps cannot
        broadcast, and are summed over ranks, while a fused kernel only skips when the flag
        is exactly 1 -- two ranks with an inf would step on it. This one clamps them."""

        agrees_across_ranks = True   # no separate all-reduce of its flags (scaling.py)

        def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
            with warnings.catch_warnings():
                # Its own shape-[1] flag meeting DTensor gradients; harmless, once per run.
                warnings.filterwarnings("ignore", "Found a non-scalar tensor with numel=1")
                super().unscale_(optimizer)
            state = self._per_optimizer_states[id(optimizer)]
            state["found_inf_per_device"] = {device: flag.reshape(()).clamp_(max=1.0)
                                             for device, flag
                                             in state["found_inf_per_device"].items()}

    return _ScalarFlagShardedScaler


def fsdp_policy(precision: Precision, fp32: bool = False) -> Any:
    """FSDP2's ``MixedPrecisionPolicy`` for ``precision``'s mode (``fp32``: for modules kept
    fp32), read from its :class:`~amptrain.precision.modes.ModeSpec`.

    FSDP keeps each rank's shard of the weights in fp32 -- the master copy -- gathers
    them in the compute dtype for forward/backward and reduce-scatters gradients in
    fp32. So ``X-mixed`` and ``X-master`` both map to (param X, reduce fp32) and the
    fp32 modes to no casts. ``X-true`` (no fp32 copy anywhere) has no FSDP equivalent.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    spec = precision.spec
    if spec.half_weights and not spec.master_weights:
        mixed = "16-mixed" if spec.param_dtype == torch.float16 else "bf16-mixed"
        raise UserError(f"--precision {precision.name} keeps no fp32 weights, but FSDP shards "
                        f"fp32 weights and casts them for each forward: use --precision "
                        f"{mixed} with --strategy fsdp")
    if fp32 or spec.compute_dtype is None:
        return MixedPrecisionPolicy(reduce_dtype=torch.float32)
    return MixedPrecisionPolicy(param_dtype=spec.compute_dtype, reduce_dtype=torch.float32)


def fsdp_fp32_modules(precision: Precision, model: nn.Module) -> list[nn.Module]:
    """Modules whose weights must stay fp32 under FSDP (``keep_fp32`` islands and norm
    layers): FSDP casts per parameter group, so each needs a group of its own."""
    if precision.spec.compute_dtype is None:
        return []
    islands = list(match_modules(model, precision.keep_patterns(model)).values())
    inside = {id(m) for island in islands for m in island.modules()}
    norms = [m for m in model.modules()
             if isinstance(m, FP32_NORM_TYPES) and id(m) not in inside]
    return islands + norms


class FSDPStrategy(ProcessGroupStrategy):
    """FSDP2: every rank holds a shard of each parameter (fp32), gathered per forward.

    Mixed precision comes from the precision layer's ``MixedPrecisionPolicy``; modules
    that must stay fp32 (``--keep-fp32`` islands, norm layers) get groups of their own.
    Checkpoints during training are sharded (each rank writes its shards); the one at the
    end of a run is gathered into a full fp32 state dict that loads on one device.
    """

    uneven_evaluation = False

    @property
    def sharded_checkpoints(self) -> bool:
        return True

    def wrap_model(self, model: nn.Module, precision: Any,
                      optimizer: torch.optim.Optimizer | None = None) -> nn.Module:
        from torch.distributed.fsdp import fully_shard

        if optimizer is not None:
            raise UserError("--strategy fsdp replaces the model's parameters by shards: let "
                            "amptrain build the optimizer (pass none to fit())")
        super().wrap_model(model, precision, optimizer)
        policy = fsdp_policy(precision)
        fp32_modules = fsdp_fp32_modules(precision, model)
        fp32_ids = {id(m) for m in fp32_modules}
        # Innermost groups first: a group owns the parameters its sub-groups do not.
        for module in fp32_modules:
            if any(True for _ in module.parameters()):
                fully_shard(module, mp_policy=fsdp_policy(precision, fp32=True))
        for block in _shard_units(model):
            if id(block) not in fp32_ids:
                fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        # FSDP2 keeps each rank's shard in fp32 (the master copy) and casts per forward with
        # the policy above: the precision layer has nothing to cast or copy, and scales the
        # loss with the sharded scaler (each rank sees only its gradient shards).
        precision.weights_managed_elsewhere(model, owner="FSDP's fp32 shards",
                                            grad_scaler=sharded_grad_scaler())
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
