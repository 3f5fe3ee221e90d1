"""Data read in order -- a user's DataLoader, and data without a length: generators,
iterables and ``IterableDataset``s, read as a stream (:class:`InOrderReader`) -- and a
plain list of samples, made a dataset.

What ``Trainer.fit`` accepts besides a map-style Dataset or a sized DataLoader:

* a **list (or tuple) of samples** -- ``[(x, y), ...]`` with one sample's tensors or
  numbers -- becomes a map-style dataset (in-memory tensors when the samples stack), so it
  is shuffled, sharded and resumed exactly like any dataset;
* a **stream** -- a generator, any iterable without ``len()``, an ``IterableDataset`` or a
  DataLoader over one -- is read in order. Its items may be batches (a leading batch
  dimension) or single samples, which are collated into micro-batches here. Every process
  of a distributed run reads the same stream and takes every ``world``-th micro-batch,
  so ranks see disjoint data; a window that not every rank can complete is dropped.
  A stream's length is unknown, so the run needs ``max_steps``; an epoch ends when the
  stream does (a generator is read once: its second epoch is empty).
"""
from __future__ import annotations

import logging
import math
import numbers
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torch.utils.data._utils.collate import default_collate

from .windows import StepBatch, Windows, batch_size_of, to_device
from ..common.errors import UserError, flag
from ..data.core import TensorData

log = logging.getLogger("amptrain")


def is_stream(data: Any) -> bool:
    """True for data read in order without a length (see the module docstring)."""
    if isinstance(data, IterableDataset):
        return True
    if isinstance(data, DataLoader):
        return isinstance(data.dataset, IterableDataset) and not _has_len(data)
    return hasattr(data, "__iter__") and not hasattr(data, "__len__")


def _has_len(data: Any) -> bool:
    try:
        len(data)
    except TypeError:
        return False
    return True


def _scalar(value: Any) -> bool:
    """A single sample's label: a number, a numpy scalar or a 0-d tensor/array."""
    if isinstance(value, (numbers.Number, np.generic)) and not isinstance(value, bool):
        return True
    return isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 0


def is_sample(item: Any) -> bool:
    """True when ``item`` is one sample (its label a scalar), not a batch of them."""
    if isinstance(item, dict):
        label = next((item[k] for k in ("labels", "label", "y") if k in item), None)
        return label is not None and _scalar(label)
    if isinstance(item, (tuple, list)) and len(item) >= 2:
        return _scalar(item[-1])
    return False


class SampleList(Dataset):
    """A list of samples as a map-style dataset (collated by the DataLoader)."""

    def __init__(self, samples: list[Any]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Any:
        return self.samples[index]


def as_dataset(data: Any, keyword: str) -> Any:
    """A list of samples as a dataset (stacked into tensors when they stack); other data
    is returned as given."""

    if not isinstance(data, (list, tuple)) or not data or not is_sample(data[0]):
        return data
    if not all(is_sample(s) and isinstance(s, (tuple, list)) and len(s) == len(data[0])
               for s in data):
        return SampleList(list(data))
    try:
        columns = [torch.stack([torch.as_tensor(s[i]) for s in data])
                   for i in range(len(data[0]))]
    except (TypeError, RuntimeError, ValueError):
        return SampleList(list(data))  # uneven shapes: the DataLoader collates per batch
    log.debug("%s: a list of %d samples, stacked into tensors", keyword, len(data))
    return TensorData(*columns)


@dataclass(eq=False)
class InOrderReader:
    """Windows of ``accumulate`` micro-batches read in order: a DataLoader or a stream
    (the strategy inside :class:`~amptrain.trainer.windows.Windows` for data amptrain does not
    index itself).

    A **sized** loader (or iterable of batches) is this process's own: a distributed
    strategy shards it (``Strategy.shard_loader``), so every batch is this rank's and a
    short last window is kept. A **stream** (``known_length=False``) is the same for every rank:
    each takes every ``world_size``-th micro-batch, and a window that not every rank can
    complete is dropped; ``steps`` stands in for its unknown length (the run's
    ``max_steps`` for training, 0 for evaluation). Items that are single samples are
    collated into micro-batches of :attr:`micro_batch`. ``limit`` reads at most that many
    windows (``--eval-batches``). The loss is normalised by the samples a window really
    holds; every rank is assumed to see equally sized batches.
    """

    source: Any
    _: KW_ONLY
    micro: int
    accumulate: int
    device: torch.device
    known_length: bool  # a sized loader (True) or a stream (False)
    world_size: int = 1
    rank: int = 0
    steps: int = 0
    limit: int | None = None
    sample_order: None = field(default=None, init=False)
    _epochs_read: int = field(default=0, init=False)

    def __len__(self) -> int:
        if self.known_length:
            count = math.ceil(len(self.source) / self.accumulate)
        else:  # evaluating a stream: its limit stands in for the length
            count = self.steps or (self.limit or 0)
        return count if self.limit is None else min(count, self.limit)

    @property
    def micro_batch(self) -> int:
        """Samples per micro-batch: the loader's batch size as the run counts it (a redo
        after out-of-memory re-cuts each batch), or what samples are collated into."""
        return self.micro

    def resize(self, micro: int) -> None:
        self.micro = micro

    def _micro_batches(self) -> Iterator[Any]:
        pending: list[Any] = []
        samples: bool | None = None
        for item in self.source:
            if samples is None:
                samples = is_sample(item)
            if not samples:
                yield item
                continue
            pending.append(item)
            if len(pending) == self.micro:
                yield default_collate(pending)
                pending = []
        if pending:
            yield default_collate(pending)

    def read(self, epoch: int, start: int) -> Iterator[StepBatch]:
        """The windows of one pass over the source, skipping the first ``start``."""
        sampler = getattr(self.source, "sampler", None)  # a DataLoader's (distributed) sampler
        if sampler is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        # Processes reading this very source: a stream's every rank; a sharded loader's one.
        readers, me = (1, 0) if self.known_length else (self.world_size, self.rank)
        group: list[Any] = []
        index = read = 0
        for batch in self._micro_batches():
            if self.limit is not None and read >= self.limit:
                return
            group.append(batch)
            if len(group) < self.accumulate * readers:
                continue
            mine, group = group[me::readers], []
            if index >= start:
                read += 1
                yield self._window(mine)
            index += 1
        if group and readers == 1 and index >= start:
            read += 1
            yield self._window(group)
        if read == 0 and self._epochs_read and start == 0:
            log.warning("the data stream gave no batch in epoch %d: a generator can be read "
                        "once; pass a list, an IterableDataset or a DataLoader to train for "
                        "several epochs", epoch + 1)
        self._epochs_read += 1

    def _window(self, batches: list[Any]) -> StepBatch:
        micro = [to_device(b, self.device) for b in batches]
        sizes = [batch_size_of(b) for b in micro]
        return StepBatch(micro, sizes, sum(sizes) * self.world_size)


class LoaderWindows(Windows):
    """Windows of ``accumulate`` consecutive batches of a user's sized DataLoader (or
    iterable of batches), already sharded for this rank: an :class:`InOrderReader`."""

    def __init__(self, loader: Any, accumulate: int, device: torch.device,
                 world_size: int = 1, *, limit: int | None = None,
                 micro_batch: int | None = None) -> None:
        given = loader.batch_size if isinstance(loader, DataLoader) else None
        super().__init__(InOrderReader(loader, micro=micro_batch or given or 1,
                                       accumulate=accumulate, device=device,
                                       world_size=world_size, known_length=True, limit=limit))


class StreamWindows(Windows):
    """Windows of ``accumulate`` micro-batches of a stream shared by every rank: an
    :class:`InOrderReader` whose ``steps`` stand in for the unknown length."""

    def __init__(self, source: Any, *, micro: int, accumulate: int, device: torch.device,
                 world_size: int = 1, rank: int = 0, steps: int = 0,
                 limit: int | None = None) -> None:
        super().__init__(InOrderReader(source, micro=micro, accumulate=accumulate,
                                       device=device, world_size=world_size, rank=rank,
                                       known_length=False, steps=steps, limit=limit))


def stream_windows(data: Any, *, micro: int, accumulate: int, device: torch.device,
                   world_size: int, rank: int, max_steps: int | None, training: bool,
                   limit: int | None, num_workers: int, keyword: str) -> StreamWindows:
    """:class:`StreamWindows` of ``data``; a training stream needs ``max_steps``."""
    if training and not max_steps:
        raise UserError(f"{keyword} is a stream without a length ({type(data).__name__}): set "
                        f"{flag('max_steps')} so that the run (and its learning-rate schedule) "
                        f"knows how long it is")
    if isinstance(data, IterableDataset) and num_workers > 0:
        # Worker processes decode in parallel; the dataset splits itself among them
        # (torch.utils.data.get_worker_info), as torch requires of an IterableDataset.
        data = DataLoader(data, batch_size=micro, num_workers=num_workers)
    return StreamWindows(data, micro=micro, accumulate=accumulate, device=device,
                         world_size=world_size, rank=rank,
                         steps=int(max_steps or 0) if training else 0, limit=limit)


__all__ = ["InOrderReader", "LoaderWindows", "SampleList", "StreamWindows", "as_dataset",
           "is_sample", "is_stream", "stream_windows"]
