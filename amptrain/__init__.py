"""amptrain: fast, safe and measurable mixed-precision training for PyTorch."""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import AmptrainWarning  # noqa: E402
from .precision import Precision  # noqa: E402
from .trainer import EvalResult, FitResult, Trainer  # noqa: E402

__all__ = ["AmptrainWarning", "EvalResult", "FitResult", "Precision", "Trainer", "__version__"]
