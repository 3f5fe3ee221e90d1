"""One training step: :class:`TrainStep`, the :class:`~amptrain.tasks.step.StepContext`
the step function runs against, and the context manager the loop runs it in.

The loop calls the step function itself, so the path from the loop to ``optimizer.step``
is three frames: the step function (the task's, the caller's, or the supervised step),
:meth:`TrainStep.step` and the precision's step::

    with train_step.on(window, step) as function:   # the run's first batch: the output check
        function(train_step)

Around it, once per step: gradients zeroed (several parts), the step-start state saved
(one process: for a redo), the loss scale updated once, the logged values counted once.
An out-of-memory error inside the block is not a layer every step passes through: the
manager's exit redoes the step in smaller micro-batches (through
:meth:`~amptrain.trainer.autobatch.MicroBatchSizer.redo`) and hands the new split on.
"""
from __future__ import annotations

import functools
import traceback
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, ContextManager

import torch
from torch import nn

from .autobatch import MicroBatchSizer, MicroBatchSplit, OutOfMemoryHalt
from ..common.errors import first_line
from ..common.oom import is_out_of_memory
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
    """The Trainer's :class:`~amptrain.tasks.step.StepContext` and the step around it.

    ``training_step``: the task's or the caller's step; None runs the supervised step with
    ``loss_fn``, whose first batch goes through ``check`` (the one-time output check of
    data that could not be probed at set-up). ``on_split(split)`` is told when a smaller
    micro-batch takes effect after out-of-memory.
    """

    def __init__(self, steps: OptimizerSteps, *, precision: Precision, strategy: Strategy,
                 sizer: MicroBatchSizer, interval: LogInterval, model: nn.Module,
                 device: torch.device, training_step: StepFn | None, loss_fn: LossFn,
                 check: Callable[[Any, Any], None] | None = None) -> None:
        self.steps, self.precision, self.strategy = steps, precision, strategy
        self.sizer, self.interval = sizer, interval
        self.training_step, self.loss_fn = training_step, loss_fn
        steady: StepFn = training_step or functools.partial(supervised_step, loss_fn=loss_fn)
        self._steady = steady
        self._next: StepFn = steady if training_step is not None or check is None \
            else functools.partial(supervised_step, loss_fn=loss_fn, check=check)
        self._backward = precision.backward
        # On out-of-memory a step is redone in smaller micro-batches, from the same RNG and
        # BatchNorm state (one process only: several halt instead).
        self.start = StepStart(model, device) if strategy.world_size == 1 else None
        self.on_split: Callable[[MicroBatchSplit], None] = lambda split: None
        self.window: StepBatch | None = None
        self.last_window: StepBatch | None = None
        self.micro_batches: list[Any] = []
        self.micro_samples: list[int] = []
        self.global_samples = 0
        self.step_number = 0
        self.logged: list[tuple[str, torch.Tensor, int]] = []
        # Logged between steps (a rollout's returns): counted with the next step's values.
        self.carried: list[tuple[str, torch.Tensor, int]] = []
        self.stepped: str | None = None   # a part stepped in this attempt (no redo after)
        #: Shown each loss before its backward (the numerics telemetry on sampled steps).
        self.watch_loss: Callable[[torch.Tensor], None] | None = None

    # ------------------------------------------------------------ around a step
    def on(self, window: StepBatch, step: int) -> TrainStep:
        """Begin optimizer step number ``step`` on ``window``; use as a context manager
        whose value is the step function to call with this object."""
        if not self.steps.single:
            # What one part's loss left on another (G's loss through D) must not reach that
            # part's step. One part needs no pass over the modules: its optimizer's
            # zero_grad after each step already left every gradient it steps at None.
            self.steps.zero_grad()
        if self.start is not None:
            self.start.save()
        self.step_number = step
        self._point_at(self.sizer.cut(window))
        return self

    def __enter__(self) -> StepFn:
        function, self._next = self._next, self._steady  # the output check: once a run
        return function

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> bool:
        if error is not None:
            if not isinstance(error, Exception) or not is_out_of_memory(error):
                return False
            self._halt_if_stepped(error)
            failure = first_line(error)
            # The failed attempt's activations are held by the traceback's frames.
            traceback.clear_frames(trace)
            error.__traceback__ = trace = None
            self._redo(failure)
        self.precision.update()
        self.last_window = self.window
        assert self.window is not None
        if self.carried:
            self.logged, self.carried = self.carried + self.logged, []
        self.interval.add(self.logged, self.window.global_samples)
        return True

    def _redo(self, failure: str) -> None:
        assert self.window is not None
        window, split = self.sizer.redo(
            self.window, self._attempt, failure, split=self.sizer.split,
            step=self.step_number, drop_gradients=self._drop_gradients,
            step_start=self.start)
        self.window = window
        self.on_split(split)

    def _attempt(self, window: StepBatch) -> None:
        self._point_at(window)
        try:
            self._steady(self)
        except Exception as exc:
            if is_out_of_memory(exc):
                self._halt_if_stepped(exc)
            raise

    def _halt_if_stepped(self, error: Exception) -> None:
        if self.stepped is not None:
            raise OutOfMemoryHalt(
                f"out of memory after part '{self.stepped}' stepped: a step that already "
                f"updated weights cannot be redone in smaller micro-batches; set a "
                f"smaller micro-batch size") from error

    def _point_at(self, window: StepBatch) -> None:
        self.window = window
        self.micro_batches = window.micro_batches
        self.micro_samples = window.micro_samples
        self.global_samples = window.global_samples
        self.logged = []
        self.stepped = None

    def _drop_gradients(self) -> None:
        self.steps.zero_grad(optimizers=True)

    # ------------------------------------------------------------ StepContext
    rank = property(lambda self: self.strategy.rank, doc="This process's rank.")
    world_size = property(lambda self: self.strategy.world_size, doc="Processes in the run.")

    def model(self, name: str = "model") -> nn.Module:
        return self.steps[name].forward

    def optimizer(self, name: str = "model") -> torch.optim.Optimizer:
        return self.steps[name].optimizer

    def autocast(self) -> ContextManager:
        return self.precision.autocast()

    def micro(self, name: str = "model") -> Iterator[tuple[Any, int, float]]:
        forward = self.steps[name].forward
        world = self.strategy.world_size
        last = len(self.micro_batches) - 1
        for i, (batch, n) in enumerate(zip(self.micro_batches, self.micro_samples)):
            with self.strategy.accumulation_context(forward, boundary=i == last):
                yield batch, n, n * world / self.global_samples

    def backward(self, loss: torch.Tensor, *, loss_id: int = 0) -> None:
        if self.watch_loss is not None:
            self.watch_loss(loss)
        self._backward(loss, loss_id=loss_id)

    def step(self, name: str = "model") -> None:
        """Part ``name``'s optimizer step through the precision: the previous step's skip
        flag settled, gradients clipped (or their norm taken for a step that ends a log
        interval), the step or its skip on inf/NaN, the gradients dropped."""
        self.stepped = name
        steps = self.steps
        part = steps[name]
        # Reading the previous step's skip flag only now lets the device run this step's
        # forward/backward meanwhile; the LR it sets is still the one this step needs.
        steps.settle(name)
        if steps.clip:
            self.interval.grad_norms[name] = self.precision.clip_grad_norm_(
                part.module.parameters(), steps.clip, optimizer=part.optimizer)
        elif (steps.position.step + 1) % steps.log_every == 0:
            self.interval.grad_norms[name] = self.precision.grad_norm(
                part.module.parameters(), optimizer=part.optimizer)
        part.pending = self.precision.step_async(part.optimizer)
        part.optimizer.zero_grad(set_to_none=True)

    def log(self, key: str, value: torch.Tensor, samples: int) -> None:
        self.logged.append((key, value, samples))

    def carry(self, key: str, value: torch.Tensor, samples: int) -> None:
        """A value logged between steps; the next step counts it with its own."""
        self.carried.append((key, value, samples))
