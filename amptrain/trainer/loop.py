"""The Trainer's loop as a task that owns its iteration drives it: :class:`TaskLoop`, the
:class:`~amptrain.tasks.step.TrainLoop` handed to :meth:`Iteration.iterate
<amptrain.tasks.iteration.Iteration.iterate>` (PPO's updates).

The task decides what happens between steps (a rollout) and which data epoch comes next;
everything else stays the Trainer's: the data order and its windows, the step itself
(precision, out-of-memory redo), the position, and after each step the logs, evaluation,
checkpoints and agreed stops. A *bare* loop (``compare``'s timing) runs a given number of
steps with none of that bookkeeping.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ContextManager

import torch
from torch import nn

if TYPE_CHECKING:
    from .core import Trainer


class TaskLoop:
    """The :class:`~amptrain.tasks.step.TrainLoop` of ``trainer`` (set up); ``bare_steps``:
    a timing loop of that many steps, without bookkeeping (module docstring)."""

    def __init__(self, trainer: Trainer, *, bare_steps: int | None = None) -> None:
        self._trainer = trainer
        self._parts = trainer._ready()
        self._bare_until = None if bare_steps is None else trainer.position.step + bare_steps
        self.rank = trainer.strategy.rank
        self.world_size = trainer.strategy.world_size
        self.last_window: Any = None   # the last step's window (compare's batch size)

    @property
    def step_number(self) -> int:
        return self._trainer.position.step

    @property
    def done(self) -> bool:
        if self._bare_until is not None:
            return self._trainer.position.step >= self._bare_until
        return self._trainer._done()

    def epoch(self, index: int, start: int = 0, *, saves: bool = True) -> Iterator[Any]:
        if self.done:
            return
        trainer, windows = self._trainer, self._parts.windows
        if self._bare_until is not None:
            for window in windows.epoch(index, start):
                yield window
                if self.done:
                    return
            return
        position = trainer.position
        position.epoch, position.window_in_epoch = index, start
        fresh = trainer._start_epoch(windows)
        for window in trainer.log_interval.timed(windows.epoch(index, start)):
            yield window
            if self.done:
                break
        trainer._end_of_epoch(windows, fresh, saves=saves)

    def step(self, window: Any) -> None:
        trainer, train_step = self._trainer, self._parts.train_step
        self.last_window = window
        with train_step.on(window, trainer.position.step + 1) as function:
            function(train_step)
        if self._bare_until is not None:
            trainer.finish_step()
            trainer.position.step += 1   # the step number the task sees; nothing logged
            return
        trainer.position.advance()
        trainer._after_step()

    def model(self, name: str = "model") -> nn.Module:
        return self._parts.train_step.model(name)

    def autocast(self) -> ContextManager:
        return self._parts.train_step.autocast()

    def log(self, key: str, value: torch.Tensor, samples: int) -> None:
        self._parts.train_step.carry(key, value, samples)


__all__ = ["TaskLoop"]
