"""compare/options.py: what a study compares and how it measures; the precisions it resolves."""
from __future__ import annotations

import logging

import pytest
import torch

from amptrain.compare import CompareOptions, resolve_precisions
from amptrain.common.errors import UserError, cli_spelling

CPU = torch.device("cpu")


def test_defaults_time_and_train_the_documented_study():
    options = CompareOptions()
    assert options.precisions == "32-true,16-mixed,bf16-mixed" and options.baseline == "32-true"
    assert (options.seeds, options.tolerance_pp, options.interleave) == (2, 0.5, True)
    assert not options.speed_only and options.timed_steps == options.timing_steps == 30


def test_bench_steps_make_a_speed_only_study_of_that_many_timed_steps():
    options = CompareOptions(bench_steps=4, timing_steps=30)
    assert options.speed_only and options.timed_steps == 4


@pytest.mark.parametrize("values, message", [
    (dict(seeds=0), "seeds must be an integer >= 1"),
    (dict(timing_steps=0), "timing_steps must be an integer >= 1"),
    (dict(bench_steps=0), "bench_steps must be an integer >= 1"),
    (dict(timing_warmup=-1), "timing_warmup must be >= 0"),
    (dict(tolerance_pp=-0.1), "tolerance_pp must be a number >= 0"),
    (dict(tolerance_pp=float("nan")), "tolerance_pp must be a number >= 0"),
    (dict(precisions=" , "), "precisions needs at least one precision"),
])
def test_impossible_options_are_refused_naming_the_keyword(values, message):
    with pytest.raises(UserError) as error:
        CompareOptions(**values)
    assert message in str(error.value) and "--" not in str(error.value)


def test_the_command_line_gets_flag_names():
    with cli_spelling(), pytest.raises(UserError, match="--tolerance-pp must be a number >= 0"):
        CompareOptions(tolerance_pp=-1)


def test_precisions_are_canonical_baseline_first_without_repeats(caplog):
    options = CompareOptions(precisions="bf16, mixed_float16,32,bf16-mixed", baseline="fp32")
    with caplog.at_level(logging.INFO, logger="amptrain"):
        assert resolve_precisions(options, CPU) == ("32-true", ["32-true", "bf16-mixed",
                                                                "16-mixed"])
    assert not any("adding the baseline" in r.getMessage() for r in caplog.records)


def test_a_missing_baseline_is_added_and_said_so(caplog):
    with caplog.at_level(logging.INFO, logger="amptrain"):
        baseline, names = resolve_precisions(CompareOptions(precisions="bf16-mixed"), CPU)
    assert (baseline, names) == ("32-true", ["32-true", "bf16-mixed"])
    assert any("adding the baseline 32-true" in r.getMessage() for r in caplog.records)


def test_an_unknown_precision_names_the_option_it_came_from():
    with pytest.raises(UserError, match="^precisions: unknown precision 'fp17'"):
        resolve_precisions(CompareOptions(precisions="32-true,fp17"), CPU)
    with cli_spelling(), pytest.raises(UserError, match="^--baseline: unknown --precision 'x'"):
        resolve_precisions(CompareOptions(baseline="x"), CPU)


def test_auto_resolves_to_what_the_device_would_train_in():
    from amptrain.precision.hardware.support import auto_mode

    _, names = resolve_precisions(CompareOptions(precisions="auto,32-true"), CPU)
    assert names == list(dict.fromkeys(["32-true", auto_mode(CPU)]))


def test_tolerance_is_the_given_one_else_the_tasks_else_the_shared_default():
    from amptrain.compare.options import SHARED_TOLERANCES, resolve_tolerance
    from amptrain.tasks import ClassificationTask, GanTask, LanguageModelTask

    assert CompareOptions().tolerance_rel is None  # the task decides unless given
    gan = resolve_tolerance(CompareOptions(), GanTask())
    assert (gan.value, gan.option, gan.source) == (GanTask.verdict.default_tolerance,
                                                   "tolerance_rel", "task")
    assert "gan task's default" in gan.why and "seeds" in gan.why
    lm = resolve_tolerance(CompareOptions(), LanguageModelTask())
    assert (lm.value, lm.source) == (SHARED_TOLERANCES["tolerance_rel"], "shared") == (0.02,
                                                                                      "shared")
    given = resolve_tolerance(CompareOptions(tolerance_rel=0.1), GanTask())
    assert (given.value, given.source) == (0.1, "given") and "as given" in given.why
    pp = resolve_tolerance(CompareOptions(tolerance_pp=1.0), ClassificationTask())
    assert (pp.value, pp.option, pp.source) == (1.0, "tolerance_pp", "given")
    default_pp = resolve_tolerance(CompareOptions(), ClassificationTask())
    assert (default_pp.value, default_pp.source) == (0.5, "shared")
    with pytest.raises(UserError, match="tolerance_rel must be a number >= 0"):
        CompareOptions(tolerance_rel=-0.5)
