"""How data reaches the model in the Trainer: global batches cut into per-device windows,
small in-memory datasets moved to the accelerator once, and the one-time check that the
model's outputs fit the targets."""
from __future__ import annotations

import functools
import os
import time
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, Dataset

from . import datacheck
from ..batches import DatasetWindows, SampleOrder, LoaderWindows, StepBatch
from ..data.core import SPLIT_SEED
from ..forward import forward_batch
from ..streams import as_dataset, is_stream, stream_windows
from .base import TrainerBase

#: In-memory datasets up to this size are moved to the accelerator once, so batches
#: are sliced there instead of being copied over every step.
DEVICE_DATA_LIMIT_BYTES = 1 << 30


def eval_sample(num_samples: int, count: int) -> torch.Tensor | None:
    """The fixed evaluation sample: ``count`` of ``num_samples`` indices, drawn with the
    split seed (never --seed: every run and every evaluation of a run sees the same
    samples), sorted so that reads from disk run forwards; None when it is all of them."""
    if count >= num_samples:
        return None
    order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(SPLIT_SEED))
    return order[:count].sort().values


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

    def _timed(self, windows: Iterator[StepBatch]) -> Iterator[StepBatch]:
        """``windows``, adding the host time spent waiting for each to ``_data_wait_s``.

        Host clock only, no device sync: on an accelerator the host runs ahead of the
        device, so this is the time the loop could not queue work because data was not
        ready -- what ``data_wait_frac`` reports (0: the input pipeline keeps up).
        """
        iterator = iter(windows)
        while True:
            started = time.perf_counter()
            try:
                window = next(iterator)
            except StopIteration:
                return
            self._data_wait_s += time.perf_counter() - started
            yield window

    def _windows(self, data: Any, micro: int, accumulate: int, shuffle: bool,
                 sample_batches: int | None = None) -> Any:
        """Windows of ``data``; ``sample_batches`` (evaluation) restricts them to a fixed
        sample of that many global batches (``--eval-batches``)."""
        data = as_dataset(data, "train_data" if shuffle else "val_data")
        if is_stream(data):  # generators, IterableDatasets: read in order
            return stream_windows(data, micro=micro, accumulate=accumulate, device=self.device,
                                  world_size=self.strategy.world_size, rank=self.strategy.rank,
                                  max_steps=self.config.schedule.max_steps, training=shuffle,
                                  limit=sample_batches,
                                  num_workers=self._workers_for(data),
                                  keyword="train_data" if shuffle else "val_data")
        if isinstance(data, Dataset) and hasattr(data, "__len__") \
                and not isinstance(data, DataLoader):
            data = self._maybe_on_device(data)
            world = self.strategy.world_size
            subset = None
            if sample_batches is not None:
                subset = eval_sample(len(data), sample_batches * self.config.batching.batch_size)
            plan = SampleOrder(len(data) if subset is None else len(subset),
                                   micro * accumulate * world, micro,
                                   world_size=world, rank=self.strategy.rank,
                                   seed=self.config.seed, shuffle=shuffle)
            return DatasetWindows(data, plan, self.device,
                                  num_workers=self._workers_for(data), subset=subset)
        # Only evaluation reads data unshuffled.
        data = self.strategy.shard_loader(data, seed=self.config.seed, evaluation=not shuffle)
        return LoaderWindows(data, accumulate, self.device, self.strategy.world_size,
                             limit=sample_batches)

    def _workers_for(self, data: Any) -> int:
        """--num-workers, with auto resolved: none for data already in memory or read as
        whole batches (tokens), else up to 4 processes, one core left to training."""
        workers = self.config.batching.num_workers
        if workers != "auto":
            return int(workers)
        if hasattr(data, "tensors") or hasattr(data, "read_batch"):
            return 0
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cores = os.cpu_count() or 1
        return max(0, min(4, cores - 1))

    def _maybe_on_device(self, data: Any) -> Any:
        if self.device.type == "cpu" or not hasattr(data, "tensors") or not hasattr(data, "to"):
            return data
        if data.tensors[0].device == self.device:
            return data
        return data.to(self.device) if data.nbytes() <= DEVICE_DATA_LIMIT_BYTES else data
