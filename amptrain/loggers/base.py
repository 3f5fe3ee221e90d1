"""The interface every tracker implements."""
from __future__ import annotations

from typing import Any


class Sink:
    """Receives each metrics record (plain numbers, inf/NaN already turned into None).

    A record has ``step`` and, for training records, ``epoch``, ``loss``, ``lr``... or,
    for evaluations, ``val_*`` metrics. Sinks skip what they cannot store.
    """

    name = "sink"

    def log(self, record: dict[str, Any]) -> None:
        raise NotImplementedError

    def images(self, step: int, images: dict[str, Any]) -> None:
        """Image grids of an evaluation (``name`` -> ``H x W x C`` uint8 array, C 1 or 3);
        trackers without images ignore them."""

    def close(self) -> None:
        """Flush and release files (called once, at the end of the run)."""


def numbers(record: dict[str, Any]) -> dict[str, float]:
    """The record's numeric fields except ``step`` (bools and None left out)."""
    return {k: float(v) for k, v in record.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
