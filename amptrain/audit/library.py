"""The library form: ``with amptrain.audit() as report:`` around any loop."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .findings import AuditReport
from .losses import LossTraps
from .observer import Observer, Trap
from .scaling import ScalerTraps
from .weights import WeightTraps


def make_observer(steps: int | None = None, on_limit: Callable[[], None] | None = None) -> Observer:
    """An :class:`~amptrain.audit.observer.Observer` with every trap, not yet installed."""
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
