"""compare/seeds.py: the IQM, its stratified-bootstrap interval, the difference to the
baseline with its interval, and the verdict over seeds."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from amptrain.compare import seeds
from amptrain.compare.seeds import (
    MAX_REPS,
    bootstrap_interval,
    difference_interval,
    iqm,
    judge_over_seeds,
    seed_fields,
    seed_verdict,
)
from amptrain.tasks import ClassificationTask, RegressionTask, Verdict


class IqmClassification(ClassificationTask):
    """Classification judged over seeds (the test's stand-in for an RL task)."""

    verdict = Verdict(seed_statistic="iqm")


class IqmRegression(RegressionTask):
    """A lower-is-better metric in relative change, judged over seeds."""

    verdict = Verdict(unit="rel", seed_statistic="iqm")


# ------------------------------------------------------------------- the IQM
@pytest.mark.parametrize("scores, expected", [
    ([1, 2, 3, 4, 5, 6, 7, 8], (3 + 4 + 5 + 6) / 4),      # 8 scores: 2 cut from each end
    ([10, 1, 3, 2, 100], (2 + 3 + 10) / 3),               # 5: int(1.25) = 1 cut, unweighted
    ([1, 2, 3, 4, 5, 6, 100], (2 + 3 + 4 + 5 + 6) / 5),   # 7: int(1.75) = 1, no fractions
    ([5, 1, 9], 5.0),                                     # 3: nothing cut, the plain mean
    ([4, 1], 2.5),
    ([[1, 2], [3, 40]], (2 + 3) / 2),                     # a runs x tasks matrix: pooled
])
def test_iqm_is_rliables_trimmed_mean_computed_by_hand(scores, expected):
    assert iqm(scores) == pytest.approx(expected)
    # rliable.metrics.aggregate_iqm is exactly this scipy call.
    assert iqm(scores) == pytest.approx(scipy.stats.trim_mean(scores, 0.25, axis=None))


def test_iqm_of_nothing_is_refused():
    with pytest.raises(ValueError):
        iqm([])


# ------------------------------------------------------------ the intervals
def test_interval_of_a_tight_sample_holds_its_true_iqm_and_is_narrow():
    rng = np.random.default_rng(7)
    scores = 450 + rng.normal(0, 1, size=20)
    point, low, high = bootstrap_interval(scores)
    assert point == pytest.approx(scipy.stats.trim_mean(scores, 0.25))
    assert low <= 450 <= high and low <= point <= high
    assert high - low < 2


def test_interval_is_reproducible_and_follows_its_seed():
    scores = [3.0, 9.0, 1.0, 7.0, 4.0, 8.0]
    assert bootstrap_interval(scores) == bootstrap_interval(scores)
    assert bootstrap_interval(scores, seed=1) != bootstrap_interval(scores, seed=2)


def test_a_constant_sample_has_a_point_interval():
    assert bootstrap_interval([2.5] * 5) == (2.5, 2.5, 2.5)


def test_resampling_is_stratified_within_each_environment():
    # Every resample keeps four scores of each stratum; unstratified resampling would mix
    # the 0s and 10s in any proportion and the IQM would vary.
    point, low, high = bootstrap_interval([[0, 0, 0, 0], [10, 10, 10, 10]])
    assert (point, low, high) == (5.0, 5.0, 5.0)
    flat = bootstrap_interval([0, 0, 0, 0, 10, 10, 10, 10])
    assert flat[1] < 5 < flat[2]


@pytest.mark.parametrize("reps", [0, -1, MAX_REPS + 1])
def test_the_number_of_resamples_is_bounded(reps):
    with pytest.raises(ValueError, match="reps"):
        bootstrap_interval([1.0, 2.0], reps=reps)


def test_difference_of_clearly_separated_samples_excludes_zero():
    fp32 = [450.0, 455.0, 460.0, 452.0, 458.0]
    half = [200.0, 210.0, 205.0, 190.0, 215.0]
    delta, low, high = difference_interval(half, fp32, lambda a, b: a - b, paired=True)
    assert delta == pytest.approx(iqm(half) - iqm(fp32))
    assert low <= delta <= high < 0


def test_paired_seeds_cancel_what_every_precision_shares():
    # Seed i of both precisions shares its luck: the same shift on every seed is all the
    # difference there is. Paired, every resample sees exactly it; unpaired, the seeds'
    # spread hides it.
    base = [100.0, 300.0, 150.0, 400.0, 250.0, 200.0]
    shifted = [b + 1 for b in base]
    paired = difference_interval(shifted, base, lambda a, b: a - b, paired=True)
    assert paired == pytest.approx((1.0, 1.0, 1.0))
    _, low, high = difference_interval(shifted, base, lambda a, b: a - b, paired=False)
    assert low < 0 < high


def test_paired_scores_need_the_same_seeds():
    with pytest.raises(ValueError, match="paired"):
        difference_interval([1.0, 2.0], [1.0, 2.0, 3.0], lambda a, b: a - b, paired=True)


def test_difference_in_the_tasks_unit():
    task = IqmRegression()  # relative change: (value - baseline) / |baseline|
    delta, low, high = difference_interval([2.2] * 5, [2.0] * 5, task.verdict.difference,
                                           paired=True)
    assert (delta, low, high) == pytest.approx((0.1, 0.1, 0.1))


# ---------------------------------------------------------------- the verdict
@pytest.mark.parametrize("mean_delta, low, high, higher, expected", [
    (0.2, -0.5, 0.8, True, "ok"),         # interval holds 0, mean change within 0.5
    (0.5, -0.1, 1.0, True, "ok"),         # the tolerance's edge counts as within
    (0.3, 0.1, 0.6, True, "better"),      # within the tolerance, but clearly above 0
    (-0.3, -0.6, -0.1, True, "worse"),
    (-2.0, -4.0, 0.5, True, "worse"),     # holds 0, but the mean change is too large
    (2.0, -0.5, 4.0, True, "better"),
    (-0.3, -0.6, -0.1, False, "better"),  # lower is better (perplexity, RMSE)
    (2.0, -0.5, 4.0, False, "worse"),
    (None, None, None, True, None),
])
def test_verdict_asks_the_interval_and_the_mean_change(mean_delta, low, high, higher,
                                                        expected):
    assert seed_verdict(mean_delta, low, high, 0.5, higher) == expected


# ----------------------------------------------------------- compare's fields
def test_only_a_task_judged_over_seeds_adds_fields():
    assert seed_fields(ClassificationTask()) == ()
    assert seed_fields(IqmRegression()) == (
        "val_rmse_iqm", "val_rmse_iqm_low", "val_rmse_iqm_high", "delta_rmse_iqm_rel",
        "delta_rmse_iqm_rel_low", "delta_rmse_iqm_rel_high", "weak_verdict", "seed_note")


def test_judging_five_seeds_is_not_weak_and_matches_the_pieces():
    task = IqmClassification()
    base = {s: 0.90 + 0.01 * s for s in range(5)}
    own = {s: v - 0.001 for s, v in base.items()}
    fields = judge_over_seeds(own, base, task, 0.5)
    assert list(fields) == [*seed_fields(task), "verdict"]
    point, low, high = bootstrap_interval(list(own.values()))
    assert (fields["val_acc_iqm"], fields["val_acc_iqm_low"], fields["val_acc_iqm_high"]) == \
        (point, low, high)
    # Percentage points of accuracy, paired seed by seed: -0.1 pp on every resample.
    assert fields["delta_acc_iqm_pp"] == pytest.approx(-0.1)
    assert fields["delta_acc_iqm_pp_low"] == pytest.approx(-0.1)
    assert fields["delta_acc_iqm_pp_high"] == pytest.approx(-0.1)
    assert fields["verdict"] == "worse"  # tiny, but every seed lost it: not zero
    assert fields["weak_verdict"] is False and fields["seed_note"] is None


def test_fewer_than_five_seeds_is_a_weak_verdict():
    task = IqmClassification()
    base = {0: 0.90, 1: 0.95, 2: 0.80}
    fields = judge_over_seeds(dict(base), base, task, 0.5)
    assert fields["verdict"] == "ok" and fields["delta_acc_iqm_pp"] == 0.0
    assert fields["weak_verdict"] is True
    assert "weak verdict: 3 seeds" in fields["seed_note"]
    assert f"--seeds {seeds.MIN_SEEDS}" in fields["seed_note"]


def test_a_precision_without_values_has_no_verdict():
    fields = judge_over_seeds({}, {0: 0.9}, IqmClassification(), 0.5)
    assert fields["verdict"] is None and fields["val_acc_iqm"] is None


def test_unpaired_when_the_seeds_differ():
    # A precision that lost a seed (its run gave no value) is resampled on its own.
    task = IqmClassification()
    base = {s: 0.9 for s in range(5)}
    own = {s: 0.9 for s in range(4)}
    fields = judge_over_seeds(own, base, task, 0.5)
    assert fields["delta_acc_iqm_pp"] == pytest.approx(0.0)
    assert fields["verdict"] == "ok" and fields["weak_verdict"] is True


def test_a_baseline_of_zero_has_no_finite_relative_interval():
    # The relative change from an IQM of 0 is infinite: no interval, the mean's rule judges.
    fields = judge_over_seeds({0: 1.0, 1: 1.0}, {0: 0.0, 1: 0.0}, IqmRegression(), 0.02)
    assert fields["delta_rmse_iqm_rel"] == float("inf")
    assert fields["verdict"] == "worse"  # a higher RMSE


def test_an_unknown_seed_statistic_is_a_programming_error():
    with pytest.raises(ValueError, match="seed_statistic must be one of"):
        Verdict(seed_statistic="median")
