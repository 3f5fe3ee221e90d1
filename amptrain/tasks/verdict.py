"""A task's part that tells how ``compare`` judges two precisions on its primary metric:
the unit of the difference to the baseline, the option holding the tolerance, the task's
own default tolerance and how runs over seeds are summed up (:class:`Verdict`)."""
from __future__ import annotations

from dataclasses import dataclass

from .metrics import Metric

#: The units of a difference: percentage points of a fraction, or a relative change.
UNITS = ("pp", "rel")
#: How compare sums a precision's runs over seeds up (see amptrain/compare/seeds.py).
SEED_STATISTICS = ("mean", "iqm")


@dataclass(frozen=True)
class Verdict:
    """How compare measures and judges the difference to the baseline (the default is
    classification's: percentage points of accuracy, the shared tolerance, the mean)."""

    #: "pp" (percentage points of a fraction: (value - baseline) x 100) or "rel" (the
    #: relative change); it names compare's ``delta_*`` field and its tolerance option.
    unit: str = "pp"
    #: The task's own default tolerance in that unit when its metric varies more between
    #: seeds than the shared default allows (the GAN's Fréchet distance); None: the shared
    #: one (:func:`amptrain.common.tolerance.tolerance_for`).
    default_tolerance: float | None = None
    #: "mean" (the mean's difference against the tolerance) or "iqm" (deep RL: the
    #: interquartile mean with a stratified-bootstrap interval; amptrain/compare/seeds.py).
    seed_statistic: str = "mean"

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"Verdict.unit must be one of {UNITS} (got {self.unit!r})")
        if self.seed_statistic not in SEED_STATISTICS:
            raise ValueError(f"Verdict.seed_statistic must be one of {SEED_STATISTICS} "
                             f"(got {self.seed_statistic!r})")

    @property
    def tolerance_option(self) -> str:
        """The compare option that holds the tolerance (``tolerance_pp``, ``tolerance_rel``)."""
        return f"tolerance_{self.unit}"

    def delta_field(self, metric: Metric) -> str:
        """compare.json's name for the difference on ``metric`` (``delta_acc_pp``)."""
        return f"delta_{metric.key}_{self.unit}"

    def difference(self, value: float, baseline: float) -> float:
        """The distance to the baseline in tolerance units: percentage points, or the
        relative change (0.02 = 2 % higher than the baseline)."""
        if self.unit == "rel":
            return (value - baseline) / abs(baseline) if baseline else float("inf")
        return (value - baseline) * 100.0

    def call(self, delta: float | None, tolerance: float, metric: Metric) -> str | None:
        """``ok`` within the tolerance, else ``worse`` or ``better`` in ``metric``'s
        direction; None without a difference."""
        if delta is None:
            return None
        if abs(delta) <= tolerance + 1e-9:
            return "ok"
        better = delta > 0 if metric.higher_is_better else delta < 0
        return "better" if better else "worse"

    def judge(self, value: float | None, baseline: float | None, tolerance: float,
              metric: Metric) -> tuple[float | None, str | None]:
        """(difference to the baseline, verdict ok/worse/better) on ``metric``."""
        if value is None or baseline is None:
            return None, None
        delta = self.difference(value, baseline)
        return delta, self.call(delta, tolerance, metric)

    def format_delta(self, delta: float | None) -> str:
        """A difference as reports show it (``+0.25 pp``, ``+1.3 %``)."""
        if delta is None:
            return "-"
        return f"{delta:+.2f} pp" if self.unit == "pp" else f"{delta * 100:+.2f} %"

    def format_tolerance(self, tolerance: float) -> str:
        """The tolerance as reports show it (``±0.5 pp``, ``±2 %``)."""
        return f"±{tolerance:g} pp" if self.unit == "pp" else f"±{tolerance * 100:g} %"


__all__ = ["SEED_STATISTICS", "UNITS", "Verdict"]
