"""Gradient guards: dynamic loss scaling for fp16, and non-finite step skipping for the rest.

Both guards share one small protocol so the precision layer never asks which one it has:
``scale(loss)``, ``unscale_(optimizer)``, ``step(optimizer) -> found_inf``, ``update()``,
``scale_tensor``, ``state_dict()``. ``found_inf`` stays on the device; reading it is the
caller's choice, which is what keeps steady-state steps free of host-device syncs. (The
guards read it themselves only for optimizers that cannot take it, and on the steps where a
fused optimizer would create its state: see :func:`_step_would_create_state`.)
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.amp import GradScaler

from ..common.errors import UserError
from .options import ScalerSettings

#: Combines a rank's found-inf flag in place with every other rank's (an all-reduce with
#: MAX), so that all ranks skip the same steps. Set by a distributed strategy.
FoundInfAgreement = Callable[[torch.Tensor], None]


def _supports_fused_skip(optimizer: torch.optim.Optimizer) -> bool:
    # Fused Adam/AdamW/SGD take `found_inf` (and `grad_scale`) as attributes and skip the
    # update inside the kernel, so deciding whether to step needs no `.item()`.
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def _keeps_no_state(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> bool:
    # torch's SGD keeps a momentum buffer only when momentum != 0: without one its step
    # never creates state, and counting such parameters would defeat the fast path below.
    return isinstance(optimizer, torch.optim.SGD) and group.get("momentum") == 0


def _step_would_create_state(optimizer: torch.optim.Optimizer) -> bool:
    """True when ``optimizer.step()`` now would create state for some parameter, so that a
    skip left to a fused kernel (``found_inf``) would not leave the optimizer as it was.

    Fused kernels skip the *update* when ``found_inf`` is 1, but state is created in Python
    before the kernel runs. torch 2.13's fused SGD makes its momentum buffers with
    ``empty_like`` and records them: after a skipped first step the next step reads
    uninitialised memory (NaN weights; issue 14). Fused Adam/AdamW add zeroed moments and a
    step counter that they count back to 0: harmless numerically, but not the state before
    the skipped step. Once every parameter has its state, a fused skip leaves parameters and
    state bitwise unchanged (Adam's step is +1, then -found_inf, exact in fp32).

    Cost: where all parameters have state (every step after the optimizer's first real one)
    the check is ``len(optimizer.state)`` against a sum over the param groups: no loop over
    parameters, no sync. Torch's SGD without momentum keeps no state and is not counted.
    Otherwise it loops over the parameters, and where one with a gradient has no state yet
    the caller reads the flag on the host: one sync on each step until the first real step.
    (Parameters that never get a gradient keep the loop, without a sync, on every step.)
    """
    state = optimizer.state
    groups = [g for g in optimizer.param_groups if not _keeps_no_state(optimizer, g)]
    if len(state) >= sum(len(g["params"]) for g in groups):
        return False
    # `.get`: `state` is a defaultdict, and indexing it would add an empty entry.
    return any(p.grad is not None and not state.get(p) for g in groups for p in g["params"])


def _skip_decided_on_host(optimizer: torch.optim.Optimizer) -> bool:
    """True for a fused optimizer whose skip must not be left to its kernel this step (see
    :func:`_step_would_create_state`): the caller reads the flag and, on a skip, does not
    call the optimizer at all. Both guards use it."""
    return _supports_fused_skip(optimizer) and _step_would_create_state(optimizer)


class _HalfGradsScaler(GradScaler):
    """A GradScaler that also unscales fp16 gradients (16-true keeps no fp32 copy).

    torch refuses fp16 grads because unscaling them in fp16 can underflow; with a
    half model there is no other place for the gradients to live, so we accept it.
    """

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        return super()._unscale_grads_(optimizer, inv_scale, found_inf, True)


class DynamicLossScaler:
    """torch.amp.GradScaler, exposing found_inf on the device instead of a Python bool.

    ``scaler_class`` replaces torch's GradScaler (a distributed strategy's, e.g. FSDP's
    sharded scaler, which sees only this rank's gradient shards); a class with a true
    ``agrees_across_ranks`` combines the ranks' flags itself, so :attr:`agree` is not applied.
    """

    def __init__(self, device_type: str, settings: ScalerSettings, *, half_grads: bool = False,
                 scaler_class: type[GradScaler] | None = None) -> None:
        cls = scaler_class or (_HalfGradsScaler if half_grads else GradScaler)
        self.scaler = cls(device_type, **settings.as_kwargs())
        self.agrees_itself = bool(getattr(cls, "agrees_across_ranks", False))
        self.agree: FoundInfAgreement | None = None
        self._unscaled: set[int] = set()

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        if id(optimizer) not in self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))
            if self.agree is not None and not self.agrees_itself:
                for flag in self.scaler._per_optimizer_states[id(optimizer)][
                        "found_inf_per_device"].values():
                    self.agree(flag)

    def step(self, optimizer: torch.optim.Optimizer, own_flag: bool = False) -> torch.Tensor:
        """Step ``optimizer`` unless its gradients hold inf/NaN; returns its flag.

        ``own_flag``: return a copy that :meth:`update` cannot change. With several
        optimizers, GradScaler.update() adds every optimizer's flag in place into the
        first one's, which would turn the first optimizer's outcome into the sum.
        """
        self.unscale_(optimizer)
        found_inf = self._found_inf(optimizer, own_flag)
        # Non-fused optimizers: GradScaler reads the flag itself and skips the call.
        # A skip that must not reach a fused kernel is not stepped at all: unscale_ has
        # recorded found_inf per device, which is all update() needs.
        if not (_skip_decided_on_host(optimizer) and found_inf.item()):
            self.scaler.step(optimizer)
        return found_inf

    def _found_inf(self, optimizer: torch.optim.Optimizer, own_flag: bool) -> torch.Tensor:
        # GradScaler keeps the per-device inf flags until update(); their sum is the
        # device-side "this step was skipped" flag. One flag (one device, one optimizer:
        # update() adds several in place into the first) is returned as it is, which
        # saves a kernel per step.
        states = self.scaler._per_optimizer_states
        flags = list(states[id(optimizer)]["found_inf_per_device"].values())
        if not flags:  # torch would assert "No inf checks were recorded for this optimizer"
            raise UserError(f"step(): no parameter of this {type(optimizer).__name__} has a "
                            "gradient: backward() a loss that depends on its model first")
        device = self._scale().device
        if len(flags) == 1 and flags[0].device == device:
            return flags[0].clone() if own_flag or len(states) > 1 else flags[0]
        return sum(t.to(device) for t in flags)

    def inv_scale(self) -> torch.Tensor:
        """1 / scale in fp32, computed as GradScaler.unscale_ does (for :mod:`.loss_scales`)."""
        return self._scale().double().reciprocal().float()

    def _scale(self) -> torch.Tensor:
        scale = self.scaler._scale
        assert scale is not None, "the scale is made by scale(), before any backward"
        return scale

    def update_from(self, found_inf: torch.Tensor) -> None:
        """Update the scale from one flag (a loss's own overflow: :mod:`.loss_scales`),
        with torch's kernel and this scaler's settings, as GradScaler.update() would."""
        s = self.scaler
        scale, tracker = s._check_scale_growth_tracker("update")
        torch._amp_update_scale_(scale, tracker, found_inf.to(scale.device), s._growth_factor,
                                 s._backoff_factor, s._growth_interval)

    def update(self) -> None:
        self.scaler.update()
        self._unscaled.clear()

    @property
    def scale_tensor(self) -> torch.Tensor | None:
        return self.scaler._scale

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scaler.load_state_dict(state)


class NonFiniteGuard:
    """No loss scaling; a step whose gradients hold inf/NaN is skipped and reported.

    bf16 and fp32 have fp32's range, so scaling buys nothing, but a NaN from bad data
    or a diverging model must still not reach the weights.
    """

    def __init__(self) -> None:
        self._found_inf: dict[int, torch.Tensor] = {}
        self.agree: FoundInfAgreement | None = None
        self._ones: dict[torch.device, torch.Tensor] = {}  # the "scale" of the check

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        if id(optimizer) in self._found_inf:
            return
        grads_by_device: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    # FSDP's DTensor gradients: check this rank's shard; `agree` does the rest.
                    grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                    grads_by_device.setdefault((grad.device, grad.dtype), []).append(grad)
        found = None
        for (device, _), grads in grads_by_device.items():
            flag = torch.zeros((), dtype=torch.float32, device=device)
            one = self._ones.get(device)
            if one is None:
                one = self._ones[device] = torch.ones((), dtype=torch.float32, device=device)
            # A fused in-place check over all grads of a device; multiplying by 1 is free.
            torch._amp_foreach_non_finite_check_and_unscale_(grads, flag, one)
            found = flag if found is None else found + flag.to(found.device)
        if found is None:
            found = torch.zeros((), dtype=torch.float32)
        if len(grads_by_device) > 1:
            # Fused optimizers skip only when the flag is exactly 1; groups can add up.
            found.clamp_(max=1.0)
        if self.agree is not None:
            self.agree(found)
        self._found_inf[id(optimizer)] = found

    def step(self, optimizer: torch.optim.Optimizer, own_flag: bool = False) -> torch.Tensor:
        # Each optimizer's flag is a tensor of its own already (``own_flag`` is for the scaler).
        self.unscale_(optimizer)
        found_inf = self._found_inf[id(optimizer)]
        if _supports_fused_skip(optimizer) and not _skip_decided_on_host(optimizer):
            # The fused-kernel protocol's attributes, which torch's Optimizer does not declare
            # (torch's own GradScaler sets them the same way).
            optimizer.grad_scale = None  # type: ignore[attr-defined]
            optimizer.found_inf = found_inf  # type: ignore[attr-defined]
            try:
                optimizer.step()
            finally:
                del optimizer.grad_scale, optimizer.found_inf  # type: ignore[attr-defined]
        elif not found_inf.item():  # non-fused, or a fused optimizer's first step
            optimizer.step()
        return found_inf

    def update(self) -> None:
        self._found_inf.clear()

    @property
    def scale_tensor(self) -> torch.Tensor | None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
