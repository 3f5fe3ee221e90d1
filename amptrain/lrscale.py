"""Learning rate for the batch size actually trained, and the warm-up that goes with it.

The rule (Goyal et al. 2017, "Accurate, Large Minibatch SGD"): a learning rate tuned at
``--base-batch-size`` B0 carries over to a global batch B by scaling it with the batch,

* ``--lr-scaling linear``: lr = lr0 * B / B0  (Goyal et al.; SGD)
* ``--lr-scaling sqrt``:   lr = lr0 * sqrt(B / B0)  (Krizhevsky 2014; often better for Adam)
* ``--lr-scaling none``:   lr = lr0

and a scaled-up rate needs a gradual warm-up, or the first steps diverge. Goyal et al.
warm up for 5 epochs of a 90-epoch run; most runs here are much shorter, so the automatic
warm-up is capped at a tenth of the run:

    auto warm-up = min(5 epochs, ceil(10% of the run's steps))      when the lr is scaled UP

and the warm-up used is ``max(--warmup-steps, auto warm-up)`` (never longer than the run),
so a longer ``--warmup-steps`` always wins and scaling down adds no warm-up. The warm-up
itself is :func:`amptrain.optim.build_scheduler`'s linear ramp: step ``s`` (0-based) runs at
``lr * (s + 1) / warmup``, then the chosen schedule (none, cosine, onecycle) takes over.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .config import TrainConfig, replace_options
from .errors import flag
from .optim import scaled_lr

#: Goyal et al.'s warm-up length, in epochs.
GOYAL_WARMUP_EPOCHS = 5
#: Cap on the automatic warm-up, as a share of the run's optimizer steps.
AUTO_WARMUP_FRACTION = 0.1


@dataclass(frozen=True)
class LrPlan:
    """The learning rate and warm-up a run really uses, and where they came from."""

    base_lr: float          # --lr (or the optimizer's default), as tuned at --base-batch-size
    lr: float               # after --lr-scaling
    factor: float           # lr / base_lr
    warmup_steps: int       # the warm-up the scheduler uses
    warmup_given: int       # --warmup-steps
    warmup_auto: int        # the automatic warm-up for a scaled-up lr (0 when not scaling up)

    def scheduler_config(self, config: TrainConfig) -> TrainConfig:
        """``config`` with the warm-up actually used (for ``build_scheduler``)."""
        return replace_options(config, warmup_steps=self.warmup_steps)

    def describe(self, config: TrainConfig) -> str | None:
        """One line for the log when --lr-scaling changed the lr (and maybe the warm-up)."""
        if config.schedule.lr_scaling == "none":
            return None
        ratio = f"{config.batching.batch_size}/{config.schedule.base_batch_size}"
        how = ratio if config.schedule.lr_scaling == "linear" else f"sqrt({ratio})"
        source = (f"automatic for a scaled-up lr: min({GOYAL_WARMUP_EPOCHS} epochs, "
                  f"{AUTO_WARMUP_FRACTION:.0%} of the run)"
                  if self.warmup_steps > self.warmup_given else flag("warmup_steps"))
        return (f"lr scaling {config.schedule.lr_scaling}: lr {self.base_lr:g} x {how} "
                f"= {self.lr:g} "
                f"({flag('batch_size')} {config.batching.batch_size}, "
                f"{flag('base_batch_size')} {config.schedule.base_batch_size}); "
                f"warm-up {self.warmup_steps} steps ({source})")

    def report(self) -> dict[str, Any]:
        """What config.yaml records besides ``lr`` and ``warmup_steps``."""
        return {"base_lr": self.base_lr, "lr_factor": self.factor,
                "warmup_steps_given": self.warmup_given, "warmup_steps_auto": self.warmup_auto}


def auto_warmup_steps(steps_per_epoch: int, total_steps: int) -> int:
    """Goyal et al.'s 5 epochs, capped at 10% of the run (at least one step)."""
    return max(1, min(GOYAL_WARMUP_EPOCHS * steps_per_epoch,
                      math.ceil(AUTO_WARMUP_FRACTION * total_steps)))


def plan_lr(config: TrainConfig, steps_per_epoch: int, total_steps: int) -> LrPlan:
    """The learning rate and warm-up for ``config``'s batch size (see the module docstring)."""
    base = config.schedule.resolved_lr()
    lr = scaled_lr(config)
    factor = lr / base
    auto = auto_warmup_steps(steps_per_epoch, total_steps) if factor > 1.0 else 0
    warmup = min(max(config.schedule.warmup_steps, auto), max(1, total_steps))
    return LrPlan(base_lr=base, lr=lr, factor=factor, warmup_steps=warmup,
                  warmup_given=config.schedule.warmup_steps, warmup_auto=auto)
