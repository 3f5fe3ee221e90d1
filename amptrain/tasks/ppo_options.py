"""The ppo task's options (:mod:`.ppo`), declared once beside it: its hyper-parameters by
CleanRL's names, with their checks and the data they apply to (gym: data, as the task
does). The command line's flags, the YAML keys and the library's keywords are generated
from this declaration; the task's recipe fills in those not given. Torch-free: the
command line's parser is built from it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from ..common.errors import UserError, flag
from ..common.options import option, require_positive
from ..data.gym_options import RL_SCOPE
from ..data.scope import DataScope


@dataclass
class PpoOptions:
    """The ppo task's options (its hyper-parameters, by CleanRL's names), checked when
    built; None leaves the value to the task's recipe (CleanRL's defaults)."""

    SCOPE: ClassVar[DataScope] = RL_SCOPE

    env_steps: int | None = option(None, "gym: data: environment steps to train (all "
                                         "processes; sets the run's length; default 500000)",
                                   kind=int, group="rl")
    minibatches: int | None = option(None, "ppo: minibatches per rollout epoch (CleanRL: 4 "
                                           "discrete, 32 continuous)", kind=int, group="rl")
    update_epochs: int | None = option(None, "ppo: epochs over each rollout (CleanRL: 4 "
                                             "discrete, 10 continuous)", kind=int, group="rl")
    gamma: float | None = option(None, "ppo: discount (CleanRL: 0.99)", kind=float, group="rl")
    gae_lambda: float | None = option(None, "ppo: GAE lambda (CleanRL: 0.95)", kind=float,
                                      group="rl")
    clip_coef: float | None = option(None, "ppo: surrogate and value clipping (CleanRL: 0.2)",
                                     kind=float, group="rl")
    ent_coef: float | None = option(None, "ppo: entropy bonus (CleanRL: 0.01 discrete, 0 "
                                          "continuous)", kind=float, group="rl")
    vf_coef: float | None = option(None, "ppo: value-loss weight (CleanRL: 0.5)", kind=float,
                                   group="rl")

    def __post_init__(self) -> None:
        require_positive(self, "env_steps", "minibatches", "update_epochs", optional=True)
        for name in ("gamma", "gae_lambda"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise UserError(f"{flag(name)} must be between 0 and 1 (got {value})")
        for name in ("clip_coef", "ent_coef", "vf_coef"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise UserError(f"{flag(name)} must be a number >= 0 (got {value})")

    def given(self) -> dict[str, Any]:
        """The options given (the rest: the task's recipe decides)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}
