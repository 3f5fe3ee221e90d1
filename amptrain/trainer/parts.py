"""The Trainer's parts as one object: what :meth:`Trainer.prepare` builds to evaluate
(:class:`Prepared`) and what :meth:`Trainer.setup` builds to train (:class:`RunParts`,
made by :func:`~amptrain.trainer.assembly.assemble_parts` in one pass). The Trainer keeps
the object and hands its parts out by name; no part is set on the Trainer from outside.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from torch import nn

from .windows import Windows
from .optim import LrSchedule
from ..tasks import Task
from .checkpointing import Checkpointer
from .evaluation import Evaluator
from .optimizers import OptimizerSteps
from .position import RunLength
from .stepping import TrainStep

log = logging.getLogger("amptrain")


@dataclass
class Prepared:
    """A model set up for the precision and device, its task, and how it is evaluated."""

    model: nn.Module          # the user's module, set up for the precision
    task: Task
    evaluator: Evaluator


@dataclass
class RunParts(Prepared):
    """Everything a run trains with, decided once at set-up (see the module docstring)."""

    steps: OptimizerSteps      # every trained part with its optimizer and scheduler
    train_step: TrainStep      # the step context and what runs around each step
    windows: Windows           # the train data cut into step windows
    lr_schedule: LrSchedule
    run_length: RunLength      # when the loop ends (and the LR schedule's length)
    checkpointer: Checkpointer  # every part with state is registered with it
    constant_lr: bool          # the caller's optimizer, no schedule asked for
    schedule_words: str = ""   # the banner's note on the caller's scheduler's unit

    def use_windows(self, windows: Windows) -> None:
        """Train on ``windows`` from now on (a tool's wrapper of the set-up windows: the
        benchmarks' feeder, the overhead tests' spy); the checkpoints count its steps."""
        self.windows = self.checkpointer.windows = windows


class TaskState:
    """What the task learnt from the training data (regression's target statistics, an
    LM's bytes per token) as the checkpoint section ``task``
    (:class:`~amptrain.checkpoint.stateful.Stateful`): ``eval`` and ``generate`` rebuild
    the task from it. A resumed run's task learns it again from the same data in set-up
    (``check_compatible`` already refused another task); loading only warns when what it
    learnt differs from what the checkpoint's run learnt."""

    section = "task"
    format_version = 1

    def __init__(self, task: Task) -> None:
        self.task = task

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.task.name, **self.task.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = {k: v for k, v in state.items() if k != "name"}
        learnt = self.task.state()
        if saved and saved != learnt:
            log.warning("warning: the task learnt %s from this run's data; the checkpoint's "
                        "run learnt %s: the resumed run's losses are not the unbroken run's",
                        learnt, saved)

    def migrate(self, state: dict[str, Any], version: int) -> dict[str, Any]:
        """Version 0 (a whole file of format 1) kept the same entries under ``task`` (none:
        a file from before tasks, whose run was a classification)."""
        return dict(state.get("task") or {"name": self.task.name})
