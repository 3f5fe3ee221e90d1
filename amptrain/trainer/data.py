"""How data reaches the model in the Trainer: global batches cut into per-device windows
(:class:`~amptrain.trainer.windows.Windows`, one type for datasets, DataLoaders and streams),
small in-memory datasets moved to the accelerator once, and the one-time check that the
model's outputs fit the targets."""
from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from . import datacheck
from .windows import DatasetWindows, SampleOrder, Windows
from ..config import TrainConfig
from ..distributed import Strategy
from ..data import protocol
from ..data.core import SPLIT_SEED
from ..common.forward import LossFn, forward_batch
from ..precision import Precision
from .streams import LoaderWindows, is_stream, stream_windows
from ..tasks import Task

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


def output_check(train_data: Any, *, model: nn.Module, task: Task, loss_fn: LossFn,
                 precision: Precision, strategy: Strategy, model_name: str | None
                 ) -> Callable[[Any, Any], None] | None:
    """Check that the model's outputs fit the targets: now, on two in-memory samples (so a
    wrong model is refused before the first log line; returns None), or else return the
    check for the first training batch. The probe runs in eval mode with the RNG restored:
    training sees exactly what it would have seen without it."""
    device = strategy.device
    sample = datacheck.first_samples(train_data, device) if strategy.world_size == 1 else None
    check = functools.partial(task.checks.check_outputs, model_name=model_name,
                              all_targets=protocol.targets_of(train_data) if sample else None)
    if sample is None:
        return check
    devices = [device] if device.type == "cuda" else []
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad(), precision.autocast():
            forward_batch(model, sample, loss_fn, check)
    finally:
        model.train(was_training)
    return None


def windows_of(data: Any, *, micro: int, accumulate: int, shuffle: bool, config: TrainConfig,
               strategy: Strategy, sample_batches: int | None = None) -> Windows:
    """Windows of ``data`` (a list of samples already made a dataset where the data came
    in: :func:`~amptrain.trainer.streams.as_dataset`); ``sample_batches`` (evaluation) restricts
    them to a fixed sample of that many global batches (``--eval-batches``)."""
    device = strategy.device
    if is_stream(data):  # generators, IterableDatasets: read in order
        return stream_windows(data, micro=micro, accumulate=accumulate, device=device,
                              world_size=strategy.world_size, rank=strategy.rank,
                              max_steps=config.schedule.max_steps, training=shuffle,
                              limit=sample_batches, num_workers=workers_for(data, config),
                              keyword="train_data" if shuffle else "val_data")
    if isinstance(data, Dataset) and isinstance(data, protocol.MapData) \
            and not isinstance(data, DataLoader):
        data = maybe_on_device(data, device)
        world = strategy.world_size
        subset = None
        if sample_batches is not None:
            subset = eval_sample(len(data), sample_batches * config.batching.batch_size)
        order = SampleOrder(len(data) if subset is None else len(subset),
                           micro * accumulate * world, micro, world_size=world,
                           rank=strategy.rank, seed=config.seed, shuffle=shuffle)
        return DatasetWindows(data, order, device, num_workers=workers_for(data, config),
                              subset=subset)
    # Only evaluation reads data unshuffled.
    data = strategy.shard_loader(data, seed=config.seed, evaluation=not shuffle)
    return LoaderWindows(data, accumulate, device, strategy.world_size, limit=sample_batches,
                         micro_batch=micro)


def workers_for(data: Any, config: TrainConfig) -> int:
    """--num-workers, with auto resolved: none for data already in memory or read as
    whole batches (tokens), else up to 4 processes, one core left to training."""
    workers = config.batching.num_workers
    if workers != "auto":
        return int(workers)
    if protocol.reads_in_process(data):
        return 0
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(0, min(4, cores - 1))


def maybe_on_device(data: Any, device: torch.device) -> Any:
    """In-memory data up to :data:`DEVICE_DATA_LIMIT_BYTES` moved to an accelerator once."""
    columns = protocol.columns_of(data)
    if device.type == "cpu" or columns is None or not isinstance(data, protocol.DeviceMovable):
        return data
    if columns[0].device == device:
        return data
    return data.to(device) if data.nbytes() <= DEVICE_DATA_LIMIT_BYTES else data
