"""Image datasets in their published file formats: ``idx:DIR`` (MNIST, Fashion-MNIST)
and ``cifar10:DIR`` (the CIFAR-10 python pickle batches).

Both are held in memory as uint8 (MNIST: 60k x 1 x 28 x 28, 47 MB; CIFAR-10:
50k x 3 x 32 x 32, 150 MB) and standardised per channel with the training split's
mean and standard deviation on the device, batch by batch (``--augment`` applies).
"""
from __future__ import annotations

import gzip
import math
import pickle
import re
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..common.errors import UserError
from .core import DataBundle, DataOptions, image_bundle, index_labels, path_and_options, register

# ----------------------------------------------------------------------------- IDX
#: IDX magic numbers: two zero bytes, a type code (0x08 = unsigned byte), the number of
#: dimensions. MNIST images are 3-d (count, rows, columns), labels 1-d.
IDX_IMAGES_MAGIC = 0x00000803
IDX_LABELS_MAGIC = 0x00000801


def read_bytes(path: Path, spec: str) -> bytes:
    """A file's bytes, gunzipped when it starts with the gzip magic (whatever its name)."""
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise UserError(f"--data {spec}: cannot read {path.name}: "
                        f"{exc.__class__.__name__} (corrupt or truncated gzip?)") from None
    return raw


def read_idx(path: Path, magic: int, spec: str) -> np.ndarray:
    """An IDX file of unsigned bytes (plain or gzipped) as a numpy array, fully checked."""
    raw = read_bytes(path, spec)
    if len(raw) < 4:
        raise UserError(f"--data {spec}: {path.name} is truncated ({len(raw)} bytes)")
    found = struct.unpack(">I", raw[:4])[0]
    if found != magic:
        what = "image" if magic == IDX_IMAGES_MAGIC else "label"
        raise UserError(f"--data {spec}: {path.name} has magic number 0x{found:08X}, expected "
                        f"0x{magic:08X}: not an IDX {what} file")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise UserError(f"--data {spec}: {path.name} is truncated (incomplete header)")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    expected = math.prod(dims)
    if len(raw) - header != expected:
        problem = "is truncated" if len(raw) - header < expected else "has trailing bytes"
        raise UserError(f"--data {spec}: {path.name} {problem}: its header promises "
                        f"{' x '.join(map(str, dims))} = {expected} bytes, "
                        f"found {len(raw) - header}")
    return np.frombuffer(raw, dtype=np.uint8, count=expected, offset=header).reshape(dims)


def find_idx_file(root: Path, split_name: str, what: str) -> Path | None:
    """``{train,t10k}-{images,labels}-idx{3,1}-ubyte`` (or ``.idx3-ubyte``), ``.gz`` or not."""
    pattern = re.compile(rf"{split_name}-{what}[-.]idx[13]-ubyte(\.gz)?$")
    found = sorted((p for p in root.iterdir() if p.is_file() and pattern.match(p.name)),
                   key=lambda p: p.suffix == ".gz")  # the uncompressed copy if both exist
    return found[0] if found else None


def read_idx_split(root: Path, split_name: str, spec: str
                   ) -> tuple[np.ndarray, np.ndarray] | None:
    """(images, labels) of one split, or None when neither file is there."""
    images_path = find_idx_file(root, split_name, "images")
    labels_path = find_idx_file(root, split_name, "labels")
    if images_path is None and labels_path is None:
        return None
    if images_path is None or labels_path is None:
        missing = "images-idx3" if images_path is None else "labels-idx1"
        raise UserError(f"--data {spec}: {split_name}-{missing}-ubyte[.gz] is missing from {root}")
    images = read_idx(images_path, IDX_IMAGES_MAGIC, spec)
    labels = read_idx(labels_path, IDX_LABELS_MAGIC, spec)
    if len(images) != len(labels):
        raise UserError(f"--data {spec}: {images_path.name} has {len(images)} images but "
                        f"{labels_path.name} has {len(labels)} labels")
    return images, labels


@register("idx")
def idx(argument: str, options: DataOptions) -> DataBundle:
    """``idx:DIR``: MNIST-style IDX files ``train-images-idx3-ubyte``,
    ``train-labels-idx1-ubyte`` and, as the validation split, ``t10k-*`` (gzipped or not).
    Without ``t10k-*`` files a seeded share of the training files validates."""
    spec = f"idx:{argument}"
    root, _ = path_and_options(argument, {}, spec, what="directory")
    train = read_idx_split(root, "train", spec)
    if train is None:
        raise UserError(f"--data {spec}: no train-images-idx3-ubyte[.gz] and "
                        f"train-labels-idx1-ubyte[.gz] in {root}")
    test = read_idx_split(root, "t10k", spec)
    if test is not None and test[0].shape[1:] != train[0].shape[1:]:
        raise UserError(f"--data {spec}: t10k images are {test[0].shape[1:]}, train images "
                        f"{train[0].shape[1:]}")
    labels = [train[1]] + ([test[1]] if test is not None else [])
    if len(np.unique(train[1])) < 2:
        raise UserError(f"--data {spec}: needs at least two classes, found "
                        f"{len(np.unique(train[1]))} in the training labels")
    num_classes = int(max(int(lab.max()) for lab in labels)) + 1

    def images(array: np.ndarray) -> torch.Tensor:  # uint8 until the device
        return torch.from_numpy(np.array(array, dtype=np.uint8)).unsqueeze(1)

    return image_bundle(images(train[0]), index_labels(train[1], num_classes, spec, "train"),
                        images(test[0]) if test else None,
                        index_labels(test[1], num_classes, spec, "t10k") if test else None,
                        num_classes=num_classes,
                        class_names=[str(i) for i in range(num_classes)], options=options)


# ------------------------------------------------------------------------- CIFAR-10
class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles only plain containers and numpy arrays: a pickle from the internet must
    not be able to run code (``pickle.load`` would import and call anything)."""

    ALLOWED = {("_codecs", "encode"), ("numpy", "ndarray"), ("numpy", "dtype"),
               ("numpy.core.multiarray", "_reconstruct"),
               ("numpy._core.multiarray", "_reconstruct"),
               ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def load_pickle_dict(path: Path, spec: str) -> dict[str, Any]:
    """A CIFAR batch: a pickled dict (python 2 pickles have bytes keys; made str here)."""
    try:
        with path.open("rb") as f:
            obj = _ArrayUnpickler(f, encoding="bytes").load()
    except Exception as exc:  # UnpicklingError, EOFError, ValueError ... for any corrupt file
        raise UserError(f"--data {spec}: {path.name} is not a readable CIFAR python pickle "
                        f"({exc.__class__.__name__}: {str(exc)[:80]})") from None
    if not isinstance(obj, dict):
        raise UserError(f"--data {spec}: {path.name} holds a {type(obj).__name__}, not the "
                        f"dict of a CIFAR batch")
    return {k.decode("latin1") if isinstance(k, bytes) else str(k): v for k, v in obj.items()}


def read_cifar_batch(path: Path, num_classes: int, spec: str) -> tuple[np.ndarray, np.ndarray]:
    """(N x 3 x 32 x 32 uint8 images, N labels) of one batch file, checked."""
    batch = load_pickle_dict(path, spec)
    if "data" not in batch or "labels" not in batch:
        raise UserError(f"--data {spec}: {path.name} has no 'data' and 'labels' entries "
                        f"(found {', '.join(batch) or 'none'})")
    data = np.asarray(batch["data"])
    labels = np.asarray(batch["labels"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise UserError(f"--data {spec}: {path.name} data must be N x 3072 uint8 "
                        f"(got {data.dtype} {data.shape})")
    if labels.ndim != 1 or len(labels) != len(data) or labels.dtype.kind not in "iu":
        raise UserError(f"--data {spec}: {path.name} has {len(data)} images but labels of "
                        f"shape {labels.shape} ({labels.dtype})")
    index_labels(labels, num_classes, spec, path.name)
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


@register("cifar10")
def cifar10(argument: str, options: DataOptions) -> DataBundle:
    """``cifar10:DIR``: ``data_batch_1`` ... ``data_batch_5`` for training, ``test_batch``
    for validation (a seeded share of training data without it), ``batches.meta`` for the
    class names. DIR may also be the folder that contains ``cifar-10-batches-py``."""
    spec = f"cifar10:{argument}"
    root, _ = path_and_options(argument, {}, spec, what="directory")
    if not (root / "data_batch_1").exists() and (root / "cifar-10-batches-py").is_dir():
        root = root / "cifar-10-batches-py"
    batch_files = sorted(root.glob("data_batch_*"), key=lambda p: p.name)
    if not batch_files:
        raise UserError(f"--data {spec}: no data_batch_1 ... data_batch_5 in {root} (the "
                        f"'python version' of CIFAR-10)")
    class_names = [str(i) for i in range(10)]
    if (root / "batches.meta").exists():
        meta = load_pickle_dict(root / "batches.meta", spec)
        names = meta.get("label_names")
        if not isinstance(names, (list, tuple)) or len(names) < 2:
            raise UserError(f"--data {spec}: batches.meta has no list of label_names")
        class_names = [n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n)
                       for n in names]
    num_classes = len(class_names)
    parts = [read_cifar_batch(p, num_classes, spec) for p in batch_files]
    x = torch.from_numpy(np.concatenate([p[0] for p in parts]))  # uint8 until the device
    y = torch.from_numpy(np.concatenate([p[1] for p in parts]))
    if len(torch.unique(y)) < 2:
        raise UserError(f"--data {spec}: needs at least two classes, found "
                        f"{len(torch.unique(y))} in the training batches")
    x_val = y_val = None
    if (root / "test_batch").exists():
        test_x, test_y = read_cifar_batch(root / "test_batch", num_classes, spec)
        x_val = torch.from_numpy(np.ascontiguousarray(test_x))
        y_val = torch.from_numpy(test_y)
    return image_bundle(x, y, x_val, y_val, num_classes=num_classes, class_names=class_names,
                        options=options)
