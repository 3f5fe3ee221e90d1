"""Built-in datasets: a registry of factories from a spec string to train/val data.

A spec is ``name`` or ``name:argument`` -- a path for file formats (``npz:FILE``), or
``key=value`` options for generated data (``synthetic-image:samples=4096,size=32``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from .errors import UserError


class TensorData(Dataset):
    """An in-memory dataset of aligned tensors (inputs first, labels last).

    The Trainer indexes ``tensors`` directly -- on the accelerator when the data fits --
    instead of going through a DataLoader.
    """

    def __init__(self, *tensors: torch.Tensor) -> None:
        if not tensors or any(len(t) != len(tensors[0]) for t in tensors):
            raise ValueError("TensorData needs tensors of equal length")
        self.tensors = tuple(tensors)

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        return tuple(t[index] for t in self.tensors)

    def to(self, device: torch.device) -> "TensorData":
        return TensorData(*(t.to(device) for t in self.tensors))

    def nbytes(self) -> int:
        return sum(t.element_size() * t.numel() for t in self.tensors)


@dataclass
class DataBundle:
    """What a data factory returns: the splits and what a model needs to know about them."""

    train: Dataset
    val: Dataset | None
    num_classes: int
    input_shape: tuple[int, ...]          # one sample's input shape, e.g. (1, 8, 8) or (64,)
    kind: str                             # "image", "sequence" or "features"
    class_names: list[str] = field(default_factory=list)
    vocab_size: int | None = None         # token datasets
    name: str = ""

    def __post_init__(self) -> None:
        if not self.class_names:
            self.class_names = [str(i) for i in range(self.num_classes)]


DataFactory = Callable[[str, "DataOptions"], DataBundle]
DATASETS: dict[str, DataFactory] = {}


@dataclass
class DataOptions:
    """Options every factory may use."""

    seed: int = 0
    val_fraction: float = 0.2


def register(name: str) -> Callable[[DataFactory], DataFactory]:
    """Add a factory to :data:`DATASETS` under ``name``."""
    def decorate(factory: DataFactory) -> DataFactory:
        DATASETS[name] = factory
        return factory
    return decorate


def build_data(spec: str, options: DataOptions | None = None) -> DataBundle:
    """Build the dataset named by ``spec`` (``name`` or ``name:argument``)."""
    options = options or DataOptions()
    name, _, argument = spec.partition(":")
    factory = DATASETS.get(name)
    if factory is None:
        raise UserError(f"unknown --data {spec!r}; choose one of {', '.join(sorted(DATASETS))} "
                        f"(file formats take a path, e.g. npz:data.npz)")
    bundle = factory(argument, options)
    bundle.name = spec
    return bundle


def parse_options(argument: str, defaults: dict[str, Any], spec: str) -> dict[str, Any]:
    """Parse ``key=value,key=value`` against typed defaults; unknown keys are errors."""
    values = dict(defaults)
    for item in filter(None, argument.split(",")):
        key, eq, raw = item.partition("=")
        if not eq or key not in defaults:
            raise UserError(f"--data {spec}: unknown option {item!r}; "
                            f"options are {', '.join(f'{k}={v}' for k, v in defaults.items())}")
        try:
            values[key] = type(defaults[key])(raw)
        except ValueError:
            raise UserError(f"--data {spec}: {key} must be a {type(defaults[key]).__name__} "
                            f"(got {raw!r})") from None
    return values


def split(x: torch.Tensor, y: torch.Tensor, val_fraction: float, seed: int
          ) -> tuple[TensorData, TensorData]:
    """A seeded, stratification-free train/validation split of aligned tensors."""
    n = len(y)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val = max(1, int(round(n * val_fraction)))
    val, train = order[:n_val], order[n_val:]
    return TensorData(x[train], y[train]), TensorData(x[val], y[val])


@register("digits")
def digits(argument: str, options: DataOptions) -> DataBundle:
    """sklearn's bundled 8x8 handwritten digits (1797 images), scaled to [0, 1]."""
    from sklearn.datasets import load_digits

    raw = load_digits()
    x = torch.tensor(raw.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = (x - 0.3) / 0.4  # roughly zero mean, unit variance
    y = torch.tensor(raw.target, dtype=torch.long)
    # The split seed is fixed so that every run, whatever --seed, validates on the same set.
    train, val = split(x, y, options.val_fraction, seed=1234)
    return DataBundle(train, val, 10, (1, 8, 8), "image")


@register("synthetic-image")
def synthetic_image(argument: str, options: DataOptions) -> DataBundle:
    """Learnable random images: each class is a fixed random pattern plus noise."""
    spec = f"synthetic-image:{argument}"
    o = parse_options(argument, {"samples": 2048, "size": 32, "channels": 3, "classes": 10,
                                 "noise": 1.0}, spec)
    g = torch.Generator().manual_seed(options.seed + 17)
    prototypes = torch.randn(o["classes"], o["channels"], o["size"], o["size"], generator=g)
    y = torch.randint(0, o["classes"], (o["samples"],), generator=g)
    x = prototypes[y] + o["noise"] * torch.randn(o["samples"], o["channels"], o["size"],
                                                 o["size"], generator=g)
    train, val = split(x, y, options.val_fraction, seed=1234)
    return DataBundle(train, val, o["classes"], (o["channels"], o["size"], o["size"]), "image")


@register("synthetic-seq")
def synthetic_seq(argument: str, options: DataOptions) -> DataBundle:
    """Learnable token sequences: the class decides which tokens are over-represented."""
    spec = f"synthetic-seq:{argument}"
    o = parse_options(argument, {"samples": 2048, "length": 64, "vocab": 1000, "classes": 4,
                                 "signal": 0.3}, spec)
    g = torch.Generator().manual_seed(options.seed + 29)
    y = torch.randint(0, o["classes"], (o["samples"],), generator=g)
    tokens = torch.randint(1, o["vocab"], (o["samples"], o["length"]), generator=g)
    # Each class owns a band of the vocabulary; a share of positions draw from that band.
    band = max(1, (o["vocab"] - 1) // o["classes"])
    marked = torch.rand(o["samples"], o["length"], generator=g) < o["signal"]
    class_tokens = 1 + y[:, None] * band + torch.randint(0, band, tokens.shape, generator=g)
    x = torch.where(marked, class_tokens, tokens)
    train, val = split(x, y, options.val_fraction, seed=1234)
    return DataBundle(train, val, o["classes"], (o["length"],), "sequence",
                      vocab_size=o["vocab"])


def labels_to_classes(labels: Sequence[Any], spec: str) -> tuple[torch.Tensor, list[str]]:
    """Map arbitrary labels to 0..C-1 (sorted), returning the class names."""
    names = sorted({str(v) for v in labels}, key=lambda s: (len(s), s) if s.isdigit() else (1e9, s))
    if len(names) < 2:
        raise UserError(f"--data {spec}: needs at least two classes, found {len(names)}")
    index = {n: i for i, n in enumerate(names)}
    return torch.tensor([index[str(v)] for v in labels], dtype=torch.long), names


@register("npz")
def npz(argument: str, options: DataOptions) -> DataBundle:
    """``npz:FILE`` with arrays ``x`` (samples first) and ``y`` (labels); optional
    ``x_val``/``y_val`` give the validation split."""
    from pathlib import Path

    spec = f"npz:{argument}"
    path = Path(argument)
    if not argument or not path.is_file():
        raise UserError(f"--data {spec}: no such file")
    try:
        with np.load(path, allow_pickle=False) as arrays:
            data = {k: arrays[k] for k in arrays.files}
    except Exception as exc:  # zipfile.BadZipFile, ValueError, OSError ...
        raise UserError(f"--data {spec}: not a readable .npz file ({type(exc).__name__})") from None
    if "x" not in data or "y" not in data:
        raise UserError(f"--data {spec}: needs arrays named x and y (found "
                        f"{', '.join(data) or 'none'})")
    x, y = data["x"], data["y"]
    if len(x) != len(y) or len(x) < 2:
        raise UserError(f"--data {spec}: x has {len(x)} rows but y has {len(y)}")
    labels, names = labels_to_classes(list(y) + list(data.get("y_val", [])), spec)
    xt = torch.as_tensor(np.asarray(x, dtype=np.float32))
    if "x_val" in data and "y_val" in data:
        n = len(y)
        train = TensorData(xt, labels[:n])
        val = TensorData(torch.as_tensor(np.asarray(data["x_val"], dtype=np.float32)), labels[n:])
    else:
        train, val = split(xt, labels, options.val_fraction, seed=1234)
    shape = tuple(xt.shape[1:])
    kind = "image" if len(shape) == 3 else "features"
    return DataBundle(train, val, len(names), shape, kind, class_names=names)
