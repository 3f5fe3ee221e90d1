"""Checks that the data and the model fit each other, made once before training.

A classifier given float labels, labels outside the model's outputs, an empty split or
NaN features otherwise fails deep inside a loss function (``IndexError: Target 7 is out
of bounds``, a device-side assert on CUDA) or, worse, trains on garbage. Each check runs
once -- on the in-memory tensors at set-up, on the first batch's outputs before the
first loss -- so a steady-state step pays nothing for them.
"""
from __future__ import annotations

from typing import Any

import torch

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


def check_dataset(data: Any, keyword: str, *, classifier: bool,
                  class_names: list[str] | None) -> None:
    """Refuse an empty ``data`` and, for in-memory tensors, garbage values.

    ``classifier``: the loss is the built-in cross-entropy, so the last tensor must hold
    integer class indices (within ``class_names`` when they are given).
    """
    length = dataset_length(data, keyword)
    if length == 0:
        raise UserError(f"{keyword} is empty: there is nothing to "
                        f"{'train' if keyword == 'train_data' else 'evaluate'} on")
    tensors = getattr(data, "tensors", None)
    if not isinstance(tensors, (tuple, list)) or not tensors \
            or not all(isinstance(t, torch.Tensor) for t in tensors):
        return
    *inputs, labels = tensors
    for i, x in enumerate(inputs):
        if x.ndim >= 2 and 0 in x.shape[1:]:
            raise UserError(f"{keyword}: input {i} has no values per sample "
                            f"(shape {tuple(x.shape)})")
        if x.is_floating_point() and not bool(torch.isfinite(x).all()):
            raise UserError(f"{keyword}: input {i} contains NaN or infinite values")
    if classifier:
        check_labels(labels, keyword, class_names)


def check_labels(labels: torch.Tensor, keyword: str, class_names: list[str] | None) -> None:
    """Integer class indices in ``0..C-1`` (C = ``len(class_names)`` when given)."""
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise UserError(f"{keyword}: labels are {str(labels.dtype).replace('torch.', '')}, but "
                        f"a classifier's cross-entropy needs integer class indices; convert "
                        f"them with .long() or pass loss_fn= for another task")
    if labels.numel() == 0:
        return
    low, high = int(labels.min()), int(labels.max())
    if low < 0:
        raise UserError(f"{keyword}: label {low} is negative; classes are numbered from 0")
    if class_names and high >= len(class_names):
        raise UserError(f"{keyword}: label {high} is outside the {len(class_names)} classes "
                        f"named by class_names (0..{len(class_names) - 1})")


def first_samples(data: Any, device: torch.device, count: int = 2) -> tuple | None:
    """The first ``count`` samples of in-memory tensor data as a batch on ``device``
    (None for other data: reading it could advance a loader or its sampler)."""
    tensors = getattr(data, "tensors", None)
    if not isinstance(tensors, (tuple, list)) or len(tensors) < 2 \
            or not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    return tuple(t[:count].to(device) for t in tensors)


def check_batch_size(num_samples: int, batch_size: int) -> None:
    """A global batch must fit in the training set; else every step is one short batch."""
    if batch_size > num_samples:
        raise UserError(f"{flag('batch_size')} {batch_size} is larger than the training set "
                        f"({num_samples} samples): lower {flag('batch_size')} to at most "
                        f"{num_samples}")


def check_outputs(logits: torch.Tensor | None, targets: Any, *, num_classes: int | None,
                  model_name: str | None, all_labels: torch.Tensor | None = None) -> None:
    """The first batch's logits fit its labels (called once, before the first loss).

    ``all_labels``: every training label, when they are in memory, so that a label the
    first batch lacks is checked too. Reads two numbers from the device, once per run.
    """
    if logits is None or not isinstance(targets, torch.Tensor):
        return
    which = f" ({flag('model')} {model_name})" if model_name else ""
    if targets.is_floating_point():
        if targets.shape != logits.shape:  # equal shapes are class probabilities
            check_labels(targets, "the training labels", None)
        return
    width = logits.shape[-1] if logits.ndim >= 1 else 1
    if logits.ndim < 2:
        raise UserError(f"the model{which} returns shape {tuple(logits.shape)} for a batch; a "
                        f"classifier must return one row of class logits per sample")
    if num_classes and width < num_classes:
        raise UserError(f"the model{which} returns {width} outputs per sample, but the data "
                        f"has {num_classes} classes: its last layer needs {num_classes} outputs")
    if all_labels is not None and not all_labels.is_floating_point():
        targets = all_labels
    if not targets.numel():
        return
    low, high = int(targets.min()), int(targets.max())
    if low < 0 or high >= width:
        bad = low if low < 0 else high
        raise UserError(f"label {bad} is outside the model's {width} outputs{which}: the "
                        f"model must return one logit per class (classes 0..{width - 1})")
