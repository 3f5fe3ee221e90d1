"""The audit of a training loop for the traps of mixed precision (issue 44, item 3).

``with amptrain.audit() as report:`` around any loop; ``amptrain audit -- python train.py``
for a script (see :mod:`amptrain.audit.launch`); ``amptrain audit RUN_DIR`` for an amptrain
run (see :mod:`amptrain.audit.rundir`). docs/audit.md lists the kinds of finding.
"""
from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .findings import AuditReport, Finding
from .losses import LossTraps
from .observer import Observer, Trap
from .scaling import ScalerTraps
from .weights import WeightTraps

#: Every kind an audit of a loop can report, in the order docs/audit.md lists them.
KINDS = ("half-optimizer-state", "update-below-ulp", "scaler-with-bf16", "half-ema", "half-loss",
         "clip-before-unscale", "scheduler-on-skipped-step", "checkpoint-without-scaler",
         "fp16-without-scaler")


def make_observer(steps: int | None = None, on_limit: Callable[[], None] | None = None) -> Observer:
    """An :class:`Observer` with every trap, not yet installed."""
    traps: list[Trap] = [WeightTraps(), ScalerTraps(), LossTraps()]
    return Observer(traps, steps=steps, on_limit=on_limit)


@contextmanager
def audit() -> Iterator[AuditReport]:
    """Observe the loop in the ``with`` block; the report's findings are filled in when it
    ends (also when it raises). Nothing the loop computes changes.

    >>> with amptrain.audit() as report:        # doctest: +SKIP
    ...     train()
    >>> print(report.format())                  # doctest: +SKIP
    """
    watching = make_observer().install()
    try:
        yield watching.report
    finally:
        watching.close()


class _CallableModule(types.ModuleType):
    """This package, callable as :func:`audit`: ``amptrain.audit`` names both the package
    and the function (importing the package sets the attribute to it), and
    ``with amptrain.audit() as report:`` must work either way."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return audit(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["KINDS", "AuditReport", "Finding", "audit", "make_observer"]
