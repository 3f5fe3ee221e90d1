"""The precision decision, made once: which mode ``--precision`` (or ``precision=``) means
on a device.

:func:`resolve_precision` maps an alias to its mode, resolves ``auto`` to what the device
runs fastest natively, and refuses a mode the device cannot run, with what to use instead
(the facts come from :mod:`.hardware.support`). Its :class:`ResolvedPrecision` then travels
down unchanged: the runner decides before anything is loaded, the Trainer hands the decision
to its :class:`~amptrain.precision.Precision`, and a distributed strategy reads the mode from
that ``Precision``. Nothing resolves the name again. A library call
(``Precision("bf16-mixed")``, ``Trainer(precision="auto")``) reaches the same function once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..common.choices import PLAN_PREFIX, canonical_name
from ..common.errors import UserError
from .hardware.devices import resolve_device
from .hardware.support import auto_mode, unsupported_reason
from .modes import MODES, ModeSpec

if TYPE_CHECKING:
    from .precision_plan import PrecisionPlan


@dataclass(frozen=True)
class ResolvedPrecision:
    """A precision decided for one device: the mode, and how the user spelled it."""

    #: The mode (a key of :data:`~amptrain.precision.modes.MODES`; never ``auto``), or
    #: ``plan:FILE`` for a precision plan.
    name: str
    #: The user's spelling (``auto``, an alias such as a Keras policy name), for outputs.
    given: str
    #: What was asked for, aliases mapped: a mode, or ``auto``.
    requested: str
    #: The device the mode was decided for.
    device: torch.device
    #: The precision plan of ``plan:FILE`` (None for every other mode).
    plan: PrecisionPlan | None = None

    @property
    def spec(self) -> ModeSpec:
        """What the mode keeps in which dtype."""
        if self.plan is not None:
            from .precision_plan import plan_spec  # deferred: plans are rare; keeps this small
            return plan_spec(self.plan)
        return MODES[self.name]


def resolve_precision(name: str | ResolvedPrecision,
                      device: torch.device | str | None = None) -> ResolvedPrecision:
    """The mode ``name`` means on ``device`` (default: ``--device auto``'s): aliases mapped,
    ``auto`` resolved, and a mode the device cannot run refused with a :class:`UserError`
    saying what to use instead. A :class:`ResolvedPrecision` is returned as it is (the
    decision is made once); asked for another device it is refused."""
    if isinstance(name, ResolvedPrecision):
        if device is not None and torch.device(device) != name.device:
            raise UserError(f"the precision {name.name} was decided for {name.device}, not "
                            f"{device}: decide it for the device it runs on")
        return name
    device = resolve_device("auto") if device is None else torch.device(device)
    canonical = canonical_name(name)
    if canonical.startswith(PLAN_PREFIX):
        from .precision_plan import BASE_MODE, load_plan  # deferred: only plans read YAML
        plan = load_plan(canonical[len(PLAN_PREFIX):])
        reason = unsupported_reason(MODES[BASE_MODE], device)
        if reason:
            raise UserError(reason)
        return ResolvedPrecision(plan.label, str(name), plan.label, device, plan)
    mode = auto_mode(device) if canonical == "auto" else canonical
    reason = unsupported_reason(MODES[mode], device)
    if reason:
        raise UserError(reason)
    return ResolvedPrecision(mode, str(name), canonical, device)
