"""An evaluation pass: the loss and the task's metrics of a model on data, under the
training precision's autocast, every process's share gathered; and :class:`Evaluator`, the
Trainer's part that runs them."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from ..distributed import Strategy
from .logs import RunLogger
from ..precision import Precision
from ..config import TrainConfig
from ..common.forward import LossFn, forward_batch
from ..tasks import EvalResult, Task
from ..tasks.base import EvaluationStopped
from .data import windows_of


def evaluate(model: nn.Module, windows: Any, *, precision: Precision, task: Task,
             strategy: Strategy, logger: RunLogger, loss_fn: Any = None,
             stopping: Callable[[], bool] | None = None) -> EvalResult:
    """Mean loss and ``task``'s metrics over ``windows`` (one micro-batch per window).

    The loss sum stays on the device in float64 until the pass ends: one read per pass.
    ``loss_fn`` replaces the task's loss (a caller's own). ``stopping``: asked between
    batches (and by the task's sums, see :class:`EvalSums`); true abandons the pass with
    :class:`EvaluationStopped`.
    """
    loss_fn = loss_fn or task.loss
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), device=strategy.device, dtype=torch.float64)
    samples = 0
    sums = task.start_eval(strategy.device)
    if stopping is not None:
        sums.stopping = stopping
    logger.bar(len(windows), "eval")
    try:
        with torch.no_grad():
            for window in windows.epoch(0):
                if sums.stopping():
                    raise EvaluationStopped
                for batch, n in zip(window.micro_batches, window.micro_samples):
                    with precision.autocast():
                        loss, outputs, targets = forward_batch(model, batch, loss_fn)
                        sums.update_batch(model, batch)
                    loss_sum += loss.detach().double() * n
                    samples += n
                    sums.update(outputs, targets)
                logger.advance()
    finally:
        logger.close_bar()
        model.train(was_training)
    total_loss = strategy.reduce_sum(loss_sum).item()
    total = strategy.reduce_sum(torch.tensor(float(samples), device=strategy.device,
                                             dtype=torch.float64)).item()
    return task.finish_eval(sums, strategy.gather, total_loss / max(total, 1.0), int(total))


class Evaluator:
    """The Trainer's evaluations: the validation data, the last result and its step, and
    the precision's forward patches put back for a pass after ``fit`` removed them."""

    def __init__(self, config: TrainConfig, strategy: Strategy, precision: Precision,
                 task: Task, loss_fn: LossFn, val_data: Any = None) -> None:
        self.config, self.strategy, self.precision = config, strategy, precision
        self.task, self.loss_fn, self.val_data = task, loss_fn, val_data
        self.last: EvalResult | None = None
        self.last_step: int | None = None  # the step of ``last`` (the final pass reuses it)
        self.patches_removed = False       # fit is over: reinstate the patches per pass

    def evaluate(self, model: nn.Module, data: Any, *, logger: RunLogger,
                 write_dir: str | Path | None = None, full: bool = False,
                 stopping: Callable[[], bool] | None = None) -> EvalResult:
        """The loss and the task's metrics on ``data`` (``--eval-batches`` of it unless
        ``full``); the task's reports go to ``write_dir`` (rank 0). ``stopping``: see
        :func:`evaluate`."""
        per_device = self.config.batching.split(self.strategy.world_size).per_device
        # No gradients to hold: one pass per per-device batch.
        sample = None if full else self.config.logging.eval_batches
        windows = windows_of(data, micro=per_device, accumulate=1, shuffle=False,
                             config=self.config, strategy=self.strategy,
                             sample_batches=sample)
        with self.precision.installed() if self.patches_removed else contextlib.nullcontext():
            result = evaluate(model, windows, precision=self.precision, task=self.task,
                              strategy=self.strategy, logger=logger, loss_fn=self.loss_fn,
                              stopping=stopping)
        if write_dir is not None and self.strategy.is_main:
            result.write(write_dir)
        return result

    def at_step(self, model: nn.Module, step: int, *, logger: RunLogger, final: bool,
                out: Path | None, stopping: Callable[[], bool] | None = None
                ) -> EvalResult | None:
        """The evaluation of the loop at ``step``; None when the final pass reuses the
        ``--eval-every`` pass of the same step (its reports are written again).
        ``stopping``: see :func:`evaluate`."""
        write_dir = out / "eval" if (final and out is not None) else None
        full = final and self.config.logging.final_eval_full
        if final and not full and self.last is not None and self.last_step == step:
            # --eval-every just evaluated this step: the same weights, so write its reports
            # instead of a second pass (and a second, identical record).
            if write_dir is not None and self.strategy.is_main:
                self.last.write(write_dir)
            return None
        self.last = self.evaluate(model, self.val_data, logger=logger, write_dir=write_dir,
                                  full=full, stopping=stopping)
        self.last_step = step
        return self.last
