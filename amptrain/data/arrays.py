"""``npz:FILE``: the user's own arrays."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..common.errors import UserError
from .core import (
    DataBundle,
    DataOptions,
    TensorData,
    labels_to_classes,
    path_and_options,
    register,
    split_indices,
)

KINDS = ("auto", "image", "features", "sequence")


@register("npz")
def npz(argument: str, options: DataOptions) -> DataBundle:
    """``npz:FILE[,kind=auto|image|features|sequence]`` with arrays ``x`` (samples first)
    and ``y`` (labels); optional ``x_val``/``y_val`` are the validation split.

    Float ``y`` (N values, or N x k) is a regression target under ``--task auto``;
    anything else is class labels (``--task classification`` reads whole-number floats
    as classes too).

    ``kind=auto`` reads N x C x H x W and N x H x W (one channel) as images, anything
    else as features. ``kind=sequence`` reads N x L non-negative integers as token ids
    (0 = padding). Values are used as given, except that uint8 arrays are scaled to [0, 1].
    """
    spec = f"npz:{argument}"
    path, o = path_and_options(argument, {"kind": "auto"}, spec, what="file")
    if o["kind"] not in KINDS:
        raise UserError(f"--data {spec}: kind must be one of {', '.join(KINDS)}")
    try:
        with np.load(path, allow_pickle=False) as arrays:
            data = {k: arrays[k] for k in arrays.files}
    except Exception as exc:  # zipfile.BadZipFile, ValueError, OSError, EOFError ...
        raise UserError(f"--data {spec}: not a readable .npz file ({type(exc).__name__})") from None
    if "x" not in data or "y" not in data:
        raise UserError(f"--data {spec}: needs arrays named x and y (found "
                        f"{', '.join(data) or 'none'})")
    if ("x_val" in data) != ("y_val" in data):
        raise UserError(f"--data {spec}: x_val and y_val come together (found only one)")
    splits = [("x", "y")] + ([("x_val", "y_val")] if "x_val" in data else [])
    regression = _is_regression(data["y"], options.task, spec)
    for x_name, y_name in splits:
        _check_pair(data[x_name], data[y_name], x_name, y_name, spec, regression=regression)
    if regression:
        return _regression(data, o["kind"], spec, options)
    fitted = options.fitted or {}
    labels, names = labels_to_classes(
        list(data["y"].reshape(-1)) + list(data.get("y_val", np.empty(0)).reshape(-1)), spec,
        known=fitted.get("class_names"))
    x = _inputs(data["x"], o["kind"], spec, "x")
    n = len(x)
    if "x_val" in data:
        x_val = _inputs(data["x_val"], o["kind"], spec, "x_val")
        if x_val.shape[1:] != x.shape[1:]:
            raise UserError(f"--data {spec}: x_val rows have shape {tuple(x_val.shape[1:])}, "
                            f"x rows {tuple(x.shape[1:])}")
        train, val = TensorData(x, labels[:n]), TensorData(x_val, labels[n:])
    else:
        train_idx, val_idx = split_indices(n, options.val_fraction)
        train, val = TensorData(x[train_idx], labels[train_idx]), TensorData(x[val_idx],
                                                                             labels[val_idx])
    shape = tuple(x.shape[1:])
    if o["kind"] == "sequence":
        largest = max(int(t.tensors[0].max()) for t in (train, val))
        vocab = int(fitted.get("vocab_size") or largest + 1)
        if largest >= vocab:
            raise UserError(f"--data {spec}: token id {largest} is outside the vocabulary of "
                            f"{vocab} the model was trained on")
        return DataBundle(train, val, len(names), shape, "sequence", class_names=names,
                          vocab_size=vocab, fitted={"class_names": names, "vocab_size": vocab})
    kind = "image" if len(shape) == 3 else "features"
    return DataBundle(train, val, len(names), shape, kind, class_names=names,
                      fitted={"class_names": names})


def _is_regression(y: np.ndarray, task: str | None, spec: str) -> bool:
    """Float ``y`` is regression under ``--task auto``; ``--task regression`` needs it."""
    if task == "regression" and y.dtype.kind != "f":
        raise UserError(f"--data {spec}: --task regression needs float targets, but y holds "
                        f"{y.dtype} values (class labels: use --task classification; "
                        f"integer measurements: save y as float)")
    if task in ("lm",):
        raise UserError(f"--data {spec}: --task lm needs text (--data text:PATH); npz files "
                        f"hold samples and labels")
    return task == "regression" or (task in (None, "auto") and y.dtype.kind == "f")


def _regression(data: dict[str, np.ndarray], kind: str, spec: str,
                options: DataOptions) -> DataBundle:
    """Float targets, one value (N) or a row of k values (N x k) per sample."""
    def targets(name: str) -> torch.Tensor:
        given = data[name]
        rows = ~np.isfinite(given.reshape(len(given), -1)).all(axis=1)
        if rows.any():
            row = int(np.argmax(rows))
            raise UserError(f"--data {spec}: {name} of row {row} is not a finite number "
                            f"({given.reshape(len(given), -1)[row].tolist()}); regression "
                            f"targets must be finite: drop or fill those samples")
        with np.errstate(over="ignore"):
            y = given.astype(np.float32)
        rows = ~np.isfinite(y.reshape(len(y), -1)).all(axis=1)
        if rows.any():  # finite in the file, but beyond what training computes in
            row = int(np.argmax(rows))
            raise UserError(f"--data {spec}: {name} of row {row} "
                            f"({given.reshape(len(given), -1)[row].tolist()}) is beyond "
                            f"float32's range (about ±3.4e38), in which amptrain trains: "
                            f"rescale the targets (e.g. divide by a power of ten)")
        return torch.as_tensor(y if y.ndim == 1 else y.reshape(len(y), -1))

    x, y = _inputs(data["x"], kind, spec, "x"), targets("y")
    if "x_val" in data:
        x_val = _inputs(data["x_val"], kind, spec, "x_val")
        if x_val.shape[1:] != x.shape[1:]:  # else found only at the final evaluation
            raise UserError(f"--data {spec}: x_val rows have shape {tuple(x_val.shape[1:])}, "
                            f"x rows {tuple(x.shape[1:])}")
        train, val = TensorData(x, y), TensorData(x_val, targets("y_val"))
    else:
        train_idx, val_idx = split_indices(len(x), options.val_fraction)
        train, val = TensorData(x[train_idx], y[train_idx]), TensorData(x[val_idx], y[val_idx])
    if val.tensors[1].shape[1:] != y.shape[1:]:
        raise UserError(f"--data {spec}: y_val has {tuple(val.tensors[1].shape[1:])} values per "
                        f"row, y {tuple(y.shape[1:])}")
    shape = tuple(x.shape[1:])
    outputs = 1 if y.ndim == 1 else int(y.shape[1])
    return DataBundle(train, val, outputs, shape, "image" if len(shape) == 3 else "features",
                      task="regression", fitted={"targets": outputs})


def _check_pair(x: np.ndarray, y: np.ndarray, x_name: str, y_name: str, spec: str,
                regression: bool = False) -> None:
    if x.ndim < 2:
        raise UserError(f"--data {spec}: {x_name} must have a row per sample (got shape "
                        f"{x.shape})")
    if regression:
        if y.ndim not in (1, 2) or 0 in y.shape[1:]:
            raise UserError(f"--data {spec}: {y_name} must hold one value or one row of values "
                            f"per sample (got shape {y.shape})")
    elif y.ndim != 1 and not (y.ndim == 2 and y.shape[1] == 1):
        raise UserError(f"--data {spec}: {y_name} must hold one class label per row (got "
                        f"shape {y.shape})")
    if 0 in x.shape[1:]:
        raise UserError(f"--data {spec}: {x_name} has no values per sample (shape {x.shape})")
    if len(x) != len(y):
        raise UserError(f"--data {spec}: {x_name} has {len(x)} rows but {y_name} has {len(y)}")
    if len(x) < 2:
        raise UserError(f"--data {spec}: {x_name} needs at least 2 rows (got {len(x)})")


def _inputs(x: np.ndarray, kind: str, spec: str, name: str) -> torch.Tensor:
    """The model inputs of one array: float32 values or int64 token ids."""
    if x.dtype.kind not in "biuf":
        raise UserError(f"--data {spec}: {name} must be numeric (got dtype {x.dtype})")
    if kind == "sequence":
        if x.ndim != 2 or x.dtype.kind not in "iu" or (x.size and x.min() < 0):
            raise UserError(f"--data {spec}: kind=sequence needs {name} of non-negative integer "
                            f"token ids, samples x length (got {x.dtype} {x.shape})")
        return torch.as_tensor(x.astype(np.int64))
    values: Any = x.astype(np.float32) / 255.0 if x.dtype == np.uint8 else x.astype(np.float32)
    if not np.isfinite(values).all():
        raise UserError(f"--data {spec}: {name} contains NaN or infinite values")
    tensor = torch.as_tensor(values)
    if kind == "image" or (kind == "auto" and tensor.ndim in (3, 4)):
        if tensor.ndim == 3:
            tensor = tensor.unsqueeze(1)  # N x H x W: one channel
        if tensor.ndim != 4:
            raise UserError(f"--data {spec}: kind=image needs {name} of shape N x C x H x W or "
                            f"N x H x W (got {tuple(x.shape)})")
    elif kind == "features" and tensor.ndim != 2:
        tensor = tensor.reshape(len(tensor), -1)
    return tensor
