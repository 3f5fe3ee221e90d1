"""When a part's LR scheduler steps: every optimizer step (amptrain's own ``--scheduler``
schedules, which are laid out in steps) or, for a caller's own scheduler, in the unit the
caller asked for, Lightning's convention: a bare scheduler steps once per epoch, and
``{"scheduler": s, "interval": "epoch" | "step", "frequency": n}`` says it explicitly.

(pytorch/examples' MNIST steps ``StepLR(step_size=1, gamma=0.7)`` once per epoch; stepped
every optimizer step instead, its LR fell to 1e-50 and the model stopped learning at 56 %,
with nothing said -- issue 49.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..common.errors import UserError, flag
from ..config import SCHEDULERS

INTERVALS = ("epoch", "step")
_KEYS = {"scheduler", "interval", "frequency"}


@dataclass(frozen=True)
class SchedulePlan:
    """A scheduler and when it steps: every ``frequency`` epochs or optimizer steps."""

    scheduler: Any
    interval: str = "step"
    frequency: int = 1
    said: str = ""  # how the banner names a scheduler whose unit it says ("" : none)

    @classmethod
    def of_config(cls, scheduler: Any, scheduler_name: str, interval: str | None) -> SchedulePlan:
        """amptrain's own ``--scheduler`` (laid out in optimizer steps: stepped every step)
        or a torch class named by it (per ``--scheduler-interval``, default epoch)."""
        if scheduler_name in SCHEDULERS:
            return cls(scheduler)
        return cls(scheduler, interval or "epoch", said=f"scheduler {scheduler_name}")

    @classmethod
    def of_caller(cls, given: Any) -> SchedulePlan:
        """The plan of ``fit(scheduler=given)``: a bare scheduler (stepped per epoch) or a
        Lightning-style dict; anything else is refused in one line naming ``scheduler``."""
        if isinstance(given, dict):
            unknown = sorted(set(given) - _KEYS)
            if unknown or "scheduler" not in given:
                raise UserError(
                    f"scheduler as a dict takes the keys 'scheduler' (required), 'interval' "
                    f"and 'frequency' (got {', '.join(map(repr, sorted(given)))})")
            interval = given.get("interval", "epoch")
            frequency = given.get("frequency", 1)
            scheduler = given["scheduler"]
        else:
            scheduler, interval, frequency = given, "epoch", 1
        if interval not in INTERVALS:
            raise UserError(f"scheduler's interval must be 'epoch' or 'step' (got {interval!r})")
        if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 1:
            raise UserError(f"scheduler's frequency must be a whole number of {interval}s "
                            f">= 1 (got {frequency!r})")
        if not callable(getattr(scheduler, "step", None)) or \
                not callable(getattr(scheduler, "state_dict", None)):
            raise UserError(f"scheduler must be a torch.optim.lr_scheduler object (with step() "
                            f"and state_dict()) or a dict holding one (got "
                            f"{type(scheduler).__name__})")
        if type(scheduler).__name__ == "ReduceLROnPlateau":
            raise UserError("scheduler ReduceLROnPlateau steps on a metric, which fit does not "
                            "hand it: step it yourself in a callback's on_log")
        return cls(scheduler, interval, frequency, said="your scheduler")

    def describe(self) -> str:
        """For the run's first line: the unit the caller's scheduler steps in."""
        if not self.said:
            return ""
        unit = self.interval if self.frequency == 1 else f"{self.frequency} {self.interval}s"
        other = "step" if self.interval == "epoch" else "epoch"
        how = (f"{flag('scheduler_interval')} {other}" if self.said != "your scheduler" else
               f"scheduler={{'scheduler': s, 'interval': '{other}'}}")
        return f"; {self.said} steps once per {unit} ({how} for per-{other})"
