"""The audit of a training loop for the traps of mixed precision (issue 44, item 3).

``with amptrain.audit() as report:`` around any loop (:mod:`.library`); ``amptrain audit --
python train.py`` for a script (:mod:`.launch`); ``amptrain audit RUN_DIR`` for an amptrain
run (:mod:`.rundir`). docs/audit.md describes each kind of finding.

The package imports torch only when the observer is used: the command's parent process
(which only launches the script and reads its findings) stays light.
"""
from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from ..common.lazy import lazy_exports
from .findings import AuditReport, Finding

if TYPE_CHECKING:
    from .library import audit, make_observer

#: Every kind an audit of a loop can report, in the order docs/audit.md lists them.
KINDS = ("half-optimizer-state", "update-below-ulp", "scaler-with-bf16", "half-ema", "half-loss",
         "clip-before-unscale", "scheduler-on-skipped-step", "checkpoint-without-scaler",
         "fp16-without-scaler")

__getattr__ = lazy_exports(__name__, {"audit": ".library", "make_observer": ".library"})


class _CallableModule(types.ModuleType):
    """This package, callable as :func:`~amptrain.audit.library.audit`: ``amptrain.audit``
    names both the package and the function (importing the package sets the attribute to
    it), and ``with amptrain.audit() as report:`` must work either way."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from .library import audit  # deferred: torch
        return audit(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["KINDS", "AuditReport", "Finding", "audit", "make_observer"]
