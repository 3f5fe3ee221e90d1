"""compare/summary.py: compare.json's summary rows, judged by the task's primary metric."""
from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from amptrain.compare import summarise
from amptrain.compare.summary import finite
from amptrain.tasks import ClassificationTask, Verdict
from tests.compare.conftest import SUMMARY_FIELDS

_accuracy = ClassificationTask.metrics.primary


def verdict(delta, tolerance):
    """classification's verdict on a difference in accuracy points."""
    return ClassificationTask.verdict.call(delta, tolerance, _accuracy)


def test_speedups_and_ratios_are_against_the_baseline_of_the_same_invocation(study):
    summary = {row["precision"]: row for row in study["result"]["summary"]}
    speed = study["details"]["speed"]
    base = summary["32-true"]
    assert base["speedup"] == 1.0 and base["mem_ratio"] == 1.0 and base["delta_acc_pp"] == 0.0
    for p, row in summary.items():
        # The throughput is this invocation's: batch / median of the steps timed here.
        median_s = statistics.median(speed[p]["step_times_ms"]) / 1e3
        assert row["samples_per_s"] == pytest.approx(64 / median_s, rel=1e-3)
        assert len(speed[p]["step_times_ms"]) == 3
        assert row["speedup"] == pytest.approx(row["samples_per_s"] / base["samples_per_s"])
        assert row["mem_ratio"] == pytest.approx(row["peak_mem_bytes"] / base["peak_mem_bytes"])
        accs = [r["val_acc"] for r in study["result"]["runs"] if r["precision"] == p]
        assert row["val_acc_mean"] == pytest.approx(np.mean(accs))
        assert row["val_acc_std"] == pytest.approx(np.std(accs, ddof=1))
        assert row["delta_acc_pp"] == pytest.approx((np.mean(accs) - base["val_acc_mean"]) * 100)


def test_verdicts_follow_the_tolerance_and_failures_are_reported():
    runs = [{"precision": p, "seed": s, "val_acc": acc, "final_loss": 0.1, "skipped_steps": k,
             "halted": halted}
            for p, s, acc, k, halted in [
                ("32-true", 0, 0.900, 0, None), ("32-true", 1, 0.910, 0, None),
                ("16-mixed", 0, 0.901, 1, None), ("16-mixed", 1, 0.919, 2, None),   # +0.5 pp
                ("bf16-mixed", 0, 0.880, 0, None), ("bf16-mixed", 1, 0.890, 0, None),  # -2 pp
                ("16-true", 0, 0.93, 0, None), ("16-true", 1, None, None, "scale fell")]]
    speed = {"32-true": {"samples_per_s": 100.0, "step_time_ms": 640.0, "peak_mem_bytes": 1000},
             "16-mixed": {"samples_per_s": 150.0, "step_time_ms": 427.0, "peak_mem_bytes": 800},
             "bf16-mixed": {"samples_per_s": 200.0, "step_time_ms": 320.0, "peak_mem_bytes": 500}}
    rows = {r["precision"]: r for r in summarise(
        "32-true", ["32-true", "16-mixed", "bf16-mixed", "16-true"], runs, speed, 0.5,
        ClassificationTask())}
    assert rows["16-mixed"]["delta_acc_pp"] == pytest.approx(0.5)
    assert rows["16-mixed"]["verdict"] == "ok" and rows["16-mixed"]["skipped_steps"] == 3
    assert rows["bf16-mixed"]["verdict"] == "worse"
    assert rows["bf16-mixed"]["speedup"] == 2.0 and rows["bf16-mixed"]["mem_ratio"] == 0.5
    assert rows["16-true"]["verdict"] == "failed" and rows["16-true"]["speedup"] is None
    assert verdict(0.51, 0.5) == "better" and verdict(-0.51, 0.5) == "worse"
    assert verdict(None, 0.5) is None
    assert all(list(r) == SUMMARY_FIELDS for r in rows.values())


def test_one_seed_has_no_spread_and_a_precision_without_runs_has_no_figures():
    runs = [{"precision": "32-true", "seed": 0, "val_acc": 0.9, "final_loss": 0.2,
             "skipped_steps": 0, "halted": None},
            {"precision": "bf16-mixed", "seed": 0, "val_acc": 0.92, "final_loss": 0.25,
             "skipped_steps": 0, "halted": None}]
    rows = summarise("32-true", ["32-true", "bf16-mixed", "16-mixed"], runs, {}, 0.5,
                     ClassificationTask())
    base, bf16, fp16 = rows
    assert base["val_acc_std"] == 0.0 and bf16["val_acc_std"] == 0.0
    assert bf16["delta_acc_pp"] == pytest.approx(2.0) and bf16["verdict"] == "better"
    assert bf16["final_loss_mean"] == 0.25
    # No speed measured: no throughput and no ratios, rather than a division by zero.
    assert base["samples_per_s"] is None and base["speedup"] is None and base["mem_ratio"] is None
    # A precision that has no runs at all: nothing to report, and no verdict.
    assert fp16["val_acc_mean"] is None and fp16["val_acc_std"] is None
    assert fp16["skipped_steps"] is None and fp16["verdict"] is None


def test_json_gets_null_for_a_diverged_value():
    assert finite(0.25) == 0.25 and finite(0.0) == 0.0
    assert finite(None) is None
    assert finite(math.nan) is None and finite(math.inf) is None and finite(-math.inf) is None


def test_input_bound_precisions_are_named_with_the_remedy():
    from amptrain.compare.summary import data_wait_warning

    rows = [{"precision": "32-true", "data_wait_frac": 0.05},
            {"precision": "bf16-mixed", "data_wait_frac": 0.4},
            {"precision": "16-mixed", "data_wait_frac": None}]
    warning = data_wait_warning(rows)
    assert warning is not None and "bf16-mixed 40%" in warning and "32-true" not in warning
    assert "--num-workers" in warning and "amptrain prepare" in warning
    assert data_wait_warning(rows[:1]) is None


# ------------------------------------------------------- judged over seeds
class IqmClassification(ClassificationTask):
    """Classification judged over seeds: the hook a deep-RL task declares."""

    verdict = Verdict(seed_statistic="iqm")


def _seeded_runs(values: dict[str, list[float | None]]) -> list[dict]:
    return [{"precision": p, "seed": s, "val_acc": v, "final_loss": 0.1, "skipped_steps": 0,
             "halted": None if v is not None else "scale fell"}
            for p, vs in values.items() for s, v in enumerate(vs)]


def test_a_task_judged_by_the_mean_keeps_todays_fields_and_verdicts():
    runs = _seeded_runs({"32-true": [0.90, 0.91, 0.92, 0.93, 0.94],
                         "bf16-mixed": [0.70, 0.71, 0.72, 0.73, 0.74]})
    rows = summarise("32-true", ["32-true", "bf16-mixed"], runs, {}, 0.5, ClassificationTask())
    assert all(list(r) == SUMMARY_FIELDS for r in rows)
    assert "weak_verdict" not in rows[1] and rows[1]["verdict"] == "worse"


def test_a_task_judged_over_seeds_adds_the_iqm_its_interval_and_the_seed_verdict():
    from amptrain.compare.seeds import judge_over_seeds, seed_fields

    values = {"32-true": [0.90, 0.91, 0.92, 0.93, 0.94],
              "16-mixed": [0.9005, 0.9105, 0.9205, 0.9305, 0.9405],   # +0.05 pp every seed
              "bf16-mixed": [0.89, 0.96, 0.88, 0.95, 0.92],            # noisy, mean ~+0.0
              "16-true": [0.93, None, 0.92, 0.91, 0.90]}               # one run stopped
    runs = _seeded_runs(values)
    task = IqmClassification()
    rows = {r["precision"]: r for r in summarise(
        "32-true", list(values), runs, {}, 0.5, task)}
    at = SUMMARY_FIELDS.index("delta_acc_pp") + 1
    assert all(list(r) == SUMMARY_FIELDS[:at] + list(seed_fields(task)) + SUMMARY_FIELDS[at:]
               for r in rows.values())
    base = dict(enumerate(values["32-true"]))
    for p in ("32-true", "16-mixed", "bf16-mixed"):
        expected = judge_over_seeds(dict(enumerate(values[p])), base, task, 0.5)
        assert {k: rows[p][k] for k in expected} == expected
        # The mean and its difference stay what they were.
        assert rows[p]["val_acc_mean"] == pytest.approx(np.mean(values[p]))
        assert rows[p]["weak_verdict"] is False
    assert rows["32-true"]["verdict"] == "ok" and rows["32-true"]["delta_acc_iqm_pp"] == 0.0
    # A tiny gain on every paired seed is distinguishable from zero: better, though within
    # the tolerance (the mean-only rule would have said ok).
    assert rows["16-mixed"]["verdict"] == "better"
    assert 0 < rows["16-mixed"]["delta_acc_iqm_pp_low"] <= rows["16-mixed"]["delta_acc_iqm_pp"]
    assert rows["bf16-mixed"]["delta_acc_iqm_pp_low"] < 0 < rows["bf16-mixed"][
        "delta_acc_iqm_pp_high"]
    assert rows["16-true"]["verdict"] == "failed" and rows["16-true"]["weak_verdict"] is True


@pytest.mark.slow
def test_a_real_study_of_a_task_judged_over_seeds(tmp_path, monkeypatch):
    # An existing small task with the hook switched to iqm, registered for this test only:
    # real training runs, real compare.json and reports.
    import json

    from amptrain.compare import CompareOptions, run_compare
    from amptrain.compare.seeds import judge_over_seeds, seed_fields
    from amptrain.report import format_table
    from amptrain.tasks import TASKS
    from tests.compare.conftest import small_config

    monkeypatch.setitem(TASKS, "classification", IqmClassification)
    out = tmp_path / "study"
    result = run_compare(small_config(out, max_steps=4),
                         CompareOptions(precisions="32-true,bf16-mixed", seeds=2,
                                        timing_steps=1, timing_warmup=0),
                         pick_log_every=False)
    assert json.loads((out / "compare.json").read_text()) == result
    task = IqmClassification()
    at = SUMMARY_FIELDS.index("delta_acc_pp") + 1
    accs = {p: {r["seed"]: r["val_acc"] for r in result["runs"] if r["precision"] == p}
            for p in ("32-true", "bf16-mixed")}
    for row in result["summary"]:
        assert list(row) == SUMMARY_FIELDS[:at] + list(seed_fields(task)) + SUMMARY_FIELDS[at:]
        expected = judge_over_seeds(accs[row["precision"]], accs["32-true"], task, 0.5)
        assert {k: row[k] for k in expected} == expected
        assert row["weak_verdict"] is True and "2 seeds" in row["seed_note"]
        assert row["val_acc_iqm_low"] <= row["val_acc_iqm"] <= row["val_acc_iqm_high"]
    table = format_table(result["summary"], "32-true")
    assert "acc IQM [95 % CI]" in table.splitlines()[0] and "(weak)" in table
    report_md = (out / "report.md").read_text()
    assert "weak verdict: 2 seeds" in report_md and "stratified-bootstrap" in report_md
    assert "acc IQM [95 % CI]" in (out / "report.html").read_text()
