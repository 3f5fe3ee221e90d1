"""amptrain/data/images.py: ``idx:DIR`` (MNIST-style IDX files) and ``cifar10:DIR``
(the CIFAR-10 python pickle batches)."""
from __future__ import annotations

import gzip
import os
import pickle
import struct

import numpy as np
import pytest
import torch

from amptrain.data import DataOptions, build_data
from tests.data.conftest import assert_data_error


# ------------------------------------------------------------------------- IDX
def write_idx(path, array: np.ndarray, compress: bool = False, magic: int | None = None) -> None:
    magic = magic if magic is not None else 0x0800 | array.ndim
    raw = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) \
        + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)


def mnist_like(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 6, 5), dtype=np.uint8), rng.integers(0, 10, n).astype(np.uint8)


def write_mnist(root, compress: bool, test: bool = True) -> None:
    root.mkdir(exist_ok=True)
    suffix = ".gz" if compress else ""
    splits = [("train", 40, 0)] + ([("t10k", 12, 1)] if test else [])
    for name, n, seed in splits:
        images, labels = mnist_like(n, seed)
        write_idx(root / f"{name}-images-idx3-ubyte{suffix}", images, compress)
        write_idx(root / f"{name}-labels-idx1-ubyte{suffix}", labels, compress)


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_idx_reads_mnist_files(tmp_path, compress):
    write_mnist(tmp_path / "mnist", compress)
    data = build_data(f"idx:{tmp_path / 'mnist'}")
    images, labels = mnist_like(40, 0)
    _test_images, test_labels = mnist_like(12, 1)
    assert data.kind == "image" and data.input_shape == (1, 6, 5)
    assert data.num_classes == 10 and len(data.train) == 40 and len(data.val) == 12
    assert torch.equal(data.train.tensors[1], torch.as_tensor(labels, dtype=torch.long))
    assert torch.equal(data.val.tensors[1], torch.as_tensor(test_labels, dtype=torch.long))
    assert data.train.tensors[0].dtype == torch.uint8  # uint8 until the device
    x = _standardised(data.train)
    assert abs(x.mean().item()) < 1e-4 and abs(x.std().item() - 1) < 1e-2  # standardised
    # Same pixel order as the file: the standardisation is monotonic per image.
    first = x[0, 0].flatten()
    assert torch.equal(first.argsort(stable=True),
                       torch.as_tensor(images[0].flatten().astype(np.float32)).argsort(stable=True))
    assert data.fitted["mean"] and data.fitted["std"]


def test_idx_without_test_files_splits_the_training_files(tmp_path):
    write_mnist(tmp_path / "m", compress=False, test=False)
    data = build_data(f"idx:{tmp_path / 'm'}", DataOptions(val_fraction=0.25))
    assert len(data.train) == 30 and len(data.val) == 10


def test_idx_malformed_files(tmp_path):
    root = tmp_path / "m"
    write_mnist(root, compress=False)
    images = root / "train-images-idx3-ubyte"
    labels = root / "train-labels-idx1-ubyte"
    good_images, good_labels = images.read_bytes(), labels.read_bytes()

    images.write_bytes(good_labels)  # a label file where images belong
    assert_data_error(f"idx:{root}", r"magic number 0x00000801, expected 0x00000803")
    images.write_bytes(b"\x12\x34\x56\x78" + good_images[4:])
    assert_data_error(f"idx:{root}", "magic number 0x12345678")
    images.write_bytes(good_images[:-7])
    assert_data_error(f"idx:{root}", "train-images-idx3-ubyte is truncated")
    images.write_bytes(good_images[:10])
    assert_data_error(f"idx:{root}", "truncated")
    images.write_bytes(good_images + b"\0")
    assert_data_error(f"idx:{root}", "trailing bytes")
    images.write_bytes(gzip.compress(good_images)[:-20])  # truncated gzip
    assert_data_error(f"idx:{root}", "corrupt or truncated gzip")
    images.write_bytes(good_images)

    write_idx(labels, np.zeros(39, dtype=np.uint8))
    assert_data_error(f"idx:{root}", "40 images but train-labels-idx1-ubyte has 39 labels")
    write_idx(labels, np.full(40, 3, dtype=np.uint8))
    assert_data_error(f"idx:{root}", "at least two classes")
    labels.unlink()
    assert_data_error(f"idx:{root}", "train-labels-idx1-ubyte.* is missing")
    assert_data_error(f"idx:{tmp_path / 'nowhere'}", "no such directory")
    assert_data_error(f"idx:{images}", "not a directory")
    assert_data_error("idx:", "give a directory path")
    (tmp_path / "empty").mkdir()
    assert_data_error(f"idx:{tmp_path / 'empty'}", "no train-images-idx3-ubyte")


# --------------------------------------------------------------------- CIFAR-10
CIFAR_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
               "truck"]


def _standardised(data):
    """The images as the model sees them: standardised on the device (not augmented)."""
    return data.on_device(data.tensors, training=False, key=(0,))[0]


def cifar_batch(n: int, seed: int, bytes_keys: bool = True) -> dict:
    rng = np.random.default_rng(seed)
    batch = {"batch_label": "training batch",
             "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
             "labels": [int(v) for v in rng.integers(0, 10, n)], "filenames": ["x.png"] * n}
    return {k.encode(): v for k, v in batch.items()} if bytes_keys else batch


def write_cifar(root, batches: int = 2, test: bool = True, bytes_keys: bool = True) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(1, batches + 1):
        batch = cifar_batch(10, i, bytes_keys)
        (root / f"data_batch_{i}").write_bytes(pickle.dumps(batch, protocol=2))
    if test:
        (root / "test_batch").write_bytes(pickle.dumps(cifar_batch(6, 99, bytes_keys), protocol=2))
    meta = {b"label_names": [n.encode() for n in CIFAR_NAMES], b"num_cases_per_batch": 10}
    (root / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))


@pytest.mark.parametrize("bytes_keys", [True, False], ids=["py2-bytes-keys", "str-keys"])
def test_cifar10_reads_pickle_batches(tmp_path, bytes_keys):
    write_cifar(tmp_path / "cifar-10-batches-py", bytes_keys=bytes_keys)
    data = build_data(f"cifar10:{tmp_path}")  # the parent folder works too
    assert data.input_shape == (3, 32, 32) and data.class_names == CIFAR_NAMES
    assert len(data.train) == 20 and len(data.val) == 6
    raw = cifar_batch(10, 1)
    assert data.train.tensors[1][:10].tolist() == raw[b"labels"]
    # Pixel (channel 0, row 0, col 1) is byte 1 of the row-major R plane.
    assert data.train.tensors[0].dtype == torch.uint8  # uint8 until the device
    x = _standardised(data.train)
    mean, std = data.fitted["mean"][0], data.fitted["std"][0]
    assert x[0, 0, 0, 1].item() * std + mean == pytest.approx(raw[b"data"][0, 1] / 255, abs=1e-5)
    assert x.transpose(0, 1).reshape(3, -1).mean(dim=1).abs().max() < 1e-4  # per channel


def test_cifar10_without_test_batch_splits(tmp_path):
    write_cifar(tmp_path, batches=3, test=False)
    data = build_data(f"cifar10:{tmp_path}", DataOptions(val_fraction=0.1))
    assert len(data.train) == 27 and len(data.val) == 3


def test_cifar10_malformed_files(tmp_path):
    write_cifar(tmp_path)
    batch = tmp_path / "data_batch_1"
    good = batch.read_bytes()

    batch.write_bytes(pickle.dumps([1, 2, 3]))
    assert_data_error(f"cifar10:{tmp_path}", "holds a list, not the dict")
    batch.write_bytes(good[: len(good) // 2])
    assert_data_error(f"cifar10:{tmp_path}", "data_batch_1 is not a readable CIFAR python pickle")
    batch.write_bytes(b"\x00garbage")
    assert_data_error(f"cifar10:{tmp_path}", "not a readable CIFAR python pickle")
    batch.write_bytes(pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}))
    assert_data_error(f"cifar10:{tmp_path}", r"data must be N x 3072 uint8")
    batch.write_bytes(pickle.dumps({b"images": 1}))
    assert_data_error(f"cifar10:{tmp_path}", "no 'data' and 'labels'")
    bad_labels = cifar_batch(4, 0)
    bad_labels[b"labels"] = [0, 1, 2, 12]
    batch.write_bytes(pickle.dumps(bad_labels))
    assert_data_error(f"cifar10:{tmp_path}", "label 12, outside 0..9")
    for f in tmp_path.glob("data_batch_*"):
        f.unlink()
    assert_data_error(f"cifar10:{tmp_path}", "no data_batch_1")


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_cifar10_pickles_cannot_run_code(tmp_path):
    write_cifar(tmp_path)
    marker = tmp_path / "pwned"
    (tmp_path / "data_batch_1").write_bytes(pickle.dumps({b"data": _Exploit(marker)}, protocol=2))
    assert_data_error(f"cifar10:{tmp_path}",
                      "refusing to load posix.mkdir|refusing to load nt.mkdir")
    assert not marker.exists()
