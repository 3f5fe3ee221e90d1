"""compare.json's summary: one row per precision, judged by the task's primary metric."""
from __future__ import annotations

import math
import statistics
from typing import Any

from ..tasks import Task, delta_field, judge
from .ladder import LADDER_FIELDS
from .options import SUMMARY_FIELDS
from .seeds import judge_over_seeds, seed_fields


def finite(value: float | None) -> float | None:
    """JSON has no NaN or inf: a diverged value is reported as null."""
    return value if value is not None and math.isfinite(value) else None


def _mean(values: list[float]) -> float | None:
    return float(statistics.fmean(values)) if values else None


def _std(values: list[float]) -> float | None:
    """Sample standard deviation across seeds (0 for a single seed)."""
    if not values:
        return None
    return float(statistics.stdev(values)) if len(values) > 1 else 0.0


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def summarise(baseline: str, precisions: list[str], runs: list[dict[str, Any]],
              speed: dict[str, dict[str, Any]], tolerance: float,
              task: Task) -> list[dict[str, Any]]:
    """One summary row per precision, baseline first, with exactly the fields of
    :func:`summary_fields` (:data:`SUMMARY_FIELDS` with the task's metric names).

    The verdict is ``task``'s judgement of its primary metric (classification: accuracy in
    percentage points, ``--tolerance-pp``; perplexity and RMSE: relative change,
    ``--tolerance-rel``); ``tolerance`` is the tolerance in the task's unit.

    A task whose ``seed_statistic`` is ``"iqm"`` (deep RL) is judged over seeds instead
    (:mod:`.seeds`): its rows add the IQM with its bootstrap interval, the difference of
    IQMs to the baseline with its interval and the weak-verdict note, and the verdict asks
    that interval and the mean change (:func:`~.seeds.judge_over_seeds`).

    ``speed[p]`` holds ``samples_per_s``, ``step_time_ms`` and ``peak_mem_bytes`` measured
    for precision ``p`` in this invocation; ratios are taken against ``speed[baseline]``.
    """
    metric = f"val_{task.metrics.primary.key}"  # the runs' field of the primary metric
    mean_field, std_field, delta_field = metric_fields(task)

    def values(p: str) -> list[float]:
        return [r[metric] for r in runs if r["precision"] == p and r.get(metric) is not None]

    def by_seed(p: str) -> dict[int, float]:
        return {r["seed"]: r[metric] for r in runs
                if r["precision"] == p and r.get(metric) is not None}

    base_speed = speed.get(baseline, {})
    base_mean = _mean(values(baseline))
    rows = []
    for p in precisions:
        mine = [r for r in runs if r["precision"] == p]
        own = values(p)
        mean = _mean(own)
        delta, judged = judge(task, mean, base_mean, tolerance)
        over_seeds: dict[str, Any] = {}
        if seed_fields(task):
            over_seeds = judge_over_seeds(by_seed(p), by_seed(baseline), task, tolerance)
            judged = over_seeds.pop("verdict")
            over_seeds = {k: finite(v) if isinstance(v, float) else v
                          for k, v in over_seeds.items()}
        halted = any(r.get("halted") for r in mine)
        s = speed.get(p, {})
        row = {
            "precision": p,
            "samples_per_s": s.get("samples_per_s"),
            "speedup": _ratio(s.get("samples_per_s"), base_speed.get("samples_per_s")),
            "step_time_ms": s.get("step_time_ms"),
            "peak_mem_bytes": s.get("peak_mem_bytes"),
            "mem_ratio": _ratio(s.get("peak_mem_bytes"), base_speed.get("peak_mem_bytes")),
            # The memory ladder: exact bytes of weights, grads, masters/compensation and
            # optimizer state (compare/ladder.py).
            **{k: s.get(k) for k in LADDER_FIELDS},
            mean_field: mean,
            std_field: _std(own),
            delta_field: delta,
            **over_seeds,
            "final_loss_mean": _mean([r["final_loss"] for r in mine
                                      if r.get("final_loss") is not None]),
            "skipped_steps": sum(r["skipped_steps"] for r in mine
                                 if r.get("skipped_steps") is not None) if mine else None,
            # The interquartile range of the per-round speedups and whether to trust them
            # (compare/reliability.py).
            "speedup_low": s.get("speedup_low"),
            "speedup_high": s.get("speedup_high"),
            "timing_reliable": s.get("timing_reliable"),
            "timing_note": s.get("timing_note"),
            "verdict": "failed" if halted else judged,
            # The training runs' median share of time spent waiting for data.
            "data_wait_frac": _mean([r["data_wait_frac"] for r in mine
                                     if r.get("data_wait_frac") is not None]),
        }
        rows.append({name: row[name] for name in summary_fields(task)})
    return rows


def metric_fields(task: Task) -> tuple[str, str, str]:
    """The summary's fields of ``task``'s primary metric: (mean, std, delta), e.g.
    ``val_acc_mean``, ``val_acc_std``, ``delta_acc_pp`` (classification),
    ``val_perplexity_mean``, ..., ``delta_perplexity_rel`` (language models)."""
    key = task.metrics.primary.key
    return f"val_{key}_mean", f"val_{key}_std", delta_field(task)


#: Where :data:`SUMMARY_FIELDS` (classification's names there) holds the metric fields.
_METRIC_FIELDS = ("val_acc_mean", "val_acc_std", "delta_acc_pp")


def summary_fields(task: Task) -> tuple[str, ...]:
    """:data:`SUMMARY_FIELDS`, in its order, with the primary metric named by ``task``
    (:func:`metric_fields`) and, for a task judged over seeds, its seed fields
    (:func:`~.seeds.seed_fields`)."""
    named = dict(zip(_METRIC_FIELDS, metric_fields(task)))
    fields = tuple(named.get(k, k) for k in SUMMARY_FIELDS)
    # A task judged over seeds adds its seed statistics after the difference to the baseline.
    after = fields.index(delta_field(task)) + 1
    return fields[:after] + seed_fields(task) + fields[after:]


#: A precision that waits for data this share of its training time is input-bound.
DATA_WAIT_LIMIT = 0.2


def data_wait_warning(rows: list[dict[str, Any]]) -> str | None:
    """A line when the input pipeline, not the precision, limits a run's speed."""
    slow = [(r["precision"], r["data_wait_frac"]) for r in rows
            if r.get("data_wait_frac") is not None and r["data_wait_frac"] >= DATA_WAIT_LIMIT]
    if not slow:
        return None
    named = ", ".join(f"{p} {100 * w:.0f}%" for p, w in slow)
    return (f"the input pipeline limits the speedup: training waited for data ({named} of "
            f"its time), so a faster precision cannot go faster; raise --num-workers (images, "
            f"your own Dataset) or tokenize text once with `amptrain prepare` and train on "
            f"--data tokens:DIR")
