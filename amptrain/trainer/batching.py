"""Micro-batch planning in the Trainer: the ``auto`` search runs real steps at candidate
sizes and puts the state back; a smaller plan after out-of-memory takes effect in one place.
The planning itself is :class:`~amptrain.autobatch.MicroBatchPlanner`'s."""
from __future__ import annotations

import logging
from typing import Any

import torch

from ..autobatch import MicroBatchSplit
from ..batches import DatasetWindows
from ..config import write_yaml
from ..errors import UserError, flag
from .snapshot import TrainingSnapshot
from ..forward import forward_batch
from .base import TrainerBase

log = logging.getLogger("amptrain")


class BatchPlanningMixin(TrainerBase):
    """The Trainer's side of micro-batch planning (mixed into it)."""

    def _search_micro_batch(self, train_data: Any) -> MicroBatchSplit:
        """``--micro-batch-size auto``: real steps at candidate sizes, state restored after each."""
        assert self.model is not None and self.optimizer is not None
        per_device = self.planner.per_device
        windows = self._windows(train_data, 1, per_device, shuffle=True)
        if not isinstance(windows, DatasetWindows):
            raise UserError(f"{flag('micro_batch_size')} auto needs a dataset that amptrain "
                            f"batches itself; a DataLoader's batch_size is its micro-batch: "
                            f"set it there instead")
        data = windows.dataset  # as training will hold it (on the GPU when small enough)
        snapshot = TrainingSnapshot(self.model, self.optimizer, self.precision, self.device)
        plan = self.planner.search(
            lambda micro: self._probe_steps(
                self._windows(data, micro, per_device // micro, shuffle=True)),
            snapshot.restore)
        if self.strategy.is_main and self.planner.search_report:
            log.info("%s", self.planner.search_report["summary"])
        return plan

    def _probe_steps(self, windows: DatasetWindows) -> None:
        """Two micro-batches, each forward/backward + optimizer step, without zeroing the
        gradients in between: the second pass holds weights, gradients, optimizer state and
        activations at once, the steady-state peak of an accumulating step."""
        assert self.model is not None and self.optimizer is not None
        epoch = windows.epoch(0)
        window = next(epoch)
        epoch.close()
        clip = self.config.schedule.clip_grad_norm
        for batch in (window.micro_batches * 2)[:2]:
            # The unwrapped module: no process-group traffic (a rank that runs out of memory
            # must not leave the others waiting in a collective) and no torch.compile per
            # probed shape. Eager memory is at least the compiled one.
            with self.precision.autocast():
                loss, _, _ = forward_batch(self.model, batch, self.loss_fn)
            self.precision.backward(loss)
            if clip:
                self.precision.clip_grad_norm_(self.model.parameters(), clip)
            self.precision.step_async(self.optimizer)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _all_fit(self, fits: bool) -> bool:
        """True only when every process fits (all ranks must pick the same micro-batch)."""
        if self.strategy.world_size == 1:
            return fits
        votes = torch.tensor(1.0 if fits else 0.0, device=self.device)
        return int(self.strategy.reduce_sum(votes).item()) == self.strategy.world_size

    def _use_batch_plan(self, plan: MicroBatchSplit) -> None:
        """The one place a new micro-batch split takes effect (after out-of-memory)."""
        self.batch_plan = plan
        windows_plan = getattr(self.train_windows, "plan", None)
        if windows_plan is not None:
            windows_plan.micro_batch = plan.micro_batch  # later epochs are cut the new way
        for event in self.planner.oom_events[self._oom_events_told:]:
            self.logger.message(f"amptrain: {event['message']}")
        self._oom_events_told = len(self.planner.oom_events)
        if self.strategy.is_main and self.out is not None:
            write_yaml(self.resolved_config(), self.out / "config.yaml")

    def _drop_gradients(self) -> None:
        assert self.model is not None and self.optimizer is not None
        self.model.zero_grad(set_to_none=True)
        self.optimizer.zero_grad(set_to_none=True)
