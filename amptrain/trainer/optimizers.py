"""The optimizer-step unit: one slot per trained part (its module, optimizer, LR scheduler
and the skip flag of its last step), stepped by name and settled in one place.

A step's skip flag (inf/NaN gradients) stays on the device; it is read one step late
(:meth:`OptimizerSteps.settle`), when the next step's forward/backward is already queued,
and only then does the part's scheduler step (a skipped step does not advance the LR).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..distributed import Strategy
from ..common.errors import UserError
from ..precision import Precision, StepOutcome
from .position import LoopPosition
from .schedule import SchedulePlan


@dataclass
class Part:
    """One trained part: what it trains and how it is stepped."""

    name: str
    module: nn.Module                  # set up for the precision (the optimizer's weights)
    forward: nn.Module                 # what the step calls (DDP-wrapped, compiled)
    optimizer: torch.optim.Optimizer
    scheduler: Any = None
    pending: StepOutcome | None = None  # the last step's outcome, not yet read
    interval: str = "step"             # when the scheduler steps (trainer/schedule.py)
    frequency: int = 1
    wait: int = 0                      # steps or epochs since it last stepped

    def schedule(self, plan: SchedulePlan | None) -> None:
        """Step ``plan``'s scheduler in its unit (None: no scheduler)."""
        self.scheduler = plan.scheduler if plan is not None else None
        if plan is not None:
            self.interval, self.frequency = plan.interval, plan.frequency

    def tick(self, unit: str) -> None:
        """One more ``unit`` ("step": a step that changed the weights; "epoch") done:
        the scheduler steps when it is this part's unit and its frequency is reached."""
        if self.scheduler is None or unit != self.interval:
            return
        self.wait += 1
        if self.wait >= self.frequency:
            self.wait = 0
            self.scheduler.step()


class OptimizerSteps:
    """Every part's optimizer step (see the module docstring); its checkpoint section is
    ``optimizers`` (:class:`~amptrain.checkpoint.stateful.Stateful`).

    ``clip``: ``--clip-grad-norm``; ``log_every``: without clipping, the gradient norm is
    only computed for steps that end a log interval.
    """

    def __init__(self, precision: Precision, position: LoopPosition, strategy: Strategy, *,
                 clip: float | None, log_every: int) -> None:
        self.precision = precision
        self.strategy = strategy  # whose optimizer states a checkpoint holds (sharded or not)
        self.position = position
        self.clip = clip
        self.log_every = log_every
        self.parts: dict[str, Part] = {}

    def add(self, part: Part) -> None:
        self.parts[part.name] = part

    def __getitem__(self, name: str) -> Part:
        try:
            return self.parts[name]
        except KeyError:
            raise UserError(f"the training step names the part {name!r}; this run's parts "
                            f"are {', '.join(map(repr, self.parts))}") from None

    @property
    def single(self) -> bool:
        """One part: records and checkpoints keep the one-model format."""
        return len(self.parts) == 1

    def only(self) -> Part:
        """The one part of a one-part run."""
        if not self.single:
            raise UserError(f"this run trains {len(self.parts)} parts "
                            f"({', '.join(self.parts)}): use trainer.parts or .optimizers")
        (part,) = self.parts.values()
        return part

    def settle(self, name: str | None = None) -> None:
        """Read the skip flag of part ``name``'s last step (every part's by default) and
        step its scheduler when the weights changed; raises NonFiniteHalt when training
        must stop. The one place a skip flag is read."""
        for part in ([self[name]] if name is not None else self.parts.values()):
            outcome, part.pending = part.pending, None
            if outcome is None:
                continue
            if self.precision.confirm(outcome, step=self.position.step):
                part.tick("step")

    def epoch_ended(self) -> None:
        """An epoch is over: per-epoch schedulers step (after the last step settled)."""
        self.settle()
        for part in self.parts.values():
            part.tick("epoch")

    def zero_grad(self, optimizers: bool = False) -> None:
        """Drop every part's gradients before a step, so that what one loss left on another
        part never leaks into that part's step; ``optimizers``: the optimizers' too (fp32
        masters), after a failed attempt."""
        for part in self.parts.values():
            part.module.zero_grad(set_to_none=True)
            if optimizers:
                part.optimizer.zero_grad(set_to_none=True)

    def records(self) -> dict[str, Any]:
        """The record's per-part fields: ``lr`` (one part) or ``lr/<name>``."""
        if self.single:
            (part,) = self.parts.values()
            return {"lr": float(part.optimizer.param_groups[0]["lr"])}
        return {f"lr/{p.name}": float(p.optimizer.param_groups[0]["lr"])
                for p in self.parts.values()}

    def skipped_records(self) -> dict[str, int]:
        """``skipped_steps/<name>`` per part (several parts only)."""
        if self.single:
            return {}
        # The precision counts each optimizer's skips (and checkpoints them).
        return {f"skipped_steps/{p.name}": self.precision.skipped_steps_of(p.optimizer)
                for p in self.parts.values()}

    # ------------------------------------------- its checkpoint section (Stateful)
    section = "optimizers"
    format_version = 1

    def state_dict(self, *, optimizer_states: bool = True) -> dict[str, Any]:
        """The ``optimizers`` section: ``{part: {"optimizer": state, "scheduler": state}}``.
        ``optimizer_states=False``: each optimizer's state left empty (``{}``: a sharded
        save's shards hold it)."""
        self.settle()  # the lagged step's skip flag decides the scheduler state
        return {p.name: {"optimizer": self.strategy.optimizer_state_dict(p.module, p.optimizer)
                         if optimizer_states else {},
                         "scheduler": p.scheduler.state_dict() if p.scheduler is not None
                         else None,
                         # a scheduler stepped every n units: how far into the n it is
                         **({"scheduler_wait": p.wait} if p.frequency > 1 else {})}
                for p in self.parts.values()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; an empty optimizer state (a sharded checkpoint's) is
        left to the shards, which restore it themselves."""
        if set(state) != set(self.parts):
            if self.single:
                raise UserError(f"the checkpoint holds the optimizers of several parts "
                                f"({', '.join(state)}); this run trains one")
            saved = "one model" if len(state) == 1 else ", ".join(state)
            raise UserError(f"the checkpoint holds optimizers for {saved}; this run trains "
                            f"{', '.join(self.parts)}")
        for part in self.parts.values():
            saved = state[part.name]
            if saved["optimizer"]:
                self.strategy.load_optimizer_state_dict(part.module, part.optimizer,
                                                        saved["optimizer"])
            if part.scheduler is not None and saved["scheduler"] is not None:
                part.scheduler.load_state_dict(saved["scheduler"])
            part.wait = saved.get("scheduler_wait", 0)

    def migrate(self, state: dict[str, Any], version: int) -> dict[str, Any]:
        """Version 0 (a whole file of format 1) kept one part's state as ``optimizer`` and
        ``scheduler`` at the top, several parts' as ``optimizers`` {part: state} and
        ``parts`` {part: {"scheduler": state}}."""
        if "optimizer" in state:
            (name,) = self.parts if self.single else ("model",)
            return {name: {"optimizer": state["optimizer"],
                           "scheduler": state.get("scheduler")}}
        schedulers = state.get("parts") or {}
        return {name: {"optimizer": optimizer,
                       "scheduler": (schedulers.get(name) or {}).get("scheduler")}
                for name, optimizer in (state.get("optimizers") or {}).items()}
