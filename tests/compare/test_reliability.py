"""compare/reliability.py: when compare's timing is not to be trusted, it says so.

The rule is tested as a pure function of given round times; then real (small) studies
run on a clock the test keeps (:mod:`amptrain.common.clock`), with step times made to
order, must carry the warning into compare.json, report.md and report.html. Nothing here
reads the machine's time, so the tests pass however loaded the machine is.
"""
from __future__ import annotations

import json
import random

import pytest
from amptrain.common import clock
from amptrain.compare import CompareOptions, assess_timing, run_compare
from amptrain.compare import pipeline as study_module
from amptrain.compare.reliability import (
    AA_LIMIT,
    LANE_TRAINING_LIMIT,
    MIN_SPEED_WINDOWS,
    SPREAD_LIMIT,
    check_against_training,
)
from amptrain.report import format_table, timing_warning
from tests.compare.conftest import small_config
from tests.conftest import ManualClock, steps_take

STEADY = [10.0] * 10


def test_steady_rounds_are_reliable_with_a_tight_range():
    fields = assess_timing({"32-true": STEADY, "bf16-mixed": [5.0] * 10}, "32-true", STEADY,
                           load=0.5, cores=2)
    assert fields["bf16-mixed"] == {"speedup_low": 2.0, "speedup_high": 2.0,
                                    "timing_reliable": True, "timing_note": None}
    # The baseline's range is the A/A control's.
    assert fields["32-true"]["speedup_low"] == fields["32-true"]["speedup_high"] == 1.0
    assert fields["32-true"]["timing_reliable"] is True


def test_scattered_per_round_ratios_are_unreliable():
    scattered = [5.0, 10.0] * 5  # 2x in one round, 1x in the next
    fields = assess_timing({"32-true": STEADY, "16-mixed": scattered}, "32-true", STEADY)
    row = fields["16-mixed"]
    assert row["timing_reliable"] is False
    assert "per-round speedups spread" in row["timing_note"]
    assert row["speedup_low"] == pytest.approx(1.0) and row["speedup_high"] == pytest.approx(2.0)
    assert fields["32-true"]["timing_reliable"] is True  # the others stay trusted


def test_a_small_steady_offset_between_rounds_is_within_the_limits():
    wobble = [10.0 * (1 + SPREAD_LIMIT / 2 * (-1) ** i) for i in range(10)]
    fields = assess_timing({"32-true": STEADY, "bf16-mixed": wobble}, "32-true",
                           [10.0 * (1 + AA_LIMIT / 2)] * 10)
    assert fields["bf16-mixed"]["timing_reliable"] is True


def test_an_aa_gap_makes_every_row_unreliable():
    fields = assess_timing({"32-true": STEADY, "bf16-mixed": [5.0] * 10}, "32-true",
                           [12.5] * 10)
    for row in fields.values():
        assert row["timing_reliable"] is False
        assert "A/A gap: 32-true timed twice measured 0.80x" in row["timing_note"]


def test_a_load_above_the_core_count_makes_every_row_unreliable():
    fields = assess_timing({"32-true": STEADY, "bf16-mixed": [5.0] * 10}, "32-true", STEADY,
                           load=3.5, cores=2)
    assert all(r["timing_note"] == "load average 3.5 above the 2 cores" for r in fields.values())
    assert assess_timing({"32-true": STEADY}, "32-true", STEADY, load=2.0,
                         cores=2)["32-true"]["timing_reliable"] is True


def test_rounds_timed_one_precision_after_another_are_not_trusted():
    fields = assess_timing({"32-true": STEADY, "bf16-mixed": [5.0] * 10}, "32-true", STEADY,
                           interleaved=False)
    assert all(f["timing_reliable"] is False for f in fields.values())
    assert "--no-interleave" in fields["bf16-mixed"]["timing_note"]


def test_too_few_rounds_and_untimed_precisions():
    fields = assess_timing({"32-true": STEADY[:3], "bf16-mixed": [5.0] * 3, "16-mixed": []},
                           "32-true", STEADY[:3])
    assert fields["bf16-mixed"]["timing_note"] == "only 3 timed rounds"
    assert fields["16-mixed"] == {"speedup_low": None, "speedup_high": None,
                                  "timing_reliable": None, "timing_note": "not timed"}


def test_the_warning_names_the_rows_the_reason_and_the_remedy():
    summary = [{"precision": "32-true", "timing_reliable": True, "timing_note": None},
               {"precision": "16-mixed", "timing_reliable": False,
                "timing_note": "per-round speedups spread 1.00x-2.00x"},
               {"precision": "bf16-mixed", "timing_reliable": None, "timing_note": "not timed"}]
    warning = timing_warning(summary)
    assert warning.startswith("Timing not reliable (16-mixed): per-round speedups spread")
    assert "--bench-steps" in warning and "quiet machine" in warning
    assert timing_warning(summary[:1]) is None
    # A full compare (rows with verdicts) times more steps with --timing-steps.
    trained = [{**row, "verdict": "ok"} for row in summary]
    warning = timing_warning(trained)
    assert "--timing-steps 100" in warning and "--bench-steps" not in warning


class _BusyMachine:
    """Another job on a shared machine, made to order on a clock the test keeps: a training
    step takes 1 ms, and during a random half of the timed steps another job holds the
    core for 5-20 ms more, so steps of the same lane measure very differently.

    (A job slowing every lane alike for seconds at a time is what the interleaved timing is
    built to cancel, so it would not show.)
    """

    def __init__(self, monkeypatch) -> None:
        rng = random.Random(0)
        self.clock = ManualClock()
        steps_take(monkeypatch, self.clock,
                   lambda step: 1e-3 + (rng.uniform(5e-3, 20e-3) if rng.random() < 0.5
                                           else 0.0))


def test_a_study_timed_on_a_busy_machine_says_its_speedups_are_not_reliable(tmp_path,
                                                                           monkeypatch):
    # The busy job alone must show in the timing: the load average (which other jobs
    # on a shared test machine raise as well) is taken out of the rule here.
    monkeypatch.setattr(study_module, "machine_load", lambda: 0.0)
    out = tmp_path / "study"
    options = CompareOptions(precisions="32-true,bf16-mixed", bench_steps=16, timing_warmup=1)
    busy = _BusyMachine(monkeypatch)
    with clock.use(busy.clock):
        result = run_compare(small_config(out), options, pick_log_every=False)
    rows = result["summary"]
    assert any(r["timing_reliable"] is False for r in rows), rows
    doubtful = next(r for r in rows if r["timing_reliable"] is False)
    assert doubtful["timing_note"] and "load average" not in doubtful["timing_note"]
    assert json.loads((out / "compare.json").read_text())["summary"] == rows
    warning = timing_warning(rows)
    assert warning and "Timing not reliable" in warning
    assert "Timing not reliable" in (out / "report.md").read_text()
    assert "Timing not reliable" in (out / "report.html").read_text()
    assert "?" in format_table(rows, "32-true")  # the doubtful speedups are marked
    study = json.loads((out / "study.json").read_text())
    assert study["timing_load"]["cores"] >= 1
    assert "control_step_times_ms" in study["speed"]["32-true"]


# ------------------------------------- the timed step against the training runs' (issue 38)
def _run(precision: str, samples_per_s: float | None, wait: float | None = 0.0,
         windows: int = 10) -> dict:
    return {"precision": precision, "seed": 0, "train_samples_per_s": samples_per_s,
            "train_speed_windows": windows, "data_wait_frac": wait}


def _timed(step_ms: float, batch: int = 16) -> dict:
    return {"step_time_ms": step_ms, "batch_samples": batch, "timing_reliable": True,
            "timing_note": None}


def test_a_timed_step_40x_the_training_runs_is_not_reliable_and_names_both():
    # issue 38's numbers: 1184 ms timed, 584 samples/s of 16 in training (27.4 ms a step)
    speed = {"32-true": _timed(1184.0), "bf16-mixed": _timed(30.0)}
    runs = [_run("32-true", 584.0), _run("32-true", 600.0), _run("bf16-mixed", 560.0)]
    notes = check_against_training(speed, runs)
    slow = speed["32-true"]
    assert slow["timing_reliable"] is False
    # the median of the seeds' steps (27.40 and 26.67 ms)
    assert slow["train_step_time_ms"] == pytest.approx((16 / 584 + 16 / 600) / 2 * 1e3)
    assert slow["timing_note"] == ("its timed step (1184 ms) is 44x the step its training "
                                   "runs logged (27.03 ms)")
    assert notes == [f"32-true: {slow['timing_note']}"]
    # 30 ms against 28.6 ms is the same speed: the row is left as it was
    assert speed["bf16-mixed"]["timing_reliable"] is True
    assert speed["bf16-mixed"]["timing_note"] is None
    assert speed["bf16-mixed"]["train_step_time_ms"] == pytest.approx(16 / 560 * 1e3)


def test_the_limit_holds_both_ways_and_earlier_reasons_are_kept():
    low, high = 1 / LANE_TRAINING_LIMIT, LANE_TRAINING_LIMIT
    speed = {"a": _timed(10.0 * high * 0.99), "b": _timed(10.0 * high * 1.01),
             "c": _timed(10.0 * low * 1.01), "d": {**_timed(10.0 * low * 0.99),
                                                   "timing_note": "only 3 timed rounds"}}
    runs = [_run(p, 1600.0) for p in "abcd"]  # 16 samples in 10 ms
    check_against_training(speed, runs)
    assert [speed[p]["timing_reliable"] for p in "abcd"] == [True, False, True, False]
    assert speed["d"]["timing_note"].endswith("; only 3 timed rounds")


def test_the_training_runs_time_waiting_for_data_is_taken_out():
    # Half of training's time went to waiting for data, which the timed step (batches
    # already in memory) never does: 20 ms logged is a 10 ms step.
    speed = {"32-true": _timed(10.0)}
    check_against_training(speed, [_run("32-true", 800.0, wait=0.5)])
    assert speed["32-true"]["train_step_time_ms"] == pytest.approx(10.0)
    assert speed["32-true"]["timing_reliable"] is True


def test_without_runs_or_timing_nothing_is_judged():
    speed = {"32-true": _timed(10.0), "16-mixed": {"step_time_ms": None, "batch_samples": 0,
                                                   "timing_reliable": None,
                                                   "timing_note": "not timed"}}
    assert check_against_training(speed, []) == []  # --speed-only trains nothing
    assert speed["32-true"]["train_step_time_ms"] is None
    assert speed["32-true"]["timing_reliable"] is True
    check_against_training(speed, [_run("32-true", None), _run("16-mixed", 1000.0)])
    assert speed["32-true"]["train_step_time_ms"] is None  # a halted run logs no speed
    # two logged windows: the median may be the warm-up window, so it is not judged
    speed["32-true"] = _timed(1000.0)
    check_against_training(speed, [_run("32-true", 1600.0, windows=MIN_SPEED_WINDOWS - 1)])
    assert speed["32-true"]["train_step_time_ms"] is None
    assert speed["32-true"]["timing_reliable"] is True
    assert speed["16-mixed"]["timing_note"] == "not timed"


class _SlowTimings:
    """compare's timings made 100x slower than its training runs (issue 38 saw 40x) on a
    clock the test keeps: a step takes 1 ms, and 100 ms in the ``slowed`` timings (1-based)
    of the study; its training runs untouched. Nothing here reads the machine's time."""

    def __init__(self, monkeypatch, slowed) -> None:
        self.count, self.timing, self.slowed = 0, False, slowed
        self.clock = ManualClock()
        original_measure = study_module.measure_speed_and_memory
        steps_take(monkeypatch, self.clock,
                   lambda step: 0.1 if self.timing and self.count in self.slowed else 1e-3)

        def measure(*args, **kwargs):
            self.count += 1
            self.timing = True
            try:
                return original_measure(*args, **kwargs)
            finally:
                self.timing = False

        monkeypatch.setattr(study_module, "measure_speed_and_memory", measure)
        monkeypatch.setattr(study_module, "machine_load", lambda: 0.0)

    def study(self, out, caplog) -> dict:
        options = CompareOptions(precisions="32-true,bf16-mixed", timing_steps=5,
                                 timing_warmup=1, seeds=1)
        with caplog.at_level("INFO", logger="amptrain"), clock.use(self.clock):
            return run_compare(small_config(out, log_every=2), options, pick_log_every=False)


def test_a_study_whose_timing_lane_is_slower_than_its_training_says_so(tmp_path, monkeypatch,
                                                                       caplog):
    """Both timings slowed: compare still reports what it timed, but every row says that
    this is not the speed its training runs had, with both numbers, in compare.json,
    study.json, the reports and the console."""
    timings = _SlowTimings(monkeypatch, slowed={1, 2})
    out = tmp_path / "study"
    result = timings.study(out, caplog)
    assert timings.count == 2
    study = json.loads((out / "study.json").read_text())
    for row in result["summary"]:
        assert row["timing_reliable"] is False
        assert "the step its training runs logged" in row["timing_note"]
        trained = study["speed"][row["precision"]]["train_step_time_ms"]
        assert 0 < trained < row["step_time_ms"] / LANE_TRAINING_LIMIT
        assert f"({trained:.4g} ms)" in row["timing_note"]
    assert "not the speed training has (32-true: its timed step" in caplog.text
    assert "timed again, still not the speed training has" in caplog.text
    assert "Timing not reliable (32-true, bf16-mixed)" in (out / "report.md").read_text()


def test_a_timing_slowed_for_a_while_is_timed_again_and_the_agreeing_one_kept(
        tmp_path, monkeypatch, caplog):
    """The first timing slowed (another job on the machine for a while), the second not:
    compare keeps the second, which agrees with the training runs, and says in
    study.json why it timed twice."""
    timings = _SlowTimings(monkeypatch, slowed={1})
    out = tmp_path / "study"
    result = timings.study(out, caplog)
    assert timings.count == 2
    study = json.loads((out / "study.json").read_text())
    for row in result["summary"]:
        speed = study["speed"][row["precision"]]
        # the kept timing is the second: within the limit of the runs' step time
        assert row["step_time_ms"] < speed["train_step_time_ms"] * LANE_TRAINING_LIMIT
        assert "the step its training runs logged" not in (row["timing_note"] or "")
        assert speed["first_timing_note"].startswith("32-true: its timed step (")
    assert "the second timing agrees with the training runs" in caplog.text
