"""amptrain: fast, safe and measurable mixed-precision training for PyTorch."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .common.errors import AmptrainWarning
from .common.lazy import lazy_exports
from .version import __version__

if TYPE_CHECKING:
    from .audit.library import audit
    from .diagnose.library import diagnose_model
    from .precision import Precision
    from .trainer import EvalResult, FitResult, Trainer

# The public classes are imported on first use (PEP 562), not with the package: the
# command line imports amptrain.cli, and `amptrain --help` must not wait for torch.
_LAZY = {"audit": "audit.library", "Precision": "precision", "diagnose_model": "diagnose.library",
         "EvalResult": "trainer", "FitResult": "trainer", "Trainer": "trainer"}


__getattr__ = lazy_exports(__name__, {name: f".{module}" for name, module in _LAZY.items()})


__all__ = ["AmptrainWarning", "EvalResult", "FitResult", "Precision", "Trainer", "__version__",
           "audit", "diagnose_model"]
