"""The training loop (:class:`Trainer`): :mod:`.core` runs it, :mod:`.checkpointing` saves
and restores its state, :mod:`.reporting` tells what happened, :mod:`.result` is what
``fit`` returns."""
from ..reproducibility import seed_everything
from ..steps import LossFn, forward_batch, split_outputs
from ..tasks import EvalResult
from .core import Trainer
from .data import DEVICE_DATA_LIMIT_BYTES
from .result import FitResult

__all__ = ["DEVICE_DATA_LIMIT_BYTES", "EvalResult", "FitResult", "LossFn", "Trainer",
           "forward_batch", "seed_everything", "split_outputs"]
