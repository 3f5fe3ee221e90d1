"""Judging a precision over seeds the way deep RL needs it: the interquartile mean (IQM)
with a stratified-bootstrap 95 % interval, the difference to the baseline with its interval,
and a verdict that asks both "is the difference distinguishable from zero?" and "is the
mean change within the tolerance?".

The method is that of Agarwal et al., "Deep Reinforcement Learning at the Edge of the
Statistical Precipice" (NeurIPS 2021) and its package ``rliable``:

* **IQM**: ``rliable.metrics.aggregate_iqm`` is ``scipy.stats.trim_mean(scores,
  proportiontocut=0.25, axis=None)``: the scores of all runs (and all tasks) pooled and
  sorted, ``int(0.25 * n)`` cut from each end, the rest averaged. No fractional weights:
  5 seeds cut 1 from each end, 3 seeds cut none (the plain mean). :func:`iqm` is exactly that.
* **Interval**: ``rliable.library.get_interval_estimates`` resamples the runs with
  replacement *within each task* (arch's ``StratifiedBootstrap``) and takes the percentile
  interval of the statistic over the resamples. :func:`bootstrap_interval` does the same
  with numpy: strata are the tasks/environments (a compare study has one), the RNG seed is
  fixed so a report is reproducible, and the number of resamples is bounded.
* **Difference to the baseline**: the bootstrap of the difference of the two IQMs. Where
  compare pairs runs (seed ``s`` of every precision starts from the same weights and sees the
  same environments), one resample draws the same seeds for both precisions; otherwise each
  precision is resampled on its own.

numpy only: ``rliable`` would add arch and pandas (scipy already comes with scikit-learn)
for a trimmed mean and a resampling loop of a few lines.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..tasks import Task

#: The share cut from each end of the sorted scores (rliable's IQM: 25 %).
TRIM = 0.25
#: Bootstrap resamples of an interval. rliable's default is 50 000 over many tasks; for
#: one environment and tens of seeds the percentile bounds settle within a few thousand.
BOOTSTRAP_REPS = 5000
#: Upper bound of ``reps``: more resamples no longer move the bounds and only cost memory.
MAX_REPS = 100_000
#: The resampling RNG's seed: the same scores always give the same interval.
BOOTSTRAP_SEED = 0
#: The interval's coverage.
CONFIDENCE = 0.95
#: Fewer seeds than this per precision and the verdict is called weak (Agarwal et al.
#: show few-run point estimates mislead; five is the issue's floor).
MIN_SEEDS = 5


def iqm(scores: Sequence[float] | np.ndarray) -> float:
    """The interquartile mean of ``scores`` (all values pooled), exactly
    ``scipy.stats.trim_mean(scores, 0.25, axis=None)`` as ``rliable`` defines it."""
    values = np.sort(np.asarray(scores, dtype=np.float64).ravel())
    if values.size == 0:
        raise ValueError("the IQM of no scores")
    cut = int(TRIM * values.size)
    return float(values[cut:values.size - cut].mean())


def _iqm_rows(samples: np.ndarray) -> np.ndarray:
    """:func:`iqm` of every row of a (reps, n) array."""
    cut = int(TRIM * samples.shape[1])
    ordered = np.sort(samples, axis=1)
    return ordered[:, cut:samples.shape[1] - cut].mean(axis=1)


def _strata(scores: Sequence[Sequence[float]] | Sequence[float]) -> list[np.ndarray]:
    """Scores as a list of strata: a flat sequence is one stratum."""
    if len(scores) and np.ndim(scores[0]) == 0:
        return [np.asarray(scores, dtype=np.float64)]
    strata = [np.asarray(s, dtype=np.float64).ravel() for s in scores]
    if not strata or any(s.size == 0 for s in strata):
        raise ValueError("every stratum needs at least one score")
    return strata


def _check_reps(reps: int) -> int:
    if not 1 <= reps <= MAX_REPS:
        raise ValueError(f"reps must be within 1..{MAX_REPS} (got {reps})")
    return int(reps)


def _draws(rng: np.random.Generator, strata: list[np.ndarray], reps: int) -> list[np.ndarray]:
    """Per stratum, (reps, n) indices drawn with replacement within that stratum."""
    return [rng.integers(0, s.size, size=(reps, s.size)) for s in strata]


def _resampled(strata: list[np.ndarray], draws: list[np.ndarray]) -> np.ndarray:
    """(reps, total) scores: each stratum resampled by its draws, strata side by side."""
    return np.concatenate([s[d] for s, d in zip(strata, draws)], axis=1)


def _percentiles(stats: np.ndarray) -> tuple[float, float]:
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(stats, [tail, 100 - tail])
    return float(low), float(high)


def bootstrap_interval(scores: Sequence[Sequence[float]] | Sequence[float], *,
                       reps: int = BOOTSTRAP_REPS, seed: int = BOOTSTRAP_SEED
                       ) -> tuple[float, float, float]:
    """(IQM, low, high): the IQM of ``scores`` and its stratified-bootstrap percentile
    interval (:data:`CONFIDENCE`). ``scores`` is one list of per-seed scores, or a list of
    such lists, one per stratum (task or environment), resampled within each."""
    strata = _strata(scores)
    rng = np.random.default_rng(seed)
    stats = _iqm_rows(_resampled(strata, _draws(rng, strata, _check_reps(reps))))
    return (iqm(np.concatenate(strata)), *_percentiles(stats))


def difference_interval(scores: Sequence[Sequence[float]] | Sequence[float],
                        baseline: Sequence[Sequence[float]] | Sequence[float],
                        difference: Callable[[float, float], float], *, paired: bool,
                        reps: int = BOOTSTRAP_REPS, seed: int = BOOTSTRAP_SEED
                        ) -> tuple[float, float, float]:
    """(difference, low, high) of ``difference(iqm(scores), iqm(baseline))`` (the task's
    unit: percentage points, relative change) and its stratified-bootstrap interval.

    ``paired``: score ``i`` of a stratum and baseline score ``i`` belong together (the same
    seed); one resample then draws the same indices for both. Unpaired, each side is
    resampled on its own."""
    mine, base = _strata(scores), _strata(baseline)
    if paired and [s.size for s in mine] != [s.size for s in base]:
        raise ValueError("paired scores need the same number of seeds per stratum")
    rng = np.random.default_rng(seed)
    reps = _check_reps(reps)
    draws = _draws(rng, base, reps)
    own = _iqm_rows(_resampled(mine, draws if paired else _draws(rng, mine, reps)))
    theirs = _iqm_rows(_resampled(base, draws))
    stats = np.array([difference(float(a), float(b)) for a, b in zip(own, theirs)])
    point = difference(iqm(np.concatenate(mine)), iqm(np.concatenate(base)))
    low, high = _percentiles(stats[np.isfinite(stats)]) if np.isfinite(stats).any() \
        else (float("nan"), float("nan"))
    return point, low, high


def seed_verdict(mean_delta: float | None, low: float | None, high: float | None,
                 tolerance: float, higher_is_better: bool) -> str | None:
    """``ok`` when the interval [low, high] of the difference holds zero and the mean
    change ``mean_delta`` is within ``tolerance``; else ``better``/``worse`` in the metric's
    direction: the interval's side of zero when it excludes zero, else the mean change's
    sign. None without a difference."""
    if mean_delta is None or low is None or high is None:
        return None
    holds_zero = low <= 0 <= high
    if holds_zero and abs(mean_delta) <= tolerance + 1e-9:
        return "ok"
    up = low > 0 if not holds_zero else mean_delta > 0
    return "better" if up == higher_is_better else "worse"


# ----------------------------------------------------------- compare's rows
@dataclass(frozen=True)
class SeedFields:
    """compare.json's names of the seed statistics of a metric ``key`` in ``unit``."""

    key: str
    unit: str

    @property
    def names(self) -> tuple[str, ...]:
        k, u = self.key, self.unit
        return (f"val_{k}_iqm", f"val_{k}_iqm_low", f"val_{k}_iqm_high",
                f"delta_{k}_iqm_{u}", f"delta_{k}_iqm_{u}_low", f"delta_{k}_iqm_{u}_high",
                "weak_verdict", "seed_note")


def seed_fields(task: Task) -> tuple[str, ...]:
    """The summary fields a task with ``seed_statistic = "iqm"`` adds, e.g. ``val_return_iqm``,
    ``val_return_iqm_low``, ..., ``delta_return_iqm_rel_high``, ``weak_verdict``,
    ``seed_note``; none for ``"mean"`` (compare's rows stay as they were)."""
    # The task's verdict part declares it ("mean" by default; Verdict checks the value).
    if task.verdict.seed_statistic != "iqm":
        return ()
    return SeedFields(task.metrics.primary.key, task.verdict.unit).names


def weak_note(seeds: int) -> str | None:
    """The report's words for a verdict on fewer than :data:`MIN_SEEDS` seeds."""
    if seeds >= MIN_SEEDS:
        return None
    return (f"weak verdict: {seeds} seed{'s' if seeds != 1 else ''} (an interval over fewer "
            f"than {MIN_SEEDS} seeds says little; run --seeds {MIN_SEEDS} or more)")


def judge_over_seeds(own: Mapping[int, float], base: Mapping[int, float], task: Any,
                     tolerance: float, *, reps: int = BOOTSTRAP_REPS,
                     seed: int = BOOTSTRAP_SEED) -> dict[str, Any]:
    """The seed fields (:func:`seed_fields`) and ``verdict`` of one precision.

    ``own`` and ``base`` map seed -> final primary metric of the precision and of the
    baseline (runs that produced no value left out). Runs are paired when both hold the
    same seeds (compare gives seed ``s`` of every precision the same initial weights and
    environment seeds). The mean change is ``task.verdict.difference`` of the two means."""
    names = SeedFields(task.metrics.primary.key, task.verdict.unit).names
    fields: dict[str, Any] = dict.fromkeys(names)
    fields["verdict"] = None
    if not own:
        return fields
    mine = [own[s] for s in sorted(own)]
    point, low, high = bootstrap_interval(mine, reps=reps, seed=seed)
    fields.update(zip(names[:3], (point, low, high)))
    seeds = min(len(own), len(base)) if base else len(own)
    fields["weak_verdict"] = seeds < MIN_SEEDS
    fields["seed_note"] = weak_note(seeds)
    if not base:
        return fields
    paired = set(own) == set(base)
    theirs = [base[s] for s in sorted(base)]
    delta, d_low, d_high = difference_interval(mine, theirs, task.verdict.difference, paired=paired,
                                               reps=reps, seed=seed)
    fields.update(zip(names[3:6], (delta, d_low, d_high)))
    mean_delta = task.verdict.difference(float(np.mean(mine)), float(np.mean(theirs)))
    if np.isfinite(d_low) and np.isfinite(d_high):
        fields["verdict"] = seed_verdict(mean_delta, d_low, d_high, tolerance,
                                         task.metrics.primary.higher_is_better)
    else:  # no finite interval (a relative change from a baseline of 0): the mean's rule
        fields["verdict"] = task.verdict.call(mean_delta, tolerance, task.metrics.primary)
    return fields
