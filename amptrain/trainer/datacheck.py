"""Checks of what ``Trainer.fit`` is given, made once before training: argument types,
empty splits, NaN or empty inputs, a batch larger than the data.

Otherwise these fail deep inside a loss function or, worse, train on garbage. What the
targets must be (class labels, regression values) is the task's to check
(the task's ``checks`` part: :class:`~amptrain.tasks.checks.DataChecks`).
Each check runs once, so a steady-state step pays nothing for them.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ..data import protocol
from ..data.module import MAX_SAMPLES
from ..common.errors import UserError, flag
from ..tasks import Task


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
    try:
        length = len(data)
    except Exception as exc:  # the caller's __len__: its failure is reported, not ours
        raise UserError(f"{keyword}: len() raised {type(exc).__name__}: "
                        f"{str(exc).strip()[:100]}") from None
    if isinstance(data, Dataset) and length > MAX_SAMPLES:
        raise UserError(f"{keyword} claims {length} samples, over the limit of {MAX_SAMPLES} "
                        f"for a map-style Dataset (a shuffled order holds 8 bytes per sample);"
                        f" check its __len__, or stream larger data as an IterableDataset")
    return length


def check_model(model: nn.Module) -> None:
    """A model with something to train, whose weights hold data."""
    params = list(model.parameters())
    if any(p.is_meta for p in params) or any(b.is_meta for b in model.buffers()):
        raise UserError("model has weights on the 'meta' device (shapes without data, e.g. "
                        "built under torch.device('meta')): materialise them first, e.g. "
                        "model.to_empty(device='cpu') and load or initialise the weights")
    if not any(p.requires_grad for p in params):
        what = "no parameters" if not params else \
            f"{len(params)} parameters, none with requires_grad=True"
        raise UserError(f"model has nothing to train ({what}): unfreeze some parameters "
                        f"(requires_grad_(True)) or give a model with weights")


def check_dataset(data: Any, keyword: str) -> None:
    """Refuse an empty ``data`` and, for in-memory tensors, inputs that are garbage
    (NaN/inf, no values per sample). What the targets must be is the task's to check."""
    length = dataset_length(data, keyword)
    if length == 0:
        raise UserError(f"{keyword} is empty: there is nothing to "
                        f"{'train' if keyword == 'train_data' else 'evaluate'} on")
    tensors = protocol.columns_of(data)
    if tensors is None:
        return
    if any(t.is_meta for t in tensors):
        raise UserError(f"{keyword} holds tensors on the 'meta' device (shapes without "
                        f"data): give tensors with values, on the CPU or the training device")
    for i, x in enumerate(tensors[:-1]):
        if x.ndim >= 2 and 0 in x.shape[1:]:
            raise UserError(f"{keyword}: input {i} has no values per sample "
                            f"(shape {tuple(x.shape)})")
        if x.is_floating_point() and not bool(torch.isfinite(x).all()):
            raise UserError(f"{keyword}: input {i} contains NaN or infinite values")


def check_fit_arguments(model: Any, train_data: Any, val_data: Any, *, optimizer: Any,
                        loss_fn: Any, class_names: Any, task: Any = None) -> list[str] | None:
    """One clear error per wrong argument of ``Trainer.fit``, before anything is built;
    returns the class names as a list (or None)."""
    if not isinstance(model, nn.Module):
        raise UserError(f"model must be a torch.nn.Module (got {type(model).__name__})")
    check_model(model)
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise UserError(f"optimizer must be a torch.optim.Optimizer (got "
                        f"{type(optimizer).__name__})")
    if optimizer is not None and isinstance(model, torch.nn.Module):
        own = {id(p) for p in model.parameters()}
        given = [p for group in optimizer.param_groups for p in group["params"]]
        foreign = sum(1 for p in given if id(p) not in own)
        if foreign:
            raise UserError(f"optimizer holds {foreign} of {len(given)} parameters that are "
                            f"not the model's (it would step them and never train the model): "
                            f"build it from model.parameters()")
    if loss_fn is not None and not callable(loss_fn):
        raise UserError(f"loss_fn must be callable as loss_fn(logits, targets) (got "
                        f"{type(loss_fn).__name__})")
    if class_names is not None and (isinstance(class_names, str) or not all(
            isinstance(n, str) for n in class_names)):
        raise UserError("class_names must be a list of strings, one per class")
    if task is not None and not isinstance(task, Task):
        raise UserError(f"task must be an amptrain.tasks.Task (got {type(task).__name__}); "
                        f"name a built-in one with the {flag('task')} option")
    check_dataset(train_data, "train_data")
    if val_data is not None:
        check_dataset(val_data, "val_data")
        check_same_inputs(train_data, val_data)
    return list(class_names) if class_names is not None else None


def check_same_inputs(train_data: Any, val_data: Any) -> None:
    """In-memory validation inputs must have the training inputs' per-sample shape: else
    the mismatch surfaces only at the first evaluation, after training."""
    train, val = protocol.columns_of(train_data), protocol.columns_of(val_data)
    if train is None or val is None or len(train) != len(val):
        return
    for i, (a, b) in enumerate(zip(train[:-1], val[:-1])):
        if a.shape[1:] != b.shape[1:]:
            raise UserError(f"val_data: input {i} has shape {tuple(b.shape[1:])} per sample, "
                            f"but train_data's has {tuple(a.shape[1:])}: the model cannot "
                            f"evaluate it")


def first_samples(data: Any, device: torch.device, count: int = 2) -> tuple | None:
    """The first ``count`` samples of in-memory tensor data as a batch on ``device``
    (None for other data: reading it could advance a loader or its sampler)."""
    tensors = protocol.columns_of(data)
    if tensors is None or len(tensors) < 2:
        return None
    batch = tuple(t[:count].to(device) for t in tensors)
    finish = protocol.finish_of(data)  # uint8 images: standardised on the device
    return tuple(finish(batch, training=False, key=(0,))) if finish is not None else batch


def check_batch_size(num_samples: int, batch_size: int) -> None:
    """A global batch must fit in the training set; else every step is one short batch."""
    if batch_size > num_samples:
        raise UserError(f"{flag('batch_size')} {batch_size} is larger than the training set "
                        f"({num_samples} samples): lower {flag('batch_size')} to at most "
                        f"{num_samples}")
