"""One training step: the :class:`~amptrain.tasks.step.StepContext` the task's step runs
against, and :class:`StepRunner`, which runs it -- gradients zeroed, the step-start state
saved, a step that ran out of memory redone in smaller micro-batches (through
:class:`~amptrain.trainer.autobatch.MicroBatchPlanner`), the loss scale updated once, the logged
values counted once."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ContextManager

import torch
from torch import nn

from .autobatch import MicroBatchPlanner, MicroBatchSplit, OutOfMemoryHalt, is_out_of_memory
from .windows import StepBatch
from ..distributed import Strategy
from ..common.forward import LossFn
from ..precision import Precision
from ..tasks.step import StepContext, supervised_step
from .metrics import LogInterval
from .optimizers import OptimizerSteps
from .snapshot import StepStart

StepFn = Callable[[StepContext], None]


class TrainStep:
    """The Trainer's :class:`~amptrain.tasks.step.StepContext`: one object, pointed at each
    step's window in turn."""

    def __init__(self, steps: OptimizerSteps, precision: Precision, strategy: Strategy,
                 interval: LogInterval) -> None:
        self._steps, self._precision, self._strategy = steps, precision, strategy
        self._interval = interval
        self._backward = precision.backward
        self.micro_batches: list[Any] = []
        self.micro_samples: list[int] = []
        self.global_samples = 0
        self.step_number = 0
        self.logged: list[tuple[str, torch.Tensor, int]] = []
        self.stepped: str | None = None   # a part stepped in this attempt (no redo after)

    def begin(self, window: StepBatch) -> None:
        """Point at ``window``: a fresh attempt of a step."""
        self.micro_batches = window.micro_batches
        self.micro_samples = window.micro_samples
        self.global_samples = window.global_samples
        self.logged = []
        self.stepped = None

    def model(self, name: str = "model") -> nn.Module:
        return self._steps[name].forward

    def optimizer(self, name: str = "model") -> torch.optim.Optimizer:
        return self._steps[name].optimizer

    def autocast(self) -> ContextManager:
        return self._precision.autocast()

    def micro(self, name: str = "model") -> Iterator[tuple[Any, int, float]]:
        forward = self._steps[name].forward
        world = self._strategy.world_size
        last = len(self.micro_batches) - 1
        for i, (batch, n) in enumerate(zip(self.micro_batches, self.micro_samples)):
            with self._strategy.accumulation_context(forward, boundary=i == last):
                yield batch, n, n * world / self.global_samples

    def backward(self, loss: torch.Tensor, *, loss_id: int = 0) -> None:
        self._backward(loss, loss_id=loss_id)

    def step(self, name: str = "model") -> None:
        self.stepped = name
        norm = self._steps.step(name)
        if norm is not None:
            self._interval.grad_norms[name] = norm

    def log(self, key: str, value: torch.Tensor, samples: int) -> None:
        self.logged.append((key, value, samples))


class StepRunner:
    """Runs the step function on each window (see the module docstring).

    ``training_step``: the task's or the caller's step; None runs the supervised step
    with ``loss_fn``, whose first batch goes through ``check`` (the one-time output check
    of data that could not be probed at set-up).
    """

    def __init__(self, steps: OptimizerSteps, *, precision: Precision, strategy: Strategy,
                 planner: MicroBatchPlanner, interval: LogInterval, model: nn.Module,
                 device: torch.device, training_step: StepFn | None, loss_fn: LossFn,
                 check: Callable[[Any, Any], None] | None = None) -> None:
        self.steps, self.precision, self.strategy = steps, precision, strategy
        self.planner, self.interval = planner, interval
        self.training_step, self.loss_fn, self.check = training_step, loss_fn, check
        self.context = TrainStep(steps, precision, strategy, interval)
        # On out-of-memory the planner redoes a step in smaller micro-batches, from the
        # same RNG and BatchNorm state (one process only: several halt instead).
        self.start = StepStart(model, device) if strategy.world_size == 1 else None
        self.last_window: StepBatch | None = None

    def run(self, window: StepBatch, split: MicroBatchSplit, step: int
            ) -> MicroBatchSplit:
        """One optimizer step of every part on ``window`` (cut as ``split``); returns the
        split later steps should use (smaller after out-of-memory)."""
        if not self.steps.single:
            # What one part's loss left on another (G's loss through D) must not reach that
            # part's step. One part needs no pass over the modules: its optimizer's
            # zero_grad after each step already left every gradient it steps at None.
            self.steps.zero_grad()
        if self.start is not None:
            self.start.save()
        self.context.step_number = step
        window, split = self.planner.run(window, self._attempt, plan=split, step=step,
                                         drop_gradients=self._drop_gradients,
                                         step_start=self.start)
        self.precision.update()
        self.last_window = window
        self.interval.add(self.context.logged, window.global_samples)
        return split

    def _attempt(self, window: StepBatch) -> None:
        ctx = self.context
        ctx.begin(window)
        try:
            if self.training_step is not None:
                self.training_step(ctx)
            else:
                check, self.check = self.check, None  # the run's first batch only
                supervised_step(ctx, self.loss_fn, check)
        except Exception as exc:
            if ctx.stepped is not None and is_out_of_memory(exc):
                raise OutOfMemoryHalt(
                    f"out of memory after part '{ctx.stepped}' stepped: a step that already "
                    f"updated weights cannot be redone in smaller micro-batches; set a "
                    f"smaller micro-batch size") from exc
            raise

    def _drop_gradients(self) -> None:
        self.steps.zero_grad(optimizers=True)
