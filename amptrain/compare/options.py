"""What a study compares and how it measures: ``compare``'s own options, and the
precisions it resolves to."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# torch-free: `compare --help` builds its flags from CompareOptions without importing torch
# (the precision layer is imported where a precision is resolved).
from ..common.choices import WEIGHT_UPDATES
from ..config import option
from ..common.options import require_non_negative, require_positive
from ..config.train import OPTIMIZERS
from ..common.errors import UserError, flag
from ..common.tolerance import SHARED_TOLERANCES, Tolerance, tolerance_for

if TYPE_CHECKING:
    import torch

log = logging.getLogger("amptrain")

#: compare.json's summary fields, in the contract's order (docs/design.md).
SUMMARY_FIELDS = ("precision", "samples_per_s", "speedup", "step_time_ms", "peak_mem_bytes",
                  "mem_ratio", "weights_bytes", "grad_bytes", "master_bytes",
                  "optimizer_state_bytes", "bytes_per_param", "lowbit_flops_share",
                  "est_matmul_speedup_h100", "est_matmul_speedup_b200",
                  "val_acc_mean", "val_acc_std", "delta_acc_pp", "final_loss_mean",
                  "skipped_steps", "speedup_low", "speedup_high", "timing_reliable",
                  "timing_note", "verdict", "data_wait_frac")
#: The tolerance a task gets when neither the user nor the task names one (``--tolerance-pp``
#: 0.5 percentage points of accuracy; ``--tolerance-rel`` two percent of perplexity or RMSE).
#: A run logs about this many training records, so every loss curve has enough points.
CURVE_POINTS = 100
#: The most timed (or warm-up) steps per precision: a median settles within tens of steps,
#: and a mistyped count (10^12) would run silently until killed.
MAX_TIMED_STEPS = 10_000
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
    tolerance_pp: float = option(SHARED_TOLERANCES["tolerance_pp"], "verdict ok when "
                                 "|accuracy difference to the baseline| is at most this many "
                                 "percentage points", group="compare")
    tolerance_rel: float | None = option(None, "verdict ok when the relative change of the "
                                         "task's metric (perplexity, RMSE, Fréchet distance) "
                                         "against the baseline is at most this (default: the "
                                         "task's own, e.g. 0.25 for gan, else 0.02)", kind=float,
                                         group="compare")
    interleave: bool = option(True, "alternate the timed steps between precisions "
                              "(--no-interleave times one precision after the other and holds "
                              "one model at a time)", group="compare")
    timing_steps: int = option(30, "timed optimizer steps per precision (ppo: whole "
                                   "updates, the rollout included)", group="compare")
    timing_warmup: int = option(5, "untimed warm-up steps per precision before timing",
                                group="compare")
    bench_steps: int | None = option(None, "speed only: time this many steps per precision "
                                     "and skip the training runs", kind=int, group="compare")

    def __post_init__(self) -> None:
        require_positive(self, "seeds", "timing_steps")
        require_positive(self, "bench_steps", optional=True)
        require_non_negative(self, "timing_warmup")
        for name in ("bench_steps", "timing_steps", "timing_warmup", "seeds"):
            value = getattr(self, name)
            limit = 100 if name == "seeds" else MAX_TIMED_STEPS
            if isinstance(value, int) and value > limit:
                raise UserError(f"{flag(name)} {value} is over the limit of {limit} (medians "
                                f"settle within tens of steps; the study would run for hours)")
        for name in ("tolerance_pp", "tolerance_rel"):
            value = getattr(self, name)
            if value is None and name == "tolerance_rel":
                continue  # the task's default (resolve_tolerance)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise UserError(f"{flag(name)} must be a number >= 0 (got {value!r})")
        if not [p for p in str(self.precisions).split(",") if p.strip()]:
            raise UserError(f"{flag('precisions')} needs at least one precision, e.g. "
                            f"32-true,bf16-mixed")

    @property
    def speed_only(self) -> bool:
        return self.bench_steps is not None

    @property
    def timed_steps(self) -> int:
        return self.bench_steps if self.bench_steps is not None else self.timing_steps


def resolve_tolerance(options: CompareOptions, task: Any) -> Tolerance:
    """The tolerance of ``task``'s verdict for these options (see
    :func:`~amptrain.common.tolerance.tolerance_for`)."""
    return tolerance_for(task, getattr(options, task.verdict.tolerance_option, None))


def resolve_precisions(options: CompareOptions, device: torch.device,
                       weight_update: str = "plain") -> tuple[str, list[str]]:
    """(baseline, precisions): canonical names, ``auto`` resolved, baseline first, no repeats.

    A precision may name a rung of the memory ladder, ``MODE[+RULE][+OPTIMIZER]`` (e.g.
    ``bf16-true+kahan``, ``bf16-true+stochastic+adamw8bit``); ``weight_update`` (the run's
    ``--weight-update``) applies to the half-weight modes without masters and labels them.
    """
    # deferred: compare --help reads these options without torch
    from ..precision.resolve import resolve_precision

    def canonical(name: str, option: str) -> str:
        mode, *rungs = name.strip().split("+")
        try:
            mode = resolve_precision(mode, device).name
        except UserError as exc:
            raise UserError(f"{flag(option)}: {exc}") from None
        return rung_label(mode, rungs, weight_update, option)

    names = [canonical(p, "precisions") for p in str(options.precisions).split(",") if p.strip()]
    baseline = canonical(options.baseline, "baseline")
    if baseline not in names:
        log.info("compare: adding the baseline %s to --precisions (speedups are relative to it)",
                 baseline)
    ordered = [baseline] + [p for p in names if p != baseline]
    return baseline, list(dict.fromkeys(ordered))


def rung_label(mode: str, rungs: list[str], weight_update: str, option: str) -> str:
    """A row's label: the mode, then its weight-update rule and optimizer when not default."""
    from ..precision.modes import MODES  # deferred: torch, as above

    rules = [r for r in rungs if r in WEIGHT_UPDATES]
    optimizers = [r for r in rungs if r in OPTIMIZERS]
    unknown = [r for r in rungs if r not in WEIGHT_UPDATES and r not in OPTIMIZERS]
    if unknown or len(rules) > 1 or len(optimizers) > 1:
        raise UserError(f"{flag(option)}: {'+'.join([mode, *rungs])!r}: after the precision "
                        f"come at most one of {', '.join(WEIGHT_UPDATES)} and one of "
                        f"{', '.join(OPTIMIZERS)}, e.g. bf16-true+kahan")
    spec = MODES.get(mode)   # None: a precision plan (plan:FILE), fp32 weights
    half_only = spec is not None and spec.half_weights and not spec.master_weights
    rule = rules[0] if rules else (weight_update if half_only else "plain")
    if rule != "plain" and not half_only:
        raise UserError(f"{flag(option)}: {mode}+{rule}: a weight-update rule only applies to "
                        f"half weights without masters (bf16-true, 16-true)")
    return "+".join([mode] + ([rule] if rule != "plain" else []) + optimizers)


def row_options(label: str) -> dict[str, str]:
    """The training options of a row labelled by :func:`rung_label` (flat option names)."""
    mode, *rungs = label.split("+")
    options = {"precision": mode,
               "weight_update": next((r for r in rungs if r in WEIGHT_UPDATES), "plain")}
    optimizer = next((r for r in rungs if r in OPTIMIZERS), None)
    if optimizer is not None:
        options["optimizer"] = optimizer
    return options


@dataclass
class PlanOptions:
    """How ``amptrain plan`` searches (the flags ``train`` does not have)."""

    baseline: str = option("bf16-mixed", "precision each candidate plan is judged against",
                           group="plan")
    seeds: int = option(1, "training runs per candidate, seeds --seed, --seed+1, ...",
                        group="plan")
    budget_steps: int | None = option(None, "the most training steps the whole search "
                                      "spends (every run of every candidate, the baseline's "
                                      "included); a run that would pass it is not started",
                                      kind=int, group="plan")
    budget_time: float | None = option(None, "the most seconds the search spends; no run "
                                       "starts after it", kind=float, group="plan")
    probe_steps: int = option(20, "steps of the ranking run (32-true, every eligible "
                                  "layer's numerics in the format recorded)", group="plan")
    tolerance_pp: float = option(SHARED_TOLERANCES["tolerance_pp"], "verdict ok when the "
                                 "accuracy moves at most this many percentage points",
                                 group="plan")
    tolerance_rel: float | None = option(None, "verdict ok when the task's metric "
                                         "(perplexity, RMSE) changes at most this share "
                                         "(default: the task's own)", kind=float,
                                         group="plan")

    def __post_init__(self) -> None:
        require_positive(self, "seeds", "probe_steps")
        require_positive(self, "budget_steps", optional=True)
        for name in ("budget_time", "tolerance_pp", "tolerance_rel"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float))
                                          and math.isfinite(value) and value >= 0):
                raise UserError(f"{flag(name)} must be a number >= 0 (got {value!r})")
