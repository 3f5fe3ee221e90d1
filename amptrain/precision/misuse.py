"""What a library caller can do out of order with a :class:`~amptrain.precision.Precision`,
refused with amptrain's own error instead of torch's assert or shape error.

* a loss that is not one number (``backward`` of a per-sample loss);
* ``step`` with no ``backward`` since the last step (torch's scaler asserts "No inf checks
  were recorded"; without a scaler the step silently does nothing);
* with several optimizers, a second ``step`` of one optimizer before ``update()``: the
  once-per-iteration ``update()`` was forgotten and the loss scale would never move (torch's
  scaler raises "step() has already been called since the last update()");
* arguments of the wrong kind: ``Precision``'s own (:func:`checked_arguments`), a
  ``loss_id`` that is not a whole number, a ``load_state_dict`` of something that is not a
  Precision's state, a ``setup`` of something that is not a module, an optimizer or a
  model whose weights are on the ``meta`` device -- each named, not torch's message later.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..common.errors import UserError
from .hardware.devices import resolve_device


def checked_arguments(device: Any, fp8_skip_first_last: Any, separate_loss_scales: Any
                      ) -> torch.device | None:
    """``Precision(...)``'s arguments beside its settings (which
    :class:`~amptrain.precision.options.PrecisionConfig` checks), checked: the device as a
    ``torch.device`` (None: auto) and the two switches."""
    switches = {"fp8_skip_first_last": fp8_skip_first_last,
                "separate_loss_scales": separate_loss_scales}
    if device is not None and not isinstance(device, (str, torch.device)):
        raise UserError(f"device must be a name such as 'cpu' or 'cuda:0', or a torch.device "
                        f"(got {type(device).__name__})")
    for name, value in switches.items():
        if not isinstance(value, bool):
            raise UserError(f"{name} is True or False (got {value!r})")
    return None if device is None else device if isinstance(device, torch.device) \
        else resolve_device(device)


def check_loss_id(loss_id: object) -> None:
    """``backward(loss, loss_id=)``: a whole number >= 0 (it names a loss, and its scale)."""
    if isinstance(loss_id, bool) or not isinstance(loss_id, int) or loss_id < 0:
        raise UserError(f"backward(): loss_id must be an integer >= 0, one per loss (got "
                        f"{loss_id!r})")


def check_setup(model: object, optimizer: object) -> None:
    """``setup(model, optimizer)``: a module with weights that hold data, and an optimizer."""
    if not isinstance(model, nn.Module):
        raise UserError(f"setup(): model must be a torch.nn.Module (got "
                        f"{type(model).__name__})")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise UserError(f"setup(): optimizer must be a torch.optim.Optimizer or None (got "
                        f"{type(optimizer).__name__})")
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        raise UserError("setup(): model has weights on the 'meta' device (shapes without "
                        "data): materialise them first, e.g. model.to_empty(device='cpu') "
                        "and load or initialise the weights")


#: Sections of a Precision's state and what each must be when present.
_STATE_KINDS: dict[str, tuple[type, ...]] = {
    "skipped_steps": (int,), "consecutive_skips": (int,), "pairs": (list, type(None)),
    "scaler": (dict,), "loss_scalers": (dict,), "name": (str,),
    "stochastic_rounding": (list,),
}


def checked_state(state: object) -> Mapping[str, Any]:
    """``load_state_dict(state)``: the dict a :meth:`Precision.state_dict` returned."""
    if not isinstance(state, Mapping):
        raise UserError(f"load_state_dict() takes the dict of Precision.state_dict() (got "
                        f"{type(state).__name__})")
    for key, kinds in _STATE_KINDS.items():
        value = state.get(key)
        if key in state and (not isinstance(value, kinds) or isinstance(value, bool)):
            raise UserError(f"load_state_dict(): state[{key!r}] is a {type(value).__name__}; "
                            f"this is not a Precision.state_dict()")
    pairs = state.get("pairs") or []
    if not all(isinstance(p, Mapping) and _counts_ok(p) for p in pairs):
        raise UserError("load_state_dict(): state['pairs'] must hold one dict per pair with "
                        "whole-number skip counts; this is not a Precision.state_dict()")
    rounding = state.get("stochastic_rounding") or []
    if not all(isinstance(r, Mapping) and isinstance(r.get("seed", 0), int)
               and isinstance(r.get("calls", {}), Mapping)
               and all(isinstance(n, int) for n in r.get("calls", {}).values())
               for r in rounding):
        raise UserError("load_state_dict(): state['stochastic_rounding'] must hold one dict "
                        "per setup with a whole-number seed and call counts; this is not a "
                        "Precision.state_dict()")
    per_loss = state.get("loss_scalers") or {}
    if not all(str(key).isdigit() for key in per_loss):
        raise UserError("load_state_dict(): state['loss_scalers'] is keyed by loss ids "
                        "(whole numbers); this is not a Precision.state_dict()")
    scalers = {"['scaler']": state["scaler"]} if state.get("scaler") else {}
    scalers.update({f"['loss_scalers'][{key!r}]": value for key, value in per_loss.items()})
    for where, scaler in scalers.items():
        if not _scaler_ok(scaler):
            raise UserError(f"load_state_dict(): state{where} is not a loss scaler's state "
                            f"(finite numbers for {', '.join(_SCALER_FIELDS)}); this is not a "
                            f"Precision.state_dict()")
    return state


#: The fields of ``torch.amp.GradScaler.state_dict()``.
_SCALER_FIELDS = ("scale", "growth_factor", "backoff_factor", "growth_interval",
                  "_growth_tracker")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def _counts_ok(pair: Mapping[str, Any]) -> bool:
    return all(isinstance(pair.get(k, 0), int) and not isinstance(pair.get(k, 0), bool)
               and pair.get(k, 0) >= 0 for k in ("skipped_steps", "consecutive_skips"))


def _scaler_ok(scaler: object) -> bool:
    return isinstance(scaler, Mapping) and all(_number(scaler.get(k)) for k in _SCALER_FIELDS)


class CallOrder:
    """Tracks ``backward``/``step``/``update`` of one Precision and refuses misuse."""

    def __init__(self) -> None:
        self._backwards = 0                 # backward() calls so far
        self._seen: dict[int, int] = {}     # id(optimizer) -> backwards at its last step
        self._stepped: set[int] = set()     # optimizers stepped since the last update()

    def backward(self, loss: object, loss_id: object = 0) -> None:
        """Called by ``Precision.backward`` with the caller's loss and its ``loss_id``."""
        check_loss_id(loss_id)
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
