"""The gradient guards of a :class:`~amptrain.precision.Precision`: one loss scale shared by
every loss (PyTorch's recipe for several models, losses and optimizers), or one per loss.

**Shared** (the default): one ``torch.amp.GradScaler`` scales every loss; each optimizer's
step unscales and checks that optimizer's gradients and skips it alone on inf/NaN; one
``update()`` per iteration moves the scale (backoff when any optimizer found an inf):
``scaler.scale(loss_i).backward()``, ``scaler.step(opt_i)``, ``scaler.update()`` exactly.

**Separate** (``separate_loss_scales=True``, Apex's ``num_losses``; fp16 modes): each
``loss_id`` has a scale of its own, so one loss overflowing does not shrink the others'.
Gradients of different losses can meet in one parameter, and a gradient is only meaningful
at one scale, so each loss's gradients are unscaled right after its backward (as Apex does):
the gradients already held are set aside, the scaled backward runs, its gradients are
checked and unscaled with that loss's scale (into the fp32 masters where the mode keeps
them), and the ones set aside are added back. The loss's own overflow flag then updates its
own scale at ``update()``; each optimizer's step checks its (now true) gradients for inf/NaN
and skips alone, as in modes without a scaler.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.amp import GradScaler

from .options import ScalerSettings
from .modes import ModeSpec
from .policies import WeightPolicy
from .scaling import DynamicLossScaler, FoundInfAgreement, NonFiniteGuard

GradLinks = list[tuple[torch.Tensor, torch.Tensor]]


class LossScales:
    """The step guard (per optimizer) and the loss scaler(s) (per loss) of one mode."""

    def __init__(self, device_type: str, spec: ModeSpec, settings: ScalerSettings, *,
                 separate: bool = False, scaler_class: type[GradScaler] | None = None) -> None:
        self._device_type = device_type
        self._settings = settings
        self._half_grads = spec.half_weights and not spec.master_weights
        self._scaler_class = scaler_class
        self.separate = separate and spec.loss_scaling
        self._scalers: dict[int, DynamicLossScaler] = {}
        self._found: dict[int, torch.Tensor] = {}   # separate: each loss's overflow so far
        self._agree: FoundInfAgreement | None = None
        if spec.loss_scaling and not self.separate:
            self.step_guard: DynamicLossScaler | NonFiniteGuard = self._scaler(0)
        else:
            self.step_guard = NonFiniteGuard()
            if self.separate:
                self._scaler(0)

    def _scaler(self, loss_id: int) -> DynamicLossScaler:
        scaler = self._scalers.get(loss_id)
        if scaler is None:
            scaler = self._scalers[loss_id] = DynamicLossScaler(
                self._device_type, self._settings, half_grads=self._half_grads,
                scaler_class=self._scaler_class)
            scaler.agree = self._agree
        return scaler

    def set_agreement(self, agree: FoundInfAgreement | None) -> None:
        """Make ranks agree on found-inf flags (see ``Precision.set_found_inf_agreement``)."""
        self._agree = agree
        self.step_guard.agree = agree
        for scaler in self._scalers.values():
            scaler.agree = agree

    # ------------------------------------------------------------------ a loss
    def scale(self, loss: torch.Tensor, loss_id: int = 0) -> torch.Tensor:
        """``loss`` times its scale (itself without a scaler)."""
        if not self._scalers:
            return loss
        return self._scaler(loss_id if self.separate else 0).scale(loss)

    def backward(self, loss: torch.Tensor, loss_id: int, links: GradLinks,
                 policies: list[WeightPolicy]) -> None:
        """Backpropagate ``loss`` scaled; with separate scales, unscale its gradients along
        ``links`` (every pair's gradient source -> optimizer parameter) at once."""
        if not self.separate:
            self.scale(loss).backward()
            return
        scaler = self._scaler(loss_id)
        held = [target.grad for _, target in links]
        for _, target in links:
            target.grad = None
        scaler.scale(loss).backward()
        news: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        sums: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
        for (source, target), old in zip(links, held):
            grad = source.grad
            if grad is None:
                target.grad = old
                continue
            if source is not target:  # a half model's gradient -> its fp32 master
                grad, source.grad = grad.to(target.dtype), None
            target.grad = grad
            local = grad.to_local() if hasattr(grad, "to_local") else grad  # DTensor shards
            news.setdefault((local.device, local.dtype), []).append(local)
            if old is not None:
                sums[0].append(grad)
                sums[1].append(old)
        inv_scale = scaler.inv_scale()
        found = self._found.get(loss_id)
        if found is None:
            found = torch.zeros((), dtype=torch.float32, device=inv_scale.device)
        for (device, _), grads in news.items():
            flag = torch.zeros((), dtype=torch.float32, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(grads, flag, inv_scale.to(device))
            found = found + flag.to(found.device)
        self._found[loss_id] = found.clamp_(max=1.0)
        if sums[0]:
            torch._foreach_add_(sums[0], sums[1])
        for policy in policies:
            policy.gathered_elsewhere()

    # ----------------------------------------------------------------- a step
    def unscale_(self, optimizer: torch.optim.Optimizer, policy: WeightPolicy) -> None:
        """Make ``optimizer``'s gradients true and check them (idempotent until update)."""
        if not self.separate:
            policy.gather_grads()
        self.step_guard.unscale_(optimizer)

    def update(self) -> None:
        """The iteration's scale update (and a fresh check for every optimizer)."""
        for loss_id, found in self._found.items():
            if self._agree is not None:
                self._agree(found)
            self._scalers[loss_id].update_from(found)
        self._found.clear()
        self.step_guard.update()

    # ----------------------------------------------------------------- state
    @property
    def scale_tensor(self) -> torch.Tensor | None:
        """The first scale on the device (None without a scaler, or before first use)."""
        scaler = self._scalers.get(0)
        return None if scaler is None else scaler.scale_tensor

    def scales(self) -> dict[int, float]:
        """Each scaler's scale by loss id (one entry, 0, when shared; reads the device)."""
        return {i: float(s.scaler.get_scale()) for i, s in sorted(self._scalers.items())}

    def state_dict(self) -> dict[str, Any]:
        """``scaler``: the first scaler (today's format); ``loss_scalers``: every one by id."""
        first = self._scalers.get(0)
        state: dict[str, Any] = {"scaler": first.state_dict() if first is not None else {}}
        if self.separate:
            state["loss_scalers"] = {str(i): s.state_dict() for i, s in self._scalers.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; another layout restores what both have."""
        if not self._scalers:
            return
        per_loss = state.get("loss_scalers") if self.separate else None
        if per_loss:
            for key, value in per_loss.items():
                self._scaler(int(key)).load_state_dict(value)
        elif state.get("scaler"):
            self._scaler(0).load_state_dict(state["scaler"])
