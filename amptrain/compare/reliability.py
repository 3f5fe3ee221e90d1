"""Whether compare's timing can be trusted, judged from the timing itself and then
against the step times its own training runs logged.

Every round of the interleaved timing runs one step of each precision and one of an A/A
control lane (the baseline set up a second time). Consecutive steps see about the same
machine, so per-round ratios hold up where absolute step times swing; when even they
scatter, or two identical lanes disagree, or the machine has more runnable work than
cores, no speedup of that study is to be trusted, and the study says so. A timed step
far from the step the same precision's training runs logged (:func:`check_against_training`)
is not the speed training has either, however steady its rounds were.
"""
from __future__ import annotations

import os
import statistics
from typing import Any

#: A speedup whose per-round ratios spread wider than this (half the interquartile range
#: over the median) is not reported as reliable.
SPREAD_LIMIT = 0.10
#: The A/A control (the baseline timed twice) may differ from 1 by this much.
AA_LIMIT = 0.05
#: Fewer timed rounds than this give no usable spread.
MIN_ROUNDS = 5


def round_ratios(baseline: list[float], other: list[float]) -> list[float]:
    """Per-round speedups: the baseline's step time over the other's, round by round."""
    return [b / o for b, o in zip(baseline, other) if o > 0 and b > 0]


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def machine_load() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def assess_timing(step_times: dict[str, list[float]], baseline: str,
                  control_times: list[float], *, load: float | None = None,
                  cores: int | None = None, interleaved: bool = True
                  ) -> dict[str, dict[str, Any]]:
    """The reliability fields of every timed precision, from its per-round step times.

    ``step_times[p]`` are precision ``p``'s timed steps in round order (any unit), and
    ``control_times`` the A/A lane's (the baseline timed a second time, in the same
    rounds). ``load`` is the machine's load average during the timing and ``cores`` its
    core count. Returns, per precision, ``speedup_low``/``speedup_high`` (the interquartile
    range of the per-round speedups; for the baseline, of the A/A ratios),
    ``timing_reliable`` (None when the precision was not timed) and ``timing_note`` (why
    not reliable; None when reliable). A problem of the whole study (the A/A gap, the
    load, timing without ``interleaved`` rounds) makes every row unreliable.
    """
    base = step_times.get(baseline, [])
    shared: list[str] = []
    control = round_ratios(base, control_times)
    if control:
        _, aa, _ = _quartiles(control)
        if abs(aa - 1) > AA_LIMIT:
            shared.append(f"A/A gap: {baseline} timed twice measured {aa:.2f}x")
    if load is not None and cores and load > cores:
        shared.append(f"load average {load:.1f} above the {cores} cores")
    if not interleaved:
        # Round r of two precisions ran far apart in time: their ratio compares two
        # moments of the machine, which is what interleaving exists to avoid.
        shared.append("timed one precision after another (--no-interleave)")
    fields: dict[str, dict[str, Any]] = {}
    for precision, times in step_times.items():
        ratios = control if precision == baseline else round_ratios(base, times)
        if not times or not ratios:
            fields[precision] = {"speedup_low": None, "speedup_high": None,
                                 "timing_reliable": None, "timing_note": "not timed"}
            continue
        low, median, high = _quartiles(ratios)
        reasons = list(shared)
        if len(ratios) < MIN_ROUNDS:
            reasons.insert(0, f"only {len(ratios)} timed rounds")
        elif (high - low) / 2 / median > SPREAD_LIMIT:
            reasons.insert(0, f"per-round speedups spread {low:.2f}x-{high:.2f}x")
        fields[precision] = {"speedup_low": low, "speedup_high": high,
                             "timing_reliable": not reasons,
                             "timing_note": "; ".join(reasons) or None}
    return fields


#: compare's timing lane and its training runs step the same model on the same batches:
#: a lane this many times slower (or faster) than the runs measured something other than
#: training (issue 38: a lane at 40x the runs' step went out as the speed).
LANE_TRAINING_LIMIT = 3.0
#: A run's logged speed is its median over log intervals; with fewer intervals than this the
#: first (warm-up: allocations, kernel selection) can be the median, so it is not judged.
MIN_SPEED_WINDOWS = 3


def training_step_ms(runs: list[dict[str, Any]], precision: str,
                     batch_samples: int | None) -> float | None:
    """The step time ``precision``'s training runs logged themselves: the median over its
    seeds of ``batch_samples`` over the run's median ``samples_per_s``, its share of time
    waiting for data taken out (the timing lane's batches are already in memory). Runs
    that logged their speed fewer than :data:`MIN_SPEED_WINDOWS` times are left out."""
    if not batch_samples:
        return None
    steps = [batch_samples / r["train_samples_per_s"] * 1e3 * (1 - (r.get("data_wait_frac") or 0))
             for r in runs
             if r["precision"] == precision and r.get("train_samples_per_s")
             and r.get("train_speed_windows", 0) >= MIN_SPEED_WINDOWS]
    return statistics.median(steps) if steps else None


def check_against_training(speed: dict[str, dict[str, Any]],
                           runs: list[dict[str, Any]]) -> list[str]:
    """Hold each precision's timed step against the step its own training runs logged.

    Adds ``train_step_time_ms`` (None without runs) to every ``speed[p]``; where the timing
    lane's median step is more than :data:`LANE_TRAINING_LIMIT` times off the runs', the
    row's timing is not reliable and its ``timing_note`` names both. Returns those notes."""
    notes = []
    for precision, s in speed.items():
        lane_ms = s.get("step_time_ms")
        train_ms = training_step_ms(runs, precision, s.get("batch_samples"))
        s["train_step_time_ms"] = train_ms
        if not lane_ms or not train_ms:
            continue
        ratio = lane_ms / train_ms
        if 1 / LANE_TRAINING_LIMIT <= ratio <= LANE_TRAINING_LIMIT:
            continue
        note = (f"its timed step ({lane_ms:.4g} ms) is {ratio:.2g}x the step its training "
                f"runs logged ({train_ms:.4g} ms)")
        s["timing_reliable"] = False
        s["timing_note"] = "; ".join(filter(None, [note, s.get("timing_note")]))
        notes.append(f"{precision}: {note}")
    return notes
