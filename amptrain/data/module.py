"""``module:pkg.mod.factory``: the user's own Datasets.

The factory is called with the keywords it accepts among ``seed`` and ``val_fraction``
and returns ``(train, val)``: map-style Datasets (``val`` may be None), or an
``IterableDataset`` for training (then ``--max-steps`` is needed) -- or a ready
:class:`~amptrain.data.DataBundle`. What a built-in model needs to know is read from the
first training sample ``(x, y)``:

* ``x`` float with 3 dimensions: an image ``C x H x W``; other float: features;
  integer ids ``L``: a sequence (the dataset's ``vocab_size`` attribute is then needed);
* ``y`` a whole number: a class label. The number of classes is the dataset's
  ``classes`` (a list of names, torchvision's convention) or ``num_classes``, else the
  largest of its ``targets`` (also torchvision's) or, for up to
  :data:`SCAN_LIMIT` samples, of every label (+1);
* ``y`` float: a regression target (one value or a row of values);
* ``y`` integer ids of ``x``'s shape: next-token targets (a language model).

A dataset may also say what it is with a ``task`` attribute (``"lm"``, ``"regression"``).
Anything else is one line naming ``--data``.

Every later sample is held to the first one (:class:`CheckedSamples`): a sample that
raises, changes shape or kind, carries a label outside the classes or ids outside the
vocabulary, or a NaN/infinite value is the same one line naming ``--data`` and the
sample's index, whenever it is read -- in this process or a DataLoader worker (the check
runs where ``__getitem__`` runs, on the host, so the training step pays nothing for it).
A claimed length above :data:`MAX_SAMPLES` is refused before a sampler allocates for it.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, NoReturn, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from ..common.errors import UserError
from .core import DataBundle, DataOptions, register
from .protocol import DeviceFinish, batch_reader_of, columns_of, finish_of
from ..models.external import import_factory

#: Labels are read one by one (each a __getitem__ call) only for datasets up to this size.
SCAN_LIMIT = 20000
#: The most samples a map-style dataset may claim: a shuffled epoch holds one 8-byte index
#: per sample (2 GiB at this limit), and a mistyped ``__len__`` (10^12) would ask for
#: terabytes. Larger data is streamed: an ``IterableDataset``.
MAX_SAMPLES = 1 << 28


@register("module")
def user_data(argument: str, options: DataOptions) -> DataBundle:
    """``module:pkg.mod.factory`` -> ``(train, val)`` Datasets (val may be None)."""

    spec = f"module:{argument}"
    factory = import_factory(argument, spec, option="--data")
    result = _call(factory, options, spec)
    if isinstance(result, DataBundle):
        return result
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        what = (f"a {type(result).__name__}" if not isinstance(result, (tuple, list))
                else f"{len(result)} values")
        raise UserError(f"--data {spec}: the factory returned {what}; it must return "
                        f"(train, val): two torch Datasets, val may be None")
    train, val = result
    _check_split(train, "train", spec)
    if val is not None:
        _check_split(val, "val", spec)
    x, y = _first_sample(train, spec)
    input_shape, kind = tuple(x.shape), _kind(x)
    task = getattr(train, "task", None) or _task_of(x, y)
    vocab = getattr(train, "vocab_size", None)
    if (kind == "sequence" or task == "lm") and not vocab:
        raise UserError(f"--data {spec}: samples are token ids; give the train Dataset a "
                        f"vocab_size attribute (the number of distinct ids)")
    names: list[str] = []
    if task == "lm":
        outputs = int(vocab or 0)
        kind = "tokens"
    elif task == "regression":
        outputs = max(1, int(y.numel()))
    else:
        names = _class_names(train, spec)
        outputs = len(names)
    first = Sample(x, y, task=task, classes=len(names) or None,
                   vocab=int(vocab) if vocab else None)
    train = CheckedSamples.around(train, spec, first, "training")
    val = CheckedSamples.around(val, spec, first, "validation") if val is not None else None
    return DataBundle(train, val, outputs, input_shape, kind, class_names=names,
                      vocab_size=int(vocab) if vocab else None,
                      task=None if task == "classification" else task,
                      fitted={"class_names": names} if names else {})


def _call(factory: Any, options: DataOptions, spec: str) -> Any:
    offered = {"seed": options.seed, "val_fraction": options.val_fraction}
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        parameters = {}  # type: ignore[assignment]
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    kwargs = {k: v for k, v in offered.items() if takes_any or k in parameters}
    try:
        return factory(**kwargs)
    except UserError:
        raise
    except Exception as exc:  # the user's code: its failure is reported, not ours
        text = str(exc).strip()
        raise UserError(f"--data {spec}: the factory raised {type(exc).__name__}"
                        f"{': ' + text.splitlines()[0] if text else ''}") from None


def _check_split(data: Any, which: str, spec: str) -> None:
    if isinstance(data, IterableDataset):
        return
    if not isinstance(data, Dataset) or not hasattr(data, "__len__"):
        raise UserError(f"--data {spec}: the factory's {which} split is a "
                        f"{type(data).__name__}, not a torch Dataset with a length (or an "
                        f"IterableDataset)")
    try:
        length = len(data)
    except Exception as exc:
        raise UserError(f"--data {spec}: len() of the factory's {which} Dataset raised "
                        f"{type(exc).__name__}{_said(exc)}") from None
    if not isinstance(length, int) or length == 0:
        raise UserError(f"--data {spec}: the factory's {which} Dataset is empty")
    if length > MAX_SAMPLES:
        raise UserError(f"--data {spec}: the factory's {which} Dataset claims {length} "
                        f"samples, over the limit of {MAX_SAMPLES} for a map-style Dataset "
                        f"(a shuffled order holds 8 bytes per sample); check its __len__, "
                        f"or stream larger data as an IterableDataset")


def _said(exc: BaseException) -> str:
    """``: <the first line of the exception's message, at most 100 characters>``."""
    text = str(exc).strip()
    return f": {text.splitlines()[0][:100]}" if text else ""


def _as_tensor(value: Any, what: str, spec: str) -> torch.Tensor:
    try:
        return torch.as_tensor(np.asarray(value) if not isinstance(value, torch.Tensor)
                               else value)
    except (TypeError, ValueError, RuntimeError):
        raise UserError(f"--data {spec}: a sample's {what} is a {type(value).__name__}, not "
                        f"a tensor, array or number") from None


def _first_sample(data: Any, spec: str) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        sample = next(iter(data)) if isinstance(data, IterableDataset) else data[0]
    except StopIteration:
        raise UserError(f"--data {spec}: the factory's train IterableDataset yields "
                        f"nothing") from None
    except Exception as exc:
        raise UserError(f"--data {spec}: reading the first training sample raised "
                        f"{type(exc).__name__}: {str(exc).strip()[:100]}") from None
    if not isinstance(sample, (tuple, list)) or len(sample) != 2:
        raise UserError(f"--data {spec}: a training sample is a {type(sample).__name__}; "
                        f"amptrain reads samples as (input, target) pairs")
    return _as_tensor(sample[0], "input", spec), _as_tensor(sample[1], "target", spec)


def _kind(x: torch.Tensor) -> str:
    if not x.is_floating_point():
        return "sequence"
    return "image" if x.ndim == 3 else "features"


def _task_of(x: torch.Tensor, y: torch.Tensor) -> str:
    if y.is_floating_point() and not (y.ndim == 0 and float(y).is_integer()):
        return "regression"
    if y.ndim >= 1 and y.shape == x.shape and not x.is_floating_point():
        return "lm"
    return "classification"


def _class_names(data: Any, spec: str) -> list[str]:
    classes = getattr(data, "classes", None)
    if isinstance(classes, (list, tuple)) and len(classes) >= 2:
        return [str(c) for c in classes]
    count = getattr(data, "num_classes", None)
    if count is None:
        targets = getattr(data, "targets", None)
        if targets is not None and len(targets):
            count = int(np.max(np.asarray(targets))) + 1
        elif isinstance(data, IterableDataset) or len(data) > SCAN_LIMIT:
            raise UserError(f"--data {spec}: cannot tell how many classes there are without "
                            f"reading every sample; give the train Dataset a classes list "
                            f"(names) or a num_classes attribute")
        else:
            count = 1 + max(int(_as_tensor(data[i][1], "target", spec))
                            for i in range(len(data)))
    if int(count) < 2:
        raise UserError(f"--data {spec}: needs at least two classes, found {count}")
    return [str(i) for i in range(int(count))]


@dataclass(frozen=True)
class Sample:
    """What the first training sample says every sample is: its input's and target's
    shapes and kinds, and the range of its labels (classes) or token ids (vocab)."""

    x: torch.Tensor
    y: torch.Tensor
    task: str
    classes: int | None = None
    vocab: int | None = None

    def problem(self, x: torch.Tensor, y: torch.Tensor) -> str | None:
        """What is wrong with a sample ``(x, y)`` (None: nothing). Host-side, per sample."""
        for name, have, want in (("input", x, self.x), ("target", y, self.y)):
            if have.shape != want.shape:
                return (f"its {name} has shape {tuple(have.shape)}, but sample 0's has "
                        f"{tuple(want.shape)}")
            if have.is_floating_point() != want.is_floating_point():
                return (f"its {name} is {have.dtype}, but sample 0's is {want.dtype} "
                        f"({'floats' if want.is_floating_point() else 'whole numbers'})")
            if have.is_floating_point() and not bool(torch.isfinite(have).all()):
                return f"its {name} holds NaN or infinite values"
        if self.vocab is not None:
            for name, ids in (("input", x), ("target", y)):
                if not ids.is_floating_point() and ids.numel() and (
                        int(ids.min()) < 0 or int(ids.max()) >= self.vocab):
                    return (f"its {name} holds token ids from {int(ids.min())} to "
                            f"{int(ids.max())}, outside the vocab_size of {self.vocab}")
        elif self.classes is not None and y.ndim == 0 and not y.is_floating_point():
            label = int(y)
            if not 0 <= label < self.classes:
                return (f"its label is {label}, outside the {self.classes} classes "
                        f"(0 to {self.classes - 1})")
        return None


class CheckedSamples(Dataset):
    """The user's map-style Dataset, every sample held to the first (see the module).

    Attributes the user's object has (``classes``, ``targets``, ``vocab_size``...) are
    read through; ``dataset`` is the user's object itself. The capabilities of the dataset
    protocol it has (:mod:`amptrain.data.protocol`: ``on_device``, ``read_batch``) are
    declared on the wrapper itself, not left to attribute forwarding.
    """

    #: The user's on-device step (:class:`~amptrain.data.protocol.DeviceFinishing`).
    on_device: DeviceFinish | None = None
    #: The user's whole-batch reader (:class:`~amptrain.data.protocol.BatchReading`);
    #: set only when the user's dataset has one.
    read_batch: Callable[[Sequence[int]], Any]

    def __init__(self, dataset: Dataset, spec: str, first: Sample, which: str) -> None:
        self.dataset, self.spec, self.first, self.which = dataset, spec, first, which
        self.on_device = finish_of(dataset)
        reader = batch_reader_of(dataset)
        if reader is not None:
            self.read_batch = reader

    @classmethod
    def around(cls, data: Any, spec: str, first: Sample, which: str) -> Any:
        """``data`` checked sample by sample; streams and in-memory tensors (checked as a
        whole when ``fit`` starts, and indexed in bulk) are returned as they are."""
        if isinstance(data, IterableDataset) or columns_of(data) is not None:
            return data
        return cls(data, spec, first, which)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("dataset", "spec", "first", "which"):
            raise AttributeError(name)  # unpickling in a worker: no recursion
        return getattr(self.dataset, name)

    def __getitem__(self, index: int) -> Any:
        try:
            sample = self.dataset[index]
        except UserError:
            raise
        except Exception as exc:  # the user's code: its failure is reported, not ours
            self._refuse(index, f"reading it raised {type(exc).__name__}{_said(exc)}")
        if not isinstance(sample, (tuple, list)) or len(sample) != 2:
            self._refuse(index, f"it is a {type(sample).__name__}, not an (input, target) "
                                f"pair like sample 0")
        try:
            x, y = (v if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v))
                    for v in sample)
        except (TypeError, ValueError, RuntimeError):
            self._refuse(index, "its input or target is not a tensor, array or number")
        problem = self.first.problem(x, y)
        if problem:
            self._refuse(index, problem)
        return sample

    def _refuse(self, index: int, problem: str) -> NoReturn:
        raise UserError(f"--data {self.spec}: {self.which} sample {index} is unusable: "
                        f"{problem}")


__all__ = ["MAX_SAMPLES", "CheckedSamples", "Sample", "user_data"]
