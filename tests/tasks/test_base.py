"""tasks/base.py: what every task shares: an EvalResult's records and metrics by label, and
compare's judgement of the primary metric in the direction that metric improves."""
from __future__ import annotations

import pytest
import torch

from amptrain.tasks import judge
from amptrain.tasks.base import CORE, PARTS, EvalResult, EvalSums, Metric, Metrics, Task, Verdict


class _Regression(Task):
    """A task whose primary metric improves downwards (and a second one upwards)."""

    name = "regression"
    metrics = (Metric("rmse", "rmse", higher_is_better=False),
               Metric("r2", "r_squared", higher_is_better=True))

    verdict = Verdict(unit="rel")

    def loss(self, outputs, targets):
        return torch.nn.functional.mse_loss(outputs, targets)

    def start_eval(self, device):
        return EvalSums()

    def finish_eval(self, sums, gather, loss, samples):
        return EvalResult(loss, samples, {"rmse": loss ** 0.5}, task=self)


class _Accuracy(_Regression):
    metrics = (Metric("acc", "accuracy", higher_is_better=True),)
    verdict = Verdict()  # percentage points of accuracy


def test_record_holds_the_loss_and_every_metric_under_val_keys():
    result = EvalResult(0.5, 100, {"rmse": 0.7, "r2": 0.9}, task=_Regression())
    assert result.record() == {"val_loss": 0.5, "val_rmse": 0.7, "val_r2": 0.9}
    assert EvalResult(0.5, 100).record() == {"val_loss": 0.5}


def test_metrics_read_by_their_label_or_key():
    result = EvalResult(0.5, 100, {"rmse": 0.7, "r2": 0.9}, task=_Regression())
    assert result.rmse == 0.7 and result.r_squared == 0.9 and result.r2 == 0.9
    with pytest.raises(AttributeError):
        result.mae  # noqa: B018 -- not a metric of this task
    with pytest.raises(AttributeError):
        EvalResult(0.5, 100, {"acc": 0.9}).accuracy  # noqa: B018 -- no task, no labels
    assert not hasattr(EvalResult(0.5, 100, {}, task=_Accuracy()), "accuracy")  # not measured


def test_the_primary_metric_is_the_first_and_a_plain_tuple_is_made_metrics():
    assert _Regression().metrics.primary.key == "rmse" and _Accuracy().metrics.primary.key == "acc"
    assert isinstance(_Regression.metrics, Metrics)
    assert _Regression.metrics.get("r2").label == "r_squared"


@pytest.mark.parametrize("task, value, baseline, expected", [
    # higher is better: a rise is better, a fall worse
    (_Accuracy(), 0.95, 0.90, "better"),
    (_Accuracy(), 0.85, 0.90, "worse"),
    # lower is better: a rise is worse, a fall better
    (_Regression(), 0.95, 0.90, "worse"),
    (_Regression(), 0.85, 0.90, "better"),
    # within the tolerance either way: ok
    (_Regression(), 0.93, 0.90, "ok"),
    (_Accuracy(), 0.87, 0.90, "ok"),
])
def test_judge_follows_the_direction_of_the_primary_metric(task, value, baseline, expected):
    # 3 percentage points of accuracy; 3.4 % of the RMSE (0.03 / 0.9 = 3.33 %)
    tolerance = 3.0 + 1e-12 if task.verdict.unit == "pp" else 0.034
    delta, verdict = judge(task, value, baseline, tolerance=tolerance)
    assert delta == pytest.approx(task.verdict.difference(value, baseline))
    assert verdict == expected


def test_the_units_measure_points_or_the_relative_change():
    assert Verdict().difference(0.95, 0.9) == pytest.approx(5.0)        # pp of a fraction
    assert Verdict(unit="rel").difference(0.99, 0.9) == pytest.approx(0.1)
    assert Verdict(unit="rel").difference(1.0, 0.0) == float("inf")
    assert Verdict().tolerance_option == "tolerance_pp"
    assert Verdict(unit="rel").format_tolerance(0.02) == "±2 %"


def test_verdict_boundaries_and_missing_values():
    task = _Regression()
    rmse = task.metrics.primary
    call = task.verdict.call
    assert call(0.5, 0.5, rmse) == "ok" and call(-0.5, 0.5, rmse) == "ok"  # inclusive
    assert call(0.5 + 1e-6, 0.5, rmse) == "worse" and call(-0.5 - 1e-6, 0.5, rmse) == "better"
    assert call(None, 0.5, rmse) is None
    assert judge(task, None, 0.9, 0.5) == (None, None)
    assert judge(task, 0.9, None, 0.5) == (None, None)


@pytest.mark.parametrize("field, value", [("unit", "bp"), ("seed_statistic", "median")])
def test_a_verdict_refuses_an_unknown_unit_or_statistic(field, value):
    with pytest.raises(ValueError, match=f"Verdict.{field} must be one of"):
        Verdict(**{field: value})


def test_a_member_the_parts_own_is_refused_not_ignored():
    with pytest.raises(TypeError, match="delta_unit.*verdict = Verdict"):
        type("Old", (_Regression,), {"delta_unit": "rel"})
    with pytest.raises(TypeError, match="report_text.*Reports subclass"):
        type("Old", (_Regression,), {"report_text": lambda self, result: ("x", "")})


# ------------------------------------------------------------ the declared contract
class _Minimal(Task):
    """A task written against the declared contract: three methods, a name, metrics."""

    name = "minimal"
    metrics = (Metric("mae", "mean absolute error", higher_is_better=False),)

    def loss(self, outputs, targets):
        return (outputs - targets).abs().mean()

    def start_eval(self, device):
        return EvalSums()

    def finish_eval(self, sums, gather, loss, samples):
        return EvalResult(loss, samples, {"mae": loss}, task=self)


def test_three_methods_make_a_task_and_every_part_has_a_ready_made_default(tmp_path):
    task = _Minimal()
    assert len(CORE) <= 11  # the core protocol stays small (issue 43)
    for name, kind in PARTS.items():  # every part declared, typed, never probed
        assert isinstance(getattr(task, name), kind), name
    # Optional checks take anything (built-in tasks override them).
    assert task.checks.check_data(object(), "train_data") is None
    assert task.checks.check_outputs(torch.zeros(2), torch.zeros(2), model_name=None,
                              all_targets=None) is None
    assert (task.verdict.unit, task.verdict.tolerance_option) == ("pp", "tolerance_pp")
    assert task.verdict.default_tolerance is None
    assert dict(task.diagnosis.loss_names) == {0: "loss"} and task.offers.generates is None
    assert task.offers.eval_learn_split == "val"
    assert (task.wording.data_holds, task.wording.output_noun) == ("targets", "outputs")
    # The default reports: the loss, the samples and every metric, in the metric's format.
    result = task.finish_eval(task.start_eval(torch.device("cpu")), None, 0.25, 8)
    assert task.reports.report(result) == {"loss": 0.25, "samples": 8, "mae": 0.25}
    assert task.reports.report_text(result) == (
        "minimal_report.txt",
        "minimal report (8 samples)\n\n  loss  0.2500\n  mean absolute error  0.25\n")
    result.write(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["minimal_report.txt", "report.json"]


@pytest.mark.parametrize("missing", ["loss", "start_eval", "finish_eval"])
def test_a_task_without_one_of_its_three_methods_cannot_be_made(missing):
    body = {name: getattr(_Minimal, name) for name in ("loss", "start_eval", "finish_eval")
            if name != missing}
    incomplete = type("Incomplete", (Task,), {"name": "x", "metrics": (), **body})
    with pytest.raises(TypeError, match=missing):
        incomplete()


def test_the_built_in_tasks_declare_what_they_differ_in():
    from amptrain.tasks import TASKS, GanTask, LanguageModelTask, RegressionTask

    assert {name: cls.offers.generates for name, cls in TASKS.items()} == {
        "classification": None, "regression": None, "lm": "text", "gan": "images",
        "ppo": None}
    assert {name: cls.offers.eval_learn_split for name, cls in TASKS.items()} == {
        "classification": "val", "regression": "val", "lm": "val", "gan": "train",
        "ppo": "val"}
    assert GanTask().verdict.default_tolerance == GanTask.verdict.default_tolerance == 0.25
    assert LanguageModelTask().verdict.default_tolerance is None
    assert RegressionTask().verdict.default_tolerance is None
    from amptrain.tasks import PpoTask
    assert PpoTask().verdict.default_tolerance == 0.05
    assert dict(GanTask.diagnosis.loss_names) == {0: "d_loss", 1: "g_loss"}
    # Every task words its data and outputs itself (the runner's and resume's messages).
    for cls in TASKS.values():
        assert cls.wording.data_holds != Task.wording.data_holds and cls.wording.data_needs, cls
        assert cls.wording.output_noun != Task.wording.output_noun, cls
