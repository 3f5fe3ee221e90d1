"""A task's metrics: each by the name records carry and its direction, the primary first."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """A metric by the name records carry (``val_<key>``) and its direction."""

    key: str                 # "acc" -> val_acc in metrics.jsonl, val/acc in TensorBoard
    label: str               # "accuracy", for people
    higher_is_better: bool
    percent: bool = False    # shown x100 with a % sign (accuracy), else as a plain number

    def format(self, value: float | None) -> str:
        """The value as reports show it (``97.50 %``, ``3.214``)."""
        if value is None:
            return "-"
        return f"{value * 100:.2f} %" if self.percent else f"{value:.4g}"


class Metrics(tuple[Metric, ...]):
    """Every metric a task reports, the primary one first (``Metrics(Metric(..), ..)``)."""

    def __new__(cls, *metrics: Metric) -> Metrics:
        return super().__new__(cls, metrics)

    @property
    def primary(self) -> Metric:
        """The metric that ``compare`` judges and summaries show first."""
        return self[0]

    def get(self, key: str) -> Metric:
        """The metric called ``key``."""
        for metric in self:
            if metric.key == key:
                return metric
        raise KeyError(key)


__all__ = ["Metric", "Metrics"]
