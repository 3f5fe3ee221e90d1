"""The dataset protocol: what amptrain reads from the data it trains on, declared once.

Built-in data (:class:`~amptrain.data.TensorData`, :class:`~amptrain.data.TokenData`,
:class:`~amptrain.data.tokens.TokenBlockData`, the image sets) and a user's own data
implement it structurally: nothing has to inherit from a class of amptrain's, so torch's
``TensorDataset`` is already :class:`ColumnData`.

* :class:`MapData` -- what every indexable dataset is: ``len()`` and ``data[i]``. Data
  without a length is a stream (:mod:`amptrain.trainer.streams`), read in order.

Optional capabilities, each a protocol of its own (a dataset has any of them, or none):

* :class:`ColumnData` -- ``tensors``: aligned in-memory tensors, inputs first and targets
  last. The Trainer indexes them directly (on the accelerator when they fit): no
  workers, no collation. Task inference, input checks and the output check read them.
* :class:`BatchShaping` -- ``select(indices, index)``: column data that cuts its own
  micro-batches (token data: dict batches padded to their longest row).
* :class:`BatchReading` -- ``read_batch(indices)``: data on disk read a whole micro-batch
  at a time in the training process (token blocks), no DataLoader.
* :class:`DeviceMovable` -- ``to(device)`` and ``nbytes()``: column data that can move
  itself to the accelerator once.
* :class:`DeviceFinishing` -- ``on_device``: a step ``(batch, *, training, key) -> batch``
  run on the device after a micro-batch arrives there (uint8 images: standardised, and
  augmented when training with a generator keyed by ``key``), or None.

The functions below are the only places that ask which capabilities a dataset has.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import torch
from torch.utils.data import DataLoader

#: ``on_device(batch, *, training, key) -> batch``
DeviceFinish = Callable[..., Any]


@runtime_checkable
class MapData(Protocol):
    """An indexable dataset: a length and one sample per index."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


@runtime_checkable
class ColumnData(Protocol):
    """Aligned in-memory tensors (inputs first, targets last), indexed directly."""

    tensors: Sequence[torch.Tensor]


@runtime_checkable
class BatchShaping(Protocol):
    """Column data that cuts its own micro-batches: ``indices`` as a list, ``index`` the
    same on the data's device (no host-device copy per micro-batch)."""

    def select(self, indices: Sequence[int], index: torch.Tensor) -> Any: ...


@runtime_checkable
class BatchReading(Protocol):
    """Data read a whole micro-batch at a time (``indices`` in the plan's order)."""

    def read_batch(self, indices: Sequence[int]) -> Any: ...


@runtime_checkable
class DeviceMovable(Protocol):
    """Column data that moves itself to a device (a copy) and tells its size."""

    def to(self, device: torch.device) -> Any: ...

    def nbytes(self) -> int: ...


@runtime_checkable
class DeviceFinishing(Protocol):
    """Data whose batches are finished on the device; ``on_device`` None: they are not."""

    on_device: DeviceFinish | None


def columns_of(data: Any) -> tuple[torch.Tensor, ...] | None:
    """The aligned tensors of :class:`ColumnData`, else None (also when ``tensors`` is
    empty or holds something other than tensors: such data is read sample by sample)."""
    if not isinstance(data, ColumnData):
        return None
    tensors = data.tensors
    if not isinstance(tensors, (tuple, list)) or not tensors \
            or not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    return tuple(tensors)


def targets_of(data: Any) -> torch.Tensor | None:
    """The targets of column data (its last tensor), else None."""
    columns = columns_of(data)
    return columns[-1] if columns is not None else None


def finish_of(data: Any) -> DeviceFinish | None:
    """The on-device step of ``data`` (or of a DataLoader's dataset), else None."""
    if isinstance(data, DataLoader):
        data = data.dataset
    return data.on_device if isinstance(data, DeviceFinishing) else None


def batch_reader_of(data: Any) -> Callable[[Sequence[int]], Any] | None:
    """``data.read_batch`` for :class:`BatchReading` data, else None."""
    return data.read_batch if isinstance(data, BatchReading) else None


def shaper_of(data: Any) -> Callable[[Sequence[int], torch.Tensor], Any] | None:
    """``data.select`` for :class:`BatchShaping` data, else None."""
    return data.select if isinstance(data, BatchShaping) else None


def reads_in_process(data: Any) -> bool:
    """True for data that needs no DataLoader workers: in memory or read in whole batches."""
    return columns_of(data) is not None or isinstance(data, BatchReading)


__all__ = ["BatchReading", "BatchShaping", "ColumnData", "DeviceFinish", "DeviceFinishing",
           "DeviceMovable", "MapData", "batch_reader_of", "columns_of", "finish_of",
           "reads_in_process", "shaper_of", "targets_of"]
