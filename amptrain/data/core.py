"""The data registry and what every loader shares: in-memory tensors, the bundle a
factory returns, spec parsing, the seeded split, label mapping and normalisation.

A spec is ``name`` or ``name:argument``. Generated data takes ``key=value`` options
(``synthetic-image:samples=4096,size=32``); file formats take a path, optionally
followed by options (``imagefolder:photos,size=64``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from ..common.errors import UserError
from ..common.registry import Registry
from ..common.pathkind import special_kind
from .augment import DeviceImages
from .gym_options import GymOptions
from .image_options import ImageOptions
from .text_options import TextOptions

#: Seed of the train/validation split of sources that have none. Fixed (not --seed) so
#: that every run, and ``amptrain eval`` later, validates on exactly the same samples.
SPLIT_SEED = 1234


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


class TextEncoder(Protocol):
    """A model's own tokenizer, as ``csv-text`` uses it (``amptrain.models.hf.HFTextEncoder``)."""

    #: What the run records in its fitted preprocessing (e.g. ``hf:models/bert``).
    name: str
    vocab_size: int
    pad_id: int
    #: The longest sequence the model takes (its position embeddings), or None.
    max_len: int | None

    def encode(self, texts: Sequence[str], max_len: int) -> list[list[int]]:
        """Token ids of each text, special tokens included, truncated to ``max_len``."""
        ...


@dataclass
class DataBundle:
    """What a data factory returns: the splits and what a model needs to know about them."""

    train: Dataset
    val: Dataset | None
    num_classes: int
    input_shape: tuple[int, ...]          # one sample's input shape, e.g. (1, 8, 8) or (64,)
    kind: str                             # "image", "sequence", "features" or "tokens"
    #                                       (next-token blocks, for the "lm" task)
    class_names: list[str] = field(default_factory=list)
    vocab_size: int | None = None         # token datasets (token 0 is padding)
    name: str = ""
    #: Preprocessing learnt from the training split (normalisation statistics,
    #: vocabulary, class names). Stored with a run so that other data given to
    #: ``amptrain eval`` is preprocessed the same way (see :attr:`DataOptions.fitted`).
    fitted: dict[str, Any] = field(default_factory=dict)
    #: What the data is for, when it knows ("lm" for text corpora, "regression" for float
    #: targets); ``--task auto`` follows it. None: the data holds class labels (the task is
    #: decided in tasks/: ``amptrain.tasks.data_task``), named "0".."C-1" unless given.
    task: str | None = None

    def __post_init__(self) -> None:
        if not self.class_names and self.task is None:
            self.class_names = [str(i) for i in range(self.num_classes)]


@dataclass
class DataOptions:
    """What a factory is given: the options every source may use, and each source's own
    section, declared beside that source (:mod:`.text_options`, :mod:`.image_options`,
    :mod:`.gym_options`); the run fills them from its config's sections of the same
    names."""

    #: The run's --seed. Built-in loaders do not use it: their content and split depend
    #: on the spec alone, so ``eval`` rebuilds the same validation set. User factories may.
    seed: int = 0
    val_fraction: float = 0.2
    #: A training run's :attr:`DataBundle.fitted`: reuse it instead of fitting anew.
    fitted: dict[str, Any] | None = None
    #: A model's own tokenizer (a :class:`TextEncoder`) for text
    #: data; the runner sets it for models that bring one (``hf:PATH``) or from
    #: ``--tokenizer hf:DIR``.
    text_encoder: TextEncoder | None = None
    #: The run's --task: loaders whose files can hold either (npz) follow it.
    task: str | None = None
    #: ``text:`` and ``tokens:`` data: tokens per block (--seq-len) and which files of a
    #: directory are read (--text-glob).
    text: TextOptions = field(default_factory=TextOptions)
    #: Image data finished on the device: --augment (see data/augment.py).
    images: ImageOptions = field(default_factory=ImageOptions)
    #: ``gym:`` environments: environments per process (--num-envs), steps per environment
    #: in a rollout (--rollout-steps), sync or async vector environments (--vector-env) and
    #: evaluation episodes (--eval-episodes); None: the recipe's defaults (data/gym.py).
    gym: GymOptions = field(default_factory=GymOptions)


DataFactory = Callable[[str, DataOptions], DataBundle]
#: The built-in sources, one module each (they register themselves when imported); the
#: registry imports them on its first read, so ``amptrain.data`` imports no torch.
BUILT_IN_SOURCES = ("arrays", "corpus", "folders", "generated", "gym", "images", "module",
                    "text", "tokens")
DATASETS: Registry[DataFactory] = Registry(
    "--data", builtins=tuple(f"{__package__}.{name}" for name in BUILT_IN_SOURCES))
#: ``@register("name")``: add a factory to :data:`DATASETS`.
register = DATASETS.register


def build_data(spec: str, options: DataOptions | None = None) -> DataBundle:
    """Build the dataset named by ``spec`` (``name`` or ``name:argument``)."""
    options = options or DataOptions()
    factory, argument = DATASETS.lookup(spec, hint=" (file formats take a path, e.g. "
                                                   "npz:data.npz)")
    bundle = factory(argument, options)
    bundle.name = spec
    return bundle


# ------------------------------------------------------------------ spec parsing
_A_TYPE = {int: "an integer", float: "a number", str: "a string"}


def parse_options(argument: str, defaults: dict[str, Any], spec: str) -> dict[str, Any]:
    """Parse ``key=value,key=value`` against typed defaults; unknown keys are errors."""
    values = dict(defaults)
    for item in filter(None, argument.split(",")):
        key, eq, raw = item.partition("=")
        if not eq or key not in defaults:
            listed = ", ".join(f"{k}={v}" for k, v in defaults.items()) or "none"
            raise UserError(f"--data {spec}: unknown option {item!r}; options are {listed}")
        try:
            values[key] = type(defaults[key])(raw)
        except ValueError:
            raise UserError(f"--data {spec}: {key} must be {_A_TYPE[type(defaults[key])]} "
                            f"(got {raw!r})") from None
    return values


def require_at_least(values: dict[str, Any], spec: str, **minimums: float) -> None:
    """A UserError naming the option when a numeric option is below its minimum."""
    for key, minimum in minimums.items():
        if values[key] < minimum:
            raise UserError(f"--data {spec}: {key} must be >= {minimum} (got {values[key]})")


def path_and_options(argument: str, defaults: dict[str, Any], spec: str, *, what: str
                     ) -> tuple[Path, dict[str, Any]]:
    """Split ``PATH[,key=value...]``; the path must exist (``what`` is "file" or "directory").

    An argument that is itself an existing path is taken whole, so only paths that
    contain a comma *and* need options cannot be written.
    """
    if argument and Path(argument).exists():
        raw_path, option_text = argument, ""
    else:
        raw_path, _, option_text = argument.partition(",")
    path = Path(raw_path)
    if not raw_path:
        raise UserError(f"--data {spec}: give a {what} path, e.g. --data {spec.split(':')[0]}:PATH")
    is_right_kind = path.is_dir() if what == "directory" else path.is_file()
    if not is_right_kind:
        special = special_kind(path)
        problem = f"{special}, not a {what}:" if special else \
            f"not a {what}" if path.exists() else f"no such {what}"
        raise UserError(f"--data {spec}: {problem} {raw_path!r}")
    return path, parse_options(option_text, defaults, spec)


# ------------------------------------------------------------------ splits, labels
def split(x: torch.Tensor, y: torch.Tensor, val_fraction: float, seed: int = SPLIT_SEED
          ) -> tuple[TensorData, TensorData]:
    """A seeded, stratification-free train/validation split of aligned tensors."""
    train, val = split_indices(len(y), val_fraction, seed)
    return TensorData(x[train], y[train]), TensorData(x[val], y[val])


def split_indices(n: int, val_fraction: float, seed: int = SPLIT_SEED
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, val) index tensors of a seeded permutation; both non-empty when n >= 2."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val = min(max(1, int(round(n * val_fraction))), max(n - 1, 1))
    return order[n_val:], order[:n_val]


def _label_key(name: str) -> tuple[int, float, str]:
    """Numbers sort numerically ("2" before "10"), then everything else alphabetically."""
    try:
        number = float(name)
    except ValueError:
        return (1, 0.0, name)
    return (0, number, name) if math.isfinite(number) else (1, 0.0, name)


def label_name(value: Any) -> str:
    """A label's class name: integral numbers lose their ``.0`` (numpy floats from files)."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value.item() if isinstance(value, np.generic) else value)


def labels_to_classes(labels: Sequence[Any], spec: str, known: Sequence[str] | None = None
                      ) -> tuple[torch.Tensor, list[str]]:
    """Map arbitrary labels to 0..C-1, returning the class names.

    Classes are sorted (numbers numerically). With ``known`` (a training run's class
    names) the mapping is that one, and a label outside it is an error.
    """
    _check_class_labels(labels, spec)
    names_of = [label_name(v) for v in labels]
    if known:
        names = list(known)
        index = {n: i for i, n in enumerate(names)}
        unknown = sorted({n for n in names_of if n not in index})
        if unknown:
            raise UserError(f"--data {spec}: label {unknown[0]!r} is not one of the "
                            f"{len(names)} classes the model was trained on")
    else:
        names = sorted(set(names_of), key=_label_key)
        if len(names) < 2:
            raise UserError(f"--data {spec}: needs at least two classes, found {len(names)}")
        index = {n: i for i, n in enumerate(names)}
    return torch.tensor([index[n] for n in names_of], dtype=torch.long), names


def _check_class_labels(labels: Sequence[Any], spec: str) -> None:
    """Class labels may be numbers or names, but not NaN and not measurements.

    A float label that is not a whole number (0.126) is a regression target, and a NaN
    would otherwise become a class named "nan".
    """
    for row, value in enumerate(labels):
        if isinstance(value, (float, np.floating)):
            if not math.isfinite(value):
                raise UserError(f"--data {spec}: label of row {row} is {value}; every sample "
                                f"needs a class label")
            if not float(value).is_integer():
                raise UserError(f"--data {spec}: labels are not whole numbers (row {row}: "
                                f"{value:g}); a classifier needs class labels, not "
                                f"measurements")


def index_labels(labels: np.ndarray, num_classes: int, spec: str, source: str) -> torch.Tensor:
    """Integer class indices from a file, checked to lie in ``0..num_classes-1``."""
    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise UserError(f"--data {spec}: {source} has label {int(labels.max())}, outside "
                        f"0..{num_classes - 1}")
    return torch.as_tensor(labels.astype(np.int64))


# ------------------------------------------------------------------ normalisation
def normalise(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """(x - mean) / std per channel of an N x C x H x W float tensor (in place)."""
    if len(mean) != x.shape[1]:
        raise UserError(f"the data has {x.shape[1]} channels but the run was trained on "
                        f"{len(mean)}; check --data")
    m = torch.tensor(mean, dtype=x.dtype).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype).view(1, -1, 1, 1)
    return x.sub_(m).div_(s)


class ImageTensors(TensorData):
    """uint8 images ``N x C x H x W`` and labels in memory (4x smaller than float32);
    :attr:`on_device` standardises (and, when training, augments) each batch on the
    device (see :mod:`amptrain.data.augment`)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, *, on_device: Any) -> None:
        super().__init__(images, labels)
        self.on_device = on_device

    def to(self, device: torch.device) -> "ImageTensors":
        return ImageTensors(*(t.to(device) for t in self.tensors), on_device=self.on_device)


def uint8_channel_stats(x: torch.Tensor, chunk: int = 4096) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of uint8 images scaled to [0, 1], without a float copy of
    the whole set (sums in float64, a chunk at a time)."""
    channels = x.shape[1]
    total = torch.zeros(channels, dtype=torch.float64)
    squares = torch.zeros(channels, dtype=torch.float64)
    for start in range(0, len(x), chunk):
        part = x[start:start + chunk].transpose(0, 1).reshape(channels, -1).double() / 255.0
        total += part.sum(dim=1)
        squares += (part * part).sum(dim=1)
    n = x.numel() // channels
    mean = total / n
    var = (squares - n * mean * mean) / max(n - 1, 1)
    return mean.tolist(), var.clamp(min=0).sqrt().clamp(min=1e-6).tolist()


def image_bundle(x_train: torch.Tensor, y_train: torch.Tensor,
                 x_val: torch.Tensor | None, y_val: torch.Tensor | None, *,
                 num_classes: int, class_names: list[str], options: DataOptions,
                 fitted: dict[str, Any] | None = None) -> DataBundle:
    """Split (when there is no validation set) and bundle N x C x H x W uint8 images, kept
    uint8 until the device, where they are standardised with the training split's
    per-channel statistics (and augmented with ``options.images.augment`` when training)."""

    if x_val is None or y_val is None:
        train_idx, val_idx = split_indices(len(y_train), options.val_fraction)
        x_train, y_train, x_val, y_val = (x_train[train_idx], y_train[train_idx],
                                          x_train[val_idx], y_train[val_idx])
    if options.fitted and "mean" in options.fitted and "std" in options.fitted:
        mean, std = list(options.fitted["mean"]), list(options.fitted["std"])
        if len(mean) != x_train.shape[1]:
            raise UserError(f"the data has {x_train.shape[1]} channels but the run was "
                            f"trained on {len(mean)}; check --data")
    else:
        mean, std = uint8_channel_stats(x_train)
    train = ImageTensors(x_train, y_train,
                         on_device=DeviceImages(mean, std, options.images.augment))
    val = ImageTensors(x_val, y_val, on_device=DeviceImages(mean, std))
    return DataBundle(train, val, num_classes, tuple(x_train.shape[1:]), "image",
                      class_names=class_names,
                      fitted={"mean": mean, "std": std, **(fitted or {})})
