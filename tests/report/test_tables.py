"""amptrain.report.tables: the terminal and Markdown tables, and the recommendation."""
from __future__ import annotations

import copy
import re

import pytest

from amptrain.report.load import load_study
from amptrain.report.tables import (
    _COLUMNS,
    fastest,
    format_table,
    markdown_table,
    recommendation,
    row_name,
)


@pytest.fixture
def summary(tiny_study):
    """Two trained rows: 32-true (baseline) and 16-mixed, 1.5x faster and within tolerance."""
    return load_study(tiny_study).summary


def test_markdown_table_marks_verdicts_the_baseline_and_the_fastest(summary):
    lines = markdown_table(summary, "32-true").splitlines()
    assert lines[0] == "| " + " | ".join(_COLUMNS) + " |"
    assert lines[1] == "|---|:---:|" + "---:|" * 9
    assert lines[2] == ("| `32-true` (baseline) | ✅ ok | 90.00 ± 1.00 % | baseline | 1,000 | "
                        "1.00× | 64.00 ms | 200.0 MiB | 1.00× | 0.3000 | 0 |")
    assert lines[3] == ("| `16-mixed` | ✅ ok | 90.20 ± 1.20 % | +0.20 pp | 1,500 | **1.50×** | "
                        "42.67 ms | 120.0 MiB | 0.60× | 0.3100 | 3 |")
    assert len(lines) == 4


def test_markdown_table_bolds_nothing_when_the_baseline_is_fastest(summary):
    summary = copy.deepcopy(summary)
    summary[1].update(speedup=0.8, verdict="worse", delta_acc_pp=-2.0)
    text = markdown_table(summary, "32-true")
    assert "**" not in text
    assert "| ❌ worse |" in text and "| -2.00 pp |" in text


def test_markdown_table_of_a_speed_only_study(speed_only_study):
    lines = markdown_table(load_study(speed_only_study).summary, "32-true").splitlines()
    # No verdicts, no accuracy: "n/a" cells; the baseline's Δ still says "baseline".
    assert lines[2].startswith("| `32-true` (baseline) | n/a | n/a | baseline | 1,000 |")
    assert lines[3].startswith("| `bf16-mixed` | n/a | n/a | n/a | 1,200 | **1.20×** |")
    assert lines[3].endswith("| 1.0 KiB | 0.50× | n/a | n/a |")


def test_format_table_aligns_columns_under_a_rule(summary):
    lines = format_table(summary, "32-true").splitlines()
    assert len(lines) == 4
    assert set(lines[1]) == {"-", " "}
    header, base, other = lines[0], lines[2], lines[3]
    assert base.index("baseline") == other.index("+0.20 pp") == header.index("Δ acc")
    assert base.index("1.00×") == other.index("1.50×") == header.index("speedup")
    assert all(line == line.rstrip() for line in lines)
    assert other.endswith("  3")  # skipped steps, the last column


def test_fastest_is_the_highest_speedup_or_none():
    rows = [{"precision": "a", "speedup": 1.0}, {"precision": "b", "speedup": 2.0},
            {"precision": "c", "speedup": None}]
    assert fastest(rows) == "b"
    assert fastest([{"precision": "a", "speedup": None}]) is None


def test_recommendation_sentences(summary, speed_only_study):
    assert recommendation(summary, "32-true", 0.5) == (
        "16-mixed is 1.50× faster than 32-true, 0.60× the memory, "
        "accuracy within ±0.5 pp (+0.20 pp).")
    better = copy.deepcopy(summary)
    better[1].update(verdict="better", delta_acc_pp=0.6)
    assert recommendation(better, "32-true", 0.5).endswith("accuracy +0.60 pp better.")
    worse = copy.deepcopy(summary)
    worse[1]["verdict"] = "worse"
    assert recommendation(worse, "32-true", 0.5) == (
        "No precision matched 32-true's accuracy within ±0.5 pp while being timed: "
        "keep 32-true.")
    slower = copy.deepcopy(summary)
    slower[1]["speedup"] = 0.9
    assert recommendation(slower, "32-true", 0.5) == (
        "No precision that matched 32-true's accuracy ran faster here: keep 32-true.")
    bench = load_study(speed_only_study).summary
    assert recommendation(bench, "32-true", 0.5) == (
        "bf16-mixed is the fastest: 1.20× 32-true's throughput, 0.50× the memory "
        "(speed only: accuracy not measured).")
    bench[1]["speedup"] = 0.7
    assert recommendation(bench, "32-true", 0.5) == (
        "Nothing ran faster than 32-true here: keep 32-true (speed only: accuracy not measured).")


def test_emulated_precisions_are_marked_and_the_recommendation_says_why():
    summary = [
        {"precision": "32-true", "verdict": "ok", "val_acc_mean": 0.95, "val_acc_std": 0.0,
         "delta_acc_pp": 0.0, "samples_per_s": 1000.0, "speedup": 1.0, "step_time_ms": 10.0,
         "peak_mem_bytes": 1 << 20, "mem_ratio": 1.0, "final_loss_mean": 0.3,
         "skipped_steps": 0},
        {"precision": "16-mixed", "verdict": "ok", "val_acc_mean": 0.95, "val_acc_std": 0.0,
         "delta_acc_pp": 0.0, "samples_per_s": 200.0, "speedup": 0.2, "step_time_ms": 50.0,
         "peak_mem_bytes": 1 << 20, "mem_ratio": 0.9, "final_loss_mean": 0.3,
         "skipped_steps": 0},
    ]
    table = format_table(summary, "32-true", emulated={"16-mixed"})
    assert "16-mixed (emulated)" in table and "32-true (emulated)" not in table
    assert "`16-mixed` (emulated)" in markdown_table(summary, "32-true", emulated={"16-mixed"})
    sentence = recommendation(summary, "32-true", 0.5, emulated={"16-mixed"})
    assert sentence.startswith("No precision that matched 32-true's accuracy ran faster")
    assert "16-mixed is only emulated on this device" in sentence
    assert recommendation(summary, "32-true", 0.5) == sentence.split(" 16-mixed is only")[0]


def test_a_memory_bound_run_is_pointed_at_the_smallest_rung_that_matched(summary):
    from amptrain.report.tables import memory_rung

    ladder = copy.deepcopy(summary) + [dict(copy.deepcopy(summary[1]),
                                            precision="bf16-true+kahan", speedup=1.2)]
    for row, per_param, verdict in zip(ladder, (16.0, 16.0, 10.0), ("ok", "ok", "ok")):
        row.update(bytes_per_param=per_param, verdict=verdict)
    sentence = ("If memory-bound: bf16-true+kahan keeps 10.0 bytes of weights, gradients and "
                "optimizer state per parameter against 16.0 for 32-true with matching accuracy.")
    assert memory_rung(ladder, "32-true") == sentence
    assert recommendation(ladder, "32-true", 0.5).endswith(sentence)
    ladder[2]["verdict"] = "worse"          # a rung that lost accuracy is not recommended
    assert memory_rung(ladder, "32-true") is None
    assert memory_rung(summary, "32-true") is None   # a study without the ladder


def test_rows_judged_over_seeds_show_the_iqm_intervals_and_a_weak_verdict():
    from amptrain.compare import summarise
    from amptrain.report.tables import columns, seed_warning
    from amptrain.tasks import RegressionTask, Verdict

    class IqmRegression(RegressionTask):
        verdict = Verdict(unit="rel", seed_statistic="iqm")

    # RMSE of three seeds per precision: lower is better, relative change.
    runs = [{"precision": p, "seed": s, "val_rmse": v, "final_loss": 0.1, "skipped_steps": 0,
             "halted": None}
            for p, vs in {"32-true": [2.0, 2.0, 2.0], "bf16-mixed": [2.2, 2.2, 2.2]}.items()
            for s, v in enumerate(vs)]
    rows = summarise("32-true", ["32-true", "bf16-mixed"], runs, {}, 0.02, IqmRegression())
    assert columns(rows)[-2:] == ["RMSE IQM [95 % CI]", "Δ RMSE IQM [95 % CI]"]
    base, bf16 = (re.split(r"\s{2,}", line) for line in format_table(rows, "32-true")
                  .splitlines()[2:])
    assert base[1] == "ok (weak)" and base[-2:] == ["2 [2, 2]", "baseline"]
    assert bf16[1] == "worse (weak)"
    assert bf16[-2:] == ["2.2 [2.2, 2.2]", "+10.00 % [+10.00 %, +10.00 %]"]
    assert "❌ worse (weak)" in markdown_table(rows, "32-true")
    assert seed_warning(rows) == rows[0]["seed_note"] and "3 seeds" in seed_warning(rows)


def test_rows_judged_by_the_mean_have_no_seed_columns(summary):
    from amptrain.report.tables import columns, seed_warning

    assert columns(summary) == _COLUMNS and seed_warning(summary) is None


def test_a_row_is_named_with_its_low_bit_settings_and_the_users_alias(summary):
    """``names`` (study.json's row_names) gives a row's displayed name; ``given`` the
    alias beside it; the row's key, by which the baseline is matched, does not change."""
    assert row_name("mxfp4", {}, {"mxfp4": "mxfp4 rceil"}) == "mxfp4 rceil"
    assert row_name("16-mixed", {"16-mixed": "mixed_float16"}, {"mxfp4": "mxfp4 rceil"}) \
        == "16-mixed (mixed_float16)"
    assert row_name("32-true") == "32-true"
    names = {"16-mixed": "16-mixed shown"}
    assert format_table(summary, "32-true", names=names).splitlines()[3].startswith(
        "16-mixed shown  ")
    lines = markdown_table(summary, "32-true", names=names).splitlines()
    assert lines[2].startswith("| `32-true` (baseline) |")
    assert lines[3].startswith("| `16-mixed shown` |")
