"""Checks of what ``Trainer.fit`` is given, made once before training: argument types,
empty splits, NaN or empty inputs, a batch larger than the data.

Otherwise these fail deep inside a loss function or, worse, train on garbage. What the
targets must be (class labels, regression values) is the task's to check
(:meth:`~amptrain.tasks.Task.check_data`, :meth:`~amptrain.tasks.Task.check_outputs`).
Each check runs once, so a steady-state step pays nothing for them.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .errors import UserError, flag


def dataset_length(data: Any, keyword: str) -> int | None:
    """The number of samples (or batches, for a DataLoader), or None when unknown.

    Raises :class:`UserError` for data that is neither a dataset nor an iterable.
    """
    if data is None or isinstance(data, (str, bytes, int, float, torch.Tensor)):
        raise UserError(f"{keyword} must be a Dataset, a DataLoader or an iterable of batches "
                        f"(got {type(data).__name__})")
    if not hasattr(data, "__len__"):
        if not hasattr(data, "__iter__"):
            raise UserError(f"{keyword} must be a Dataset, a DataLoader or an iterable of "
                            f"batches (got {type(data).__name__})")
        return None
    return len(data)


def check_dataset(data: Any, keyword: str) -> None:
    """Refuse an empty ``data`` and, for in-memory tensors, inputs that are garbage
    (NaN/inf, no values per sample). What the targets must be is the task's to check."""
    length = dataset_length(data, keyword)
    if length == 0:
        raise UserError(f"{keyword} is empty: there is nothing to "
                        f"{'train' if keyword == 'train_data' else 'evaluate'} on")
    tensors = getattr(data, "tensors", None)
    if not isinstance(tensors, (tuple, list)) or not tensors \
            or not all(isinstance(t, torch.Tensor) for t in tensors):
        return
    for i, x in enumerate(tensors[:-1]):
        if x.ndim >= 2 and 0 in x.shape[1:]:
            raise UserError(f"{keyword}: input {i} has no values per sample "
                            f"(shape {tuple(x.shape)})")
        if x.is_floating_point() and not bool(torch.isfinite(x).all()):
            raise UserError(f"{keyword}: input {i} contains NaN or infinite values")


def check_fit_arguments(model: Any, train_data: Any, val_data: Any, *, optimizer: Any,
                        loss_fn: Any, class_names: Any) -> list[str] | None:
    """One clear error per wrong argument of ``Trainer.fit``, before anything is built;
    returns the class names as a list (or None)."""
    if not isinstance(model, nn.Module):
        raise UserError(f"model must be a torch.nn.Module (got {type(model).__name__})")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise UserError(f"optimizer must be a torch.optim.Optimizer (got "
                        f"{type(optimizer).__name__})")
    if loss_fn is not None and not callable(loss_fn):
        raise UserError(f"loss_fn must be callable as loss_fn(logits, targets) (got "
                        f"{type(loss_fn).__name__})")
    if class_names is not None and (isinstance(class_names, str) or not all(
            isinstance(n, str) for n in class_names)):
        raise UserError("class_names must be a list of strings, one per class")
    check_dataset(train_data, "train_data")
    if val_data is not None:
        check_dataset(val_data, "val_data")
    return list(class_names) if class_names is not None else None


def first_samples(data: Any, device: torch.device, count: int = 2) -> tuple | None:
    """The first ``count`` samples of in-memory tensor data as a batch on ``device``
    (None for other data: reading it could advance a loader or its sampler)."""
    tensors = getattr(data, "tensors", None)
    if not isinstance(tensors, (tuple, list)) or len(tensors) < 2 \
            or not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    batch = tuple(t[:count].to(device) for t in tensors)
    finish = getattr(data, "on_device", None)  # uint8 images: standardised on the device
    return tuple(finish(batch, training=False, key=(0,))) if finish is not None else batch


def check_batch_size(num_samples: int, batch_size: int) -> None:
    """A global batch must fit in the training set; else every step is one short batch."""
    if batch_size > num_samples:
        raise UserError(f"{flag('batch_size')} {batch_size} is larger than the training set "
                        f"({num_samples} samples): lower {flag('batch_size')} to at most "
                        f"{num_samples}")
