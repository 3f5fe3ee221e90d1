"""An evaluation pass: the loss and the task's metrics of a model on data, under the
training precision's autocast, every process's share gathered."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..distributed import Strategy
from ..logs import RunLogger
from ..precision import Precision
from ..forward import forward_batch
from ..tasks import EvalResult, Task


def evaluate(model: nn.Module, windows: Any, *, precision: Precision, task: Task,
             strategy: Strategy, logger: RunLogger, loss_fn: Any = None) -> EvalResult:
    """Mean loss and ``task``'s metrics over ``windows`` (one micro-batch per window).

    The loss sum stays on the device in float64 until the pass ends: one read per pass.
    ``loss_fn`` replaces the task's loss (a caller's own).
    """
    loss_fn = loss_fn or task.loss
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), device=strategy.device, dtype=torch.float64)
    samples = 0
    sums = task.start_eval(strategy.device)
    logger.bar(len(windows), "eval")
    with torch.no_grad():
        for window in windows.epoch(0):
            for batch, n in zip(window.micro_batches, window.micro_samples):
                with precision.autocast():
                    loss, outputs, targets = forward_batch(model, batch, loss_fn)
                    sums.update_batch(model, batch)
                loss_sum += loss.detach().double() * n
                samples += n
                sums.update(outputs, targets)
            logger.advance()
    logger.close_bar()
    model.train(was_training)
    total_loss = strategy.reduce_sum(loss_sum).item()
    total = strategy.reduce_sum(torch.tensor(float(samples), device=strategy.device,
                                             dtype=torch.float64)).item()
    return task.finish_eval(sums, strategy.gather, total_loss / max(total, 1.0), int(total))
