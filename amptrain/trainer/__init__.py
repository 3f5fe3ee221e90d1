"""The training loop (:class:`Trainer`): :mod:`.core` runs it, :mod:`.checkpointing` saves
and restores its state, :mod:`.reporting` tells what happened, :mod:`.result` is what
``fit`` returns. The face is lazy (:mod:`amptrain.lazy`): the torch-free helpers beside
the loop (:mod:`.outdir`, :mod:`.preemption`) are imported by commands at start-up."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from ..forward import LossFn, forward_batch, split_outputs
    from ..reproducibility import seed_everything
    from ..tasks import EvalResult
    from .core import Trainer
    from .data import DEVICE_DATA_LIMIT_BYTES
    from .result import FitResult

__getattr__ = lazy_exports(__name__, {
    "DEVICE_DATA_LIMIT_BYTES": ".data", "EvalResult": "..tasks", "FitResult": ".result",
    "LossFn": "..forward", "Trainer": ".core", "forward_batch": "..forward",
    "seed_everything": "..reproducibility", "split_outputs": "..forward"})

__all__ = ["DEVICE_DATA_LIMIT_BYTES", "EvalResult", "FitResult", "LossFn", "Trainer",
           "forward_batch", "seed_everything", "split_outputs"]
