"""How data reaches the model in the Trainer: global batches cut into per-device windows,
small in-memory datasets moved to the accelerator once, and the one-time check that the
model's outputs fit the targets."""
from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from .. import datacheck
from ..batches import DatasetWindows, GlobalBatchPlan, LoaderWindows
from ..steps import forward_batch
from .base import TrainerBase

#: In-memory datasets up to this size are moved to the accelerator once, so batches
#: are sliced there instead of being copied over every step.
DEVICE_DATA_LIMIT_BYTES = 1 << 30


class DataMixin(TrainerBase):
    """The Trainer's data path (mixed into it)."""

    def _check_model_outputs(self, train_data: Any) -> None:
        """Check that the model's outputs fit the targets: now, on two in-memory samples
        (so a wrong model is refused before the first log line), or else on the first
        training batch. The probe runs in eval mode with the RNG restored: training sees
        exactly what it would have seen without it."""
        sample = datacheck.first_samples(train_data, self.device) \
            if self.strategy.world_size == 1 else None
        check = functools.partial(self.task.check_outputs, model_name=self.run_info.get("model"),
                                  all_targets=train_data.tensors[-1] if sample else None)
        if sample is None:
            self._check_outputs = check
            return
        assert self.model is not None
        devices = [self.device] if self.device.type == "cuda" else []
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.random.fork_rng(devices=devices), torch.no_grad(), \
                    self.precision.autocast():
                forward_batch(self.model, sample, self.loss_fn, check)
        finally:
            self.model.train(was_training)

    def _windows(self, data: Any, micro: int, accumulate: int, shuffle: bool) -> Any:
        if isinstance(data, Dataset) and hasattr(data, "__len__") \
                and not isinstance(data, DataLoader):
            data = self._maybe_on_device(data)
            world = self.strategy.world_size
            plan = GlobalBatchPlan(len(data), micro * accumulate * world, micro,
                                   world_size=world, rank=self.strategy.rank,
                                   seed=self.config.seed, shuffle=shuffle)
            return DatasetWindows(data, plan, self.device,
                                  num_workers=self.config.batching.num_workers)
        # Only evaluation reads data unshuffled.
        data = self.strategy.shard_loader(data, seed=self.config.seed, evaluation=not shuffle)
        return LoaderWindows(data, accumulate, self.device, self.strategy.world_size)

    def _maybe_on_device(self, data: Any) -> Any:
        if self.device.type == "cpu" or not hasattr(data, "tensors") or not hasattr(data, "to"):
            return data
        if data.tensors[0].device == self.device:
            return data
        return data.to(self.device) if data.nbytes() <= DEVICE_DATA_LIMIT_BYTES else data
