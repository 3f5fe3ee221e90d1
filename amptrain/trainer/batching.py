"""Micro-batch planning in the Trainer: the ``auto`` search runs real steps at candidate
sizes and puts the state back. The planning itself is
:class:`~amptrain.trainer.autobatch.MicroBatchSizer`'s; a smaller split after out-of-memory takes
effect in the windows (:meth:`~amptrain.trainer.windows.Windows.resize`)."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .autobatch import MicroBatchSizer, MicroBatchSplit
from .windows import DatasetWindows
from ..config import TrainConfig
from ..distributed import Strategy
from ..common.errors import UserError, flag
from ..common.forward import LossFn, forward_batch
from ..precision import Precision
from .data import windows_of
from .snapshot import TrainingSnapshot

log = logging.getLogger("amptrain")


def agreement(strategy: Strategy) -> Callable[[bool], bool]:
    """``agree(fits)``: True only when every process fits (all ranks must pick the same
    micro-batch)."""
    def agree(fits: bool) -> bool:
        if strategy.world_size == 1:
            return fits
        votes = torch.tensor(1.0 if fits else 0.0, device=strategy.device)
        return int(strategy.reduce_sum(votes).item()) == strategy.world_size
    return agree


def search_micro_batch(train_data: Any, *, sizer: MicroBatchSizer, config: TrainConfig,
                       strategy: Strategy, model: nn.Module, optimizer: torch.optim.Optimizer,
                       precision: Precision, loss_fn: LossFn) -> MicroBatchSplit:
    """``--micro-batch-size auto``: real steps at candidate sizes, state restored after each."""
    per_device = sizer.per_device

    def windows(data: Any, micro: int) -> Any:
        return windows_of(data, micro=micro,
                          accumulate=MicroBatchSplit.of(micro, per_device).accumulate,
                          shuffle=True, config=config, strategy=strategy)

    first = windows(train_data, 1)
    if not isinstance(first, DatasetWindows):
        raise UserError(f"{flag('micro_batch_size')} auto needs a dataset that amptrain "
                        f"batches itself; a DataLoader's batch_size is its micro-batch: "
                        f"set it there instead")
    data = first.dataset  # as training will hold it (on the GPU when small enough)
    snapshot = TrainingSnapshot(model, optimizer, precision, strategy.device)
    clip = config.schedule.clip_grad_norm
    split = sizer.search(
        lambda micro: probe_steps(windows(data, micro), model=model, optimizer=optimizer,
                                  precision=precision, loss_fn=loss_fn, clip=clip),
        snapshot.restore)
    if strategy.is_main and sizer.search_report:
        log.info("%s", sizer.search_report["summary"])
    return split


def probe_steps(windows: DatasetWindows, *, model: nn.Module, optimizer: torch.optim.Optimizer,
                precision: Precision, loss_fn: LossFn, clip: float | None) -> None:
    """Two micro-batches, each forward/backward + optimizer step, without zeroing the
    gradients in between: the second pass holds weights, gradients, optimizer state and
    activations at once, the steady-state peak of an accumulating step."""
    epoch = windows.epoch(0)
    window = next(epoch)
    epoch.close()
    for batch in (window.micro_batches * 2)[:2]:
        # The unwrapped module: no process-group traffic (a rank that runs out of memory
        # must not leave the others waiting in a collective) and no torch.compile per
        # probed shape. Eager memory is at least the compiled one.
        with precision.autocast():
            loss, _, _ = forward_batch(model, batch, loss_fn)
        precision.backward(loss)
        if clip:
            precision.clip_grad_norm_(model.parameters(), clip)
        precision.step_async(optimizer)
    if windows.device.type == "cuda":
        torch.cuda.synchronize(windows.device)
