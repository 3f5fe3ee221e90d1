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
from ..errors import UserError
from ..precision import Precision, StepOutcome
from .position import LoopPosition


@dataclass
class Part:
    """One trained part: what it trains and how it is stepped."""

    name: str
    module: nn.Module                  # set up for the precision (the optimizer's weights)
    forward: nn.Module                 # what the step calls (DDP-wrapped, compiled)
    optimizer: torch.optim.Optimizer
    scheduler: Any = None
    pending: StepOutcome | None = None  # the last step's outcome, not yet read


class OptimizerSteps:
    """Every part's optimizer step (see the module docstring).

    ``clip``: ``--clip-grad-norm``; ``log_every``: without clipping, the gradient norm is
    only computed for steps that end a log window.
    """

    def __init__(self, precision: Precision, position: LoopPosition, *, clip: float | None,
                 log_every: int) -> None:
        self.precision = precision
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

    def step(self, name: str) -> torch.Tensor | None:
        """Part ``name``'s optimizer step; returns the gradient norm when one was computed
        (clipping, or a step that ends a log window), on the device."""
        part = self[name]
        # Reading the previous step's skip flag only now lets the device run this step's
        # forward/backward meanwhile; the LR it sets is still the one this step needs.
        self.settle(name)
        params = part.module.parameters()
        norm = None
        if self.clip:
            norm = self.precision.clip_grad_norm_(params, self.clip, optimizer=part.optimizer)
        elif (self.position.step + 1) % self.log_every == 0:
            norm = self.precision.grad_norm(params, optimizer=part.optimizer)
        part.pending = self.precision.step_async(part.optimizer)
        part.optimizer.zero_grad(set_to_none=True)
        return norm

    def settle(self, name: str | None = None) -> None:
        """Read the skip flag of part ``name``'s last step (every part's by default) and
        step its scheduler when the weights changed; raises NonFiniteHalt when training
        must stop. The one place a skip flag is read."""
        for part in ([self[name]] if name is not None else self.parts.values()):
            outcome, part.pending = part.pending, None
            if outcome is None:
                continue
            if self.precision.confirm(outcome, step=self.position.step) \
                    and part.scheduler is not None:
                part.scheduler.step()

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

    # ------------------------------------------------------------------ state
    def state_dict(self, strategy: Strategy, *, optimizer_states: bool = True) -> dict[str, Any]:
        """One part: today's ``optimizer`` and ``scheduler`` entries; several: an
        ``optimizers`` section {name: state} and a ``parts`` section (scheduler, skips).
        ``optimizer_states=False``: the optimizer states left empty (a sharded save holds them)."""
        self.settle()  # the lagged step's skip flag decides the scheduler state

        def state_of(part: Part) -> dict[str, Any]:
            return strategy.optimizer_state_dict(part.module, part.optimizer) \
                if optimizer_states else {}

        if self.single:
            (part,) = self.parts.values()
            return {"optimizer": state_of(part), "scheduler": _scheduler_state(part)}
        return {"optimizers": {p.name: state_of(p) for p in self.parts.values()},
                "parts": {p.name: {"scheduler": _scheduler_state(p)}
                          for p in self.parts.values()}}

    def load_state_dict(self, strategy: Strategy, state: dict[str, Any], *,
                        optimizer_states: bool = True) -> None:
        """Restore :meth:`state_dict`'s entries of a checkpoint (``optimizer_states=False``: all
        but the optimizer states, which a sharded checkpoint restores itself)."""
        if self.single:
            if "optimizer" not in state:
                raise UserError(f"the checkpoint holds the optimizers of several parts "
                                f"({', '.join(state.get('optimizers') or {})}); this run "
                                f"trains one")
            (part,) = self.parts.values()
            if optimizer_states:
                strategy.load_optimizer_state_dict(part.module, part.optimizer,
                                                   state["optimizer"])
            _load_scheduler(part, state.get("scheduler"))
            return
        optimizers = state.get("optimizers") or {}
        if set(optimizers) != set(self.parts):
            raise UserError(f"the checkpoint holds optimizers for "
                            f"{', '.join(optimizers) or 'one model'}; this run trains "
                            f"{', '.join(self.parts)}")
        for part in self.parts.values():
            strategy.load_optimizer_state_dict(part.module, part.optimizer,
                                               optimizers[part.name])
            saved = (state.get("parts") or {}).get(part.name, {})
            _load_scheduler(part, saved.get("scheduler"))


def _scheduler_state(part: Part) -> dict[str, Any] | None:
    return part.scheduler.state_dict() if part.scheduler is not None else None


def _load_scheduler(part: Part, state: dict[str, Any] | None) -> None:
    if part.scheduler is not None and state is not None:
        part.scheduler.load_state_dict(state)
