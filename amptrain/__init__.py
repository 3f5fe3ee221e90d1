"""amptrain: fast, safe and measurable mixed-precision training for PyTorch."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from .errors import AmptrainWarning  # noqa: E402  (torch-free)

if TYPE_CHECKING:
    from .precision import Precision
    from .trainer import EvalResult, FitResult, Trainer

# The public classes are imported on first use (PEP 562), not with the package: the
# command line imports amptrain.cli, and `amptrain --help` must not wait for torch.
_LAZY = {"Precision": "precision", "EvalResult": "trainer", "FitResult": "trainer",
         "Trainer": "trainer"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AmptrainWarning", "EvalResult", "FitResult", "Precision", "Trainer", "__version__"]
