"""The precision settings, declared once: ``--precision`` and every option of its mode.

:class:`PrecisionConfig` holds each setting with its default, its help and its check. The
command line's flags, the YAML keys and ``Trainer(...)``'s keywords are generated from it
(:mod:`amptrain.common.options`; the run's config nests it as ``config.precision``), and
``Precision(...)``'s keywords are built into it (:meth:`PrecisionConfig.from_keywords`), so
a default or a check is written nowhere else. It imports no torch: ``amptrain --help`` is
built from it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..common.choices import MX_SCALES, NVFP4_PARTS, PRECISION_NAMES, WEIGHT_UPDATES, canonical_name
from ..common.errors import UserError, flag
from ..common.options import (build_config, config_fields, option, require_choices,
                              require_non_negative, require_positive, shown)

#: The dynamic loss scaler's settings, as ``torch.amp.GradScaler`` names them, in its order.
SCALER_SETTINGS: tuple[str, ...] = ("init_scale", "growth_factor", "backoff_factor",
                                    "growth_interval")


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


@dataclass(frozen=True)
class ScalerSettings:
    """The loss scaler's settings as one value (:attr:`PrecisionConfig.scaler_settings`),
    checked when built; the defaults are :class:`PrecisionConfig`'s."""

    init_scale: float
    growth_factor: float
    backoff_factor: float
    growth_interval: int

    def __post_init__(self) -> None:
        check_scaler_settings(self.as_kwargs())

    def as_kwargs(self) -> dict[str, Any]:
        """The settings as ``torch.amp.GradScaler``'s keyword arguments."""
        return {name: getattr(self, name) for name in SCALER_SETTINGS}


@dataclass
class PrecisionConfig:
    """The precision mode and its settings (see the module docstring); checked when built,
    each error naming its flag (command line) or keyword (library)."""

    name: str = option("auto", "precision mode (see `amptrain env`); auto picks the best the "
                               "hardware supports; Lightning and Keras spellings and Apex's "
                               "O0-O3 are taken too",
                       group="precision", flat="precision", choices=PRECISION_NAMES,
                       open_choices=True)
    init_scale: float = option(65536.0, "initial fp16 loss scale", group="precision")
    growth_factor: float = option(2.0, "loss-scale growth factor", group="precision")
    backoff_factor: float = option(0.5, "loss-scale backoff factor on overflow",
                                   group="precision")
    growth_interval: int = option(2000, "clean steps before the loss scale grows",
                                  group="precision")
    min_scale: float = option(1.0, "loss-scale floor: reaching it stops training",
                              group="precision")
    keep_fp32: list[str] = option([], "glob of module names run in fp32 inside autocast "
                                      "(repeatable, e.g. head or '*.norm*')", group="precision")
    max_bad_steps: int = option(10, "consecutive non-finite steps (no loss scaler) before "
                                    "training stops", group="precision")
    weight_update: str = option("plain", "how updates land on half weights without masters "
                                         "(bf16-true, 16-true): plain rounding, kahan "
                                         "(compensation buffer) or stochastic rounding",
                                group="precision", choices=WEIGHT_UPDATES)
    lowbit_bf16_last: int = option(0, "low-bit precisions: keep the last N eligible Linear "
                                      "layers in bf16 (the NVFP4 recipe keeps the final "
                                      "blocks in higher precision)", group="precision")
    mx_scale: str = option("floor", "MX precisions (mxfp8, mxfp4): how each block's e8m0 "
                                    "scale is chosen: floor (OCP MX spec) or rceil "
                                    "(NVIDIA's round-up, nothing saturates)",
                           group="precision", choices=MX_SCALES)
    nvfp4_without: str = option("none", "--precision nvfp4: leave one part of the training "
                                        "recipe out, for an ablation: rht (Hadamard "
                                        "transform), sr (stochastic rounding) or 2d (16x16 "
                                        "weight blocks)", group="precision",
                                choices=NVFP4_PARTS)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise UserError(f"{flag('precision')} must be a mode's name (got {shown(self.name)})")
        canonical_name(self.name)  # a mode, an alias or auto (open choices: checked here)
        require_positive(self, "max_bad_steps")
        require_non_negative(self, "lowbit_bf16_last")
        require_choices(self)
        check_scaler_settings({name: getattr(self, name) for name in SCALER_SETTINGS})
        if not (_number(self.min_scale) and math.isfinite(self.min_scale)
                and self.min_scale > 0):
            raise UserError(f"{flag('min_scale')} must be a positive number "
                            f"(got {self.min_scale})")
        if self.min_scale > self.init_scale:
            raise UserError(f"{flag('min_scale')} ({self.min_scale}) must not exceed "
                            f"{flag('init_scale')} ({self.init_scale})")

    @property
    def scaler_settings(self) -> ScalerSettings:
        """The loss scaler's four settings as one value."""
        return ScalerSettings(**{name: getattr(self, name) for name in SCALER_SETTINGS})

    @classmethod
    def from_keywords(cls, **keywords: Any) -> PrecisionConfig:
        """The settings ``Precision(...)`` was given by keyword (every option but the mode,
        which is its first argument), converted and checked as their flags are; an unknown
        keyword is refused by name."""
        if "precision" in keywords:
            raise UserError("Precision() takes the mode as its first argument, not "
                            "precision=")
        known = config_fields(cls)
        for name in keywords:
            if name not in known:
                raise UserError(f"unknown keyword {name!r} for Precision (its settings: "
                                f"{', '.join(n for n in known if n != 'precision')})")
        return build_config(cls, keywords, source="keyword")


#: The settings only a low-bit format reads: its last layers kept in bf16, its MX scales,
#: the NVFP4 recipe's ablation. A workflow that trains other precisions beside its low-bit
#: runs (``plan``'s 32-true probe and its baseline) runs those at the defaults, so they do
#: not warn that the settings do nothing there (the low-bit runs still check them).
LOWBIT_SETTINGS = ("lowbit_bf16_last", "mx_scale", "nvfp4_without")


def lowbit_defaults() -> dict[str, Any]:
    """:data:`LOWBIT_SETTINGS` at their defaults, by flat name (for ``with_options``)."""
    defaults = PrecisionConfig()
    return {name: getattr(defaults, name) for name in LOWBIT_SETTINGS}
