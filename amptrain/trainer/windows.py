"""Global batches, split into per-device micro-batches: the data order contract.

The samples that form each optimizer step depend only on the seed, the epoch and the
global batch size. Micro-batch size, accumulation and world size only decide how a
global batch is cut up, so a 4-way accumulated run, a 2-process DDP run and a plain
run see exactly the same samples in the same steps.
"""
from __future__ import annotations

import collections
import math
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Callable, Generator, Iterator, Protocol, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from ..common import nested
from ..data import protocol


@dataclass(frozen=True)
class StepIndices:
    """One optimizer step for one rank: its micro-batches and the global sample count."""

    micro_indices: list[list[int]]
    global_samples: int


@dataclass
class StepBatch:
    """Materialised micro-batches of one optimizer step, already on the device."""

    micro_batches: list[Any]
    micro_samples: list[int]
    global_samples: int


@dataclass(eq=False)
class SampleOrder:
    """Shuffle, cut into global batches, shard across ranks, cut into micro-batches.

    The final global batch of an epoch may be smaller; it is shared across ranks as
    evenly as possible, and dropped only when it has fewer samples than processes.
    ``micro_batch`` is lowered after an out-of-memory error (later windows are cut the
    new way).
    """

    num_samples: int
    global_batch: int
    micro_batch: int
    _: KW_ONLY
    world_size: int = 1
    rank: int = 0
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False

    def __len__(self) -> int:
        """Optimizer steps per epoch."""
        full, rest = divmod(self.num_samples, self.global_batch)
        keep_rest = rest >= self.world_size and not self.drop_last
        return full + (1 if keep_rest else 0)

    def order(self, epoch: int) -> list[int]:
        """The sample order of an epoch (same on every rank)."""
        return self.order_tensor(epoch).tolist()

    def order_tensor(self, epoch: int) -> torch.Tensor:
        """:meth:`order` as an int64 tensor: 8 bytes a sample, where a list of Python ints
        costs about 36 (millions of token blocks)."""
        if not self.shuffle:
            return torch.arange(self.num_samples)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_samples, generator=generator)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[StepIndices]:
        """The rank's windows of ``epoch``, starting at window ``start`` (for resume);
        produced one at a time, so an epoch's windows are never held whole."""
        order = self.order_tensor(epoch)
        for w in range(start, len(self)):
            batch = order[w * self.global_batch:(w + 1) * self.global_batch].tolist()
            yield self._window(batch)

    def _window(self, batch: Sequence[int]) -> StepIndices:
        n, world = len(batch), self.world_size
        bounds = [r * n // world for r in range(world + 1)]
        shard = list(batch[bounds[self.rank]:bounds[self.rank + 1]])
        smallest = min(bounds[r + 1] - bounds[r] for r in range(world))
        largest = max(bounds[r + 1] - bounds[r] for r in range(world))
        # All ranks must run the same number of micro-steps (DDP syncs at the last one),
        # and none may be empty.
        count = min(math.ceil(largest / self.micro_batch), smallest)
        cuts = [i * len(shard) // count for i in range(count + 1)]
        return StepIndices([shard[cuts[i]:cuts[i + 1]] for i in range(count)], n)


def to_device(batch: Any, device: torch.device, non_blocking: bool = True) -> Any:
    """Move every tensor in a (nested) batch to ``device``."""
    def move(value: Any) -> Any:  # an object that moves itself (transformers' BatchEncoding)
        return value.to(device) if callable(getattr(value, "to", None)) else value

    if not isinstance(batch, (torch.Tensor, dict, list, tuple)):
        return move(batch)
    return nested.map_tensors(lambda tensor: tensor.to(device, non_blocking=non_blocking),
                              batch, leaf=move)


def _pinned(batch: Any) -> Any:
    return nested.map_tensors(torch.Tensor.pin_memory, batch)


def batch_size_of(batch: Any) -> int:
    """Number of samples in a batch: the leading dimension of its labels or first tensor."""
    if isinstance(batch, dict):
        for key in ("labels", "label", "y"):
            if key in batch:
                return int(batch[key].shape[0])
        return int(next(v for v in batch.values() if isinstance(v, torch.Tensor)).shape[0])
    if isinstance(batch, (list, tuple)):
        return batch_size_of(batch[-1] if len(batch) > 1 else batch[0])
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    raise TypeError(f"cannot tell the batch size of a {type(batch).__name__}")


class WindowReader(Protocol):
    """How one kind of data becomes windows: the strategy inside :class:`Windows`.

    Two kinds exist: :class:`IndexedReader` (data with a length, indexed along a
    :class:`SampleOrder`) and :class:`amptrain.trainer.streams.InOrderReader` (DataLoaders and
    streams, read in order).
    """

    @property
    def sample_order(self) -> SampleOrder | None:
        """The sample order of indexed data; None for data read in order."""

    @property
    def known_length(self) -> bool:
        """False when ``len()`` only stands in for an unknown length (a stream)."""

    @property
    def micro_batch(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    def __len__(self) -> int: ...

    def resize(self, micro: int) -> None: ...

    def read(self, epoch: int, start: int) -> Iterator[StepBatch]: ...


class Windows:
    """What the loop reads its steps from: one type for datasets, DataLoaders and streams.

    ``len()`` is the number of steps per epoch (a stream's stands in for its unknown
    length: :attr:`known_length` is then False); ``epoch(e, start)`` yields the epoch's
    :class:`StepBatch` es from window ``start`` (resume); :attr:`micro_batch` is the
    samples per micro-batch the windows are cut into, which ``resize(micro)`` lowers after
    an out-of-memory error (later epochs are cut the new way); :attr:`ended` is True once
    an epoch's windows ran out (a stream that ended early ends its epoch). How the data
    is read is the ``reader``'s (:class:`WindowReader`).
    """

    def __init__(self, reader: WindowReader) -> None:
        self.reader = reader
        self.ended = False

    @property
    def sample_order(self) -> SampleOrder | None:
        """The sample order of indexed data (None for data read in order)."""
        return self.reader.sample_order

    @property
    def known_length(self) -> bool:
        """Whether ``len()`` is the data's (False: a stream's stand-in)."""
        return self.reader.known_length

    @property
    def micro_batch(self) -> int:
        """Samples per micro-batch."""
        return self.reader.micro_batch

    @property
    def device(self) -> torch.device:
        """Where the micro-batches are delivered."""
        return self.reader.device

    def __len__(self) -> int:
        return len(self.reader)

    def resize(self, micro: int) -> None:
        """Cut later windows into micro-batches of ``micro`` (after out-of-memory)."""
        self.reader.resize(micro)

    def epoch(self, epoch: int, start: int = 0) -> Generator[StepBatch, None, None]:
        """The windows of ``epoch`` from window ``start``."""
        self.ended = False
        yield from self.reader.read(epoch, start)
        self.ended = True


@dataclass(eq=False)
class IndexedReader:
    """Windows of a map-style dataset following a :class:`SampleOrder`.

    What the dataset declares (:mod:`amptrain.data.protocol`) decides how it is read:
    column data (``tensors``) is indexed directly, on the device when it lives there (no
    workers, no collation, no copies), and may cut its own micro-batches (``select``);
    data that reads whole micro-batches (``read_batch``) is read here, one window at a
    time; any other dataset goes through a DataLoader driven by the sample order's
    micro-batches.
    Data with an ``on_device`` step has its micro-batches finished on the device.

    ``subset`` (sample indices) restricts the windows to those samples: the sample order
    then counts positions in ``subset`` (``--eval-batches``' fixed sample).
    """

    dataset: Dataset
    sample_order: SampleOrder
    device: torch.device
    _: KW_ONLY
    num_workers: int = 0
    subset: torch.Tensor | None = None
    known_length: bool = field(default=True, init=False)
    _loader: DataLoader | None = field(default=None, init=False)
    _sampler: _IndicesSampler | None = field(default=None, init=False)

    def __len__(self) -> int:
        return len(self.sample_order)

    @property
    def micro_batch(self) -> int:
        """Samples per micro-batch (the sample order's)."""
        return self.sample_order.micro_batch

    def resize(self, micro: int) -> None:
        self.sample_order.micro_batch = micro

    def read(self, epoch: int, start: int) -> Iterator[StepBatch]:
        steps: Iterator[StepIndices] = self.sample_order.epoch(epoch, start)
        if self.subset is not None:
            steps = map(self._through_subset, steps)
        columns = protocol.columns_of(self.dataset)
        read_batch = protocol.batch_reader_of(self.dataset)
        windows: Iterator[StepBatch]
        if columns is not None:
            windows = self._indexed(list(steps), columns)
        elif read_batch is not None:
            windows = self._read(steps, read_batch)
        else:
            windows = self._loaded(steps)
        # Datasets whose batches finish on the device (uint8 images: standardise, augment
        # with a generator keyed by the window, so a resumed run draws the same).
        finish = protocol.finish_of(self.dataset)
        if finish is None:
            yield from windows
            return
        for index, window in enumerate(windows, start):
            window.micro_batches = [
                finish(batch, training=self.sample_order.shuffle,
                       key=(self.sample_order.seed, epoch, index, self.sample_order.rank, m))
                for m, batch in enumerate(window.micro_batches)]
            yield window

    def _through_subset(self, indices: StepIndices) -> StepIndices:
        assert self.subset is not None
        return StepIndices([self.subset[idx].tolist() for idx in indices.micro_indices],
                          indices.global_samples)

    def _read(self, steps: Iterator[StepIndices],
              read_batch: Callable[[Sequence[int]], Any]) -> Iterator[StepBatch]:
        pin = self.device.type == "cuda"
        for indices in steps:
            micro = []
            for idx in indices.micro_indices:
                batch = read_batch(idx)
                micro.append(to_device(_pinned(batch) if pin else batch, self.device))
            yield StepBatch(micro, [len(i) for i in indices.micro_indices], indices.global_samples)

    def _indexed(self, steps: list[StepIndices],
                 tensors: Sequence[torch.Tensor]) -> Iterator[StepBatch]:
        where = tensors[0].device
        select = protocol.shaper_of(self.dataset)
        # The epoch's indices go to the data's device in one non-blocking copy from pinned
        # memory: an index built from a Python list on a GPU is a blocking copy (a host-
        # device sync) per micro-batch. Micro-batches then slice it on the device.
        flat = torch.tensor([i for indices in steps for idx in indices.micro_indices for i in idx],
                            dtype=torch.long)
        if where.type == "cuda":
            flat = flat.pin_memory()
        flat = flat.to(where, non_blocking=True)
        # Data too large for the accelerator is gathered on the host: pinned, its copy to
        # the device does not block either (what DataLoader's pin_memory does).
        pin = where.type == "cpu" and self.device.type == "cuda"
        # Data already on the training device (a tensor dataset moved there) needs no walk
        # over each batch: on a tiny model that walk is a measurable share of a step.
        move = where != self.device
        offset = 0
        for indices in steps:
            micro = []
            for idx in indices.micro_indices:
                index = flat[offset:offset + len(idx)]
                offset += len(idx)
                if select is not None:  # datasets that shape their own batches (token data)
                    batch = select(idx, index)
                else:
                    batch = tuple(t.index_select(0, index) for t in tensors)
                if pin:
                    batch = _pinned(batch)
                micro.append(to_device(batch, self.device) if move else batch)
            yield StepBatch(micro, [len(i) for i in indices.micro_indices], indices.global_samples)

    def _loaded(self, steps: Iterator[StepIndices]) -> Iterator[StepBatch]:
        # One DataLoader for the life of these windows: with workers they persist across
        # epochs (no restart per epoch), and the windows' indices are fed to them lazily.
        if self._loader is None:
            self._sampler = _IndicesSampler()
            workers = self.num_workers
            self._loader = DataLoader(self.dataset, batch_sampler=self._sampler,
                                      num_workers=workers,
                                      pin_memory=self.device.type == "cuda",
                                      persistent_workers=workers > 0,
                                      prefetch_factor=4 if workers > 0 else None,
                                      # its own generator: creating workers must not draw
                                      # from the training RNG (exact resume)
                                      generator=torch.Generator().manual_seed(0))
        assert self._sampler is not None
        self._sampler.start(steps)
        batches = iter(self._loader)
        while True:
            try:
                first = next(batches)
            except StopIteration:  # a worker's UserError arrives unwrapped (errors.UserError)
                return
            indices = self._sampler.taken.popleft()
            micro = [first] + [next(batches) for _ in indices.micro_indices[1:]]
            yield StepBatch([to_device(b, self.device) for b in micro],
                         [len(i) for i in indices.micro_indices], indices.global_samples)


class _IndicesSampler:
    """A DataLoader's batch sampler fed one epoch's windows at a time; it notes each
    window's indices as the loader takes them, so windows know their micro-batch sizes."""

    def __init__(self) -> None:
        self.steps: Iterator[StepIndices] = iter(())
        self.taken: collections.deque[StepIndices] = collections.deque()

    def start(self, steps: Iterator[StepIndices]) -> None:
        self.steps = steps
        self.taken.clear()

    def __iter__(self) -> Iterator[list[int]]:
        for indices in self.steps:
            self.taken.append(indices)
            yield from indices.micro_indices


class DatasetWindows(Windows):
    """The windows of a map-style dataset (an :class:`IndexedReader`); the constructor is
    the only thing this adds to :class:`Windows`."""

    def __init__(self, dataset: Dataset, order: SampleOrder, device: torch.device, *,
                 num_workers: int = 0, subset: torch.Tensor | None = None) -> None:
        self.indexed = IndexedReader(dataset, order, device, num_workers=num_workers,
                                     subset=subset)
        super().__init__(self.indexed)

    @property
    def dataset(self) -> Dataset:
        """The dataset read (as training holds it: on the accelerator when it fits)."""
        return self.indexed.dataset
