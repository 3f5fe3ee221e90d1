"""What a study compares and how it measures: ``compare``'s own options, and the
precisions it resolves to."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from ..config import option
from ..config.options import require_non_negative, require_positive
from ..errors import UserError, flag
from ..precision.support import resolve_name

log = logging.getLogger("amptrain")

#: compare.json's summary fields, in DESIGN.md's order.
SUMMARY_FIELDS = ("precision", "samples_per_s", "speedup", "step_time_ms", "peak_mem_bytes",
                  "mem_ratio", "val_acc_mean", "val_acc_std", "delta_acc_pp", "final_loss_mean",
                  "skipped_steps", "verdict")
#: A run logs about this many training records, so every loss curve has enough points.
CURVE_POINTS = 100
#: Training steps measured for peak memory (after the timing steps warmed everything up).
MEMORY_STEPS = 2


@dataclass
class CompareOptions:
    """What the study compares and how it measures (the flags ``train`` does not have)."""

    precisions: str = option("32-true,16-mixed,bf16-mixed", "comma-separated precisions to "
                             "compare", group="compare", comma_list=True)
    seeds: int = option(2, "training runs per precision, seeds --seed, --seed+1, ...",
                        group="compare")
    baseline: str = option("32-true", "precision that speedup, mem_ratio and delta_acc_pp are "
                           "relative to (added to --precisions when missing)", group="compare")
    tolerance_pp: float = option(0.5, "verdict ok when |accuracy difference to the baseline| is "
                                 "at most this many percentage points", group="compare")
    interleave: bool = option(True, "alternate the timed steps between precisions "
                              "(--no-interleave times one precision after the other and holds "
                              "one model at a time)", group="compare")
    timing_steps: int = option(30, "timed optimizer steps per precision", group="compare")
    timing_warmup: int = option(5, "untimed warm-up steps per precision before timing",
                                group="compare")
    bench_steps: int | None = option(None, "speed only: time this many steps per precision "
                                     "and skip the training runs", kind=int, group="compare")

    def __post_init__(self) -> None:
        require_positive(self, "seeds", "timing_steps")
        require_positive(self, "bench_steps", optional=True)
        require_non_negative(self, "timing_warmup")
        if not (isinstance(self.tolerance_pp, (int, float)) and math.isfinite(self.tolerance_pp)
                and self.tolerance_pp >= 0):
            raise UserError(f"{flag('tolerance_pp')} must be a number >= 0 "
                            f"(got {self.tolerance_pp!r})")
        if not [p for p in str(self.precisions).split(",") if p.strip()]:
            raise UserError(f"{flag('precisions')} needs at least one precision, e.g. "
                            f"32-true,bf16-mixed")

    @property
    def speed_only(self) -> bool:
        return self.bench_steps is not None

    @property
    def timed_steps(self) -> int:
        return self.bench_steps if self.bench_steps is not None else self.timing_steps


def resolve_precisions(options: CompareOptions, device: torch.device) -> tuple[str, list[str]]:
    """(baseline, precisions): canonical names, ``auto`` resolved, baseline first, no repeats."""
    def canonical(name: str, option: str) -> str:
        try:
            return resolve_name(name.strip(), device)
        except UserError as exc:
            raise UserError(f"{flag(option)}: {exc}") from None

    names = [canonical(p, "precisions") for p in str(options.precisions).split(",") if p.strip()]
    baseline = canonical(options.baseline, "baseline")
    if baseline not in names:
        log.info("compare: adding the baseline %s to --precisions (speedups are relative to it)",
                 baseline)
    ordered = [baseline] + [p for p in names if p != baseline]
    return baseline, list(dict.fromkeys(ordered))
