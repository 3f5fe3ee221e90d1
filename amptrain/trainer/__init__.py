"""The training loop (:class:`Trainer`): :mod:`.core` runs it, :mod:`.checkpointing` saves
and restores its state, :mod:`.reporting` tells what happened, :mod:`.result` is what
``fit`` returns. The face is lazy (:mod:`amptrain.common.lazy`): the torch-free helpers beside
the loop (:mod:`.outdir`, :mod:`.preemption`) are imported by commands at start-up."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..common.lazy import lazy_exports

if TYPE_CHECKING:
    from ..common.forward import LossFn, forward_batch, split_outputs
    from ..common.reproducibility import seed_everything
    from ..tasks import EvalResult
    from .core import Trainer
    from .data import DEVICE_DATA_LIMIT_BYTES
    from .result import FitResult

__getattr__ = lazy_exports(__name__, {
    "DEVICE_DATA_LIMIT_BYTES": ".data", "EvalResult": "..tasks", "FitResult": ".result",
    "LossFn": "..common.forward", "Trainer": ".core", "forward_batch": "..common.forward",
    "seed_everything": "..common.reproducibility",
    "split_outputs": "..common.forward"})

__all__ = ["DEVICE_DATA_LIMIT_BYTES", "EvalResult", "FitResult", "LossFn", "Trainer",
           "forward_batch", "seed_everything", "split_outputs"]
