"""The dynamic loss scaler's four settings, declared once: names, defaults, help, checks.

``torch.amp.GradScaler`` takes ``init_scale``, ``growth_factor``, ``backoff_factor`` and
``growth_interval``; amptrain exposes them as ``--init-scale`` ... (``config.PrecisionConfig``),
as keywords of ``Precision(...)``, and names them when they do nothing in a mode without a
loss scaler (``amptrain.trainer.inapplicable``). All three read this module. It imports no torch, so
the command-line parser can be built from it at once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from .errors import UserError, flag


@dataclass(frozen=True)
class ScalerSettings:
    """The loss scaler's settings, checked when built (each error names its option).

    The class attributes are the defaults: ``Precision(init_scale=ScalerSettings.init_scale)``.
    """

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def __post_init__(self) -> None:
        check_scaler_settings(self.as_kwargs())

    def as_kwargs(self) -> dict[str, Any]:
        """The settings as ``torch.amp.GradScaler``'s keyword arguments."""
        return {name: getattr(self, name) for name in SCALER_SETTINGS}


#: The settings' names, in GradScaler's order.
SCALER_SETTINGS: tuple[str, ...] = tuple(f.name for f in fields(ScalerSettings))

#: One line of help per setting (``--help``, the config's option table).
SCALER_HELP: dict[str, str] = {
    "init_scale": "initial fp16 loss scale",
    "growth_factor": "loss-scale growth factor",
    "backoff_factor": "loss-scale backoff factor on overflow",
    "growth_interval": "clean steps before the loss scale grows",
}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_scaler_settings(values: dict[str, Any]) -> None:
    """Raise a UserError naming the first of ``values`` (setting name -> value) that is not
    a valid loss-scaler setting; names that are not scaler settings are ignored."""
    for name, value in values.items():
        if name == "init_scale" and not (_number(value) and math.isfinite(value) and value > 0):
            raise UserError(f"{flag(name)} must be a positive number (got {value})")
        if name == "growth_factor" and not (_number(value) and value > 1.0):
            raise UserError(f"{flag(name)} must be > 1 (got {value})")
        if name == "backoff_factor" and not (_number(value) and 0.0 < value < 1.0):
            raise UserError(f"{flag(name)} must be between 0 and 1 (got {value})")
        if name == "growth_interval" and not (isinstance(value, int)
                                              and not isinstance(value, bool) and value >= 1):
            raise UserError(f"{flag(name)} must be an integer >= 1 (got {value!r})")
