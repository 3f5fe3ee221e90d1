"""tasks/base.py: what every task shares: an EvalResult's records and metrics by label, and
compare's judgement of the primary metric in the direction that metric improves."""
from __future__ import annotations

import pytest
import torch

from amptrain.tasks.base import EvalResult, EvalSums, Metric, Task


class _Regression(Task):
    """A task whose primary metric improves downwards (and a second one upwards)."""

    name = "regression"
    metrics = (Metric("rmse", "rmse", higher_is_better=False),
               Metric("r2", "r_squared", higher_is_better=True))

    def loss(self, outputs, targets):
        return torch.nn.functional.mse_loss(outputs, targets)

    def check_data(self, data, keyword):
        pass

    def check_outputs(self, outputs, targets, *, model_name, all_targets):
        pass

    def start_eval(self, device):
        return EvalSums()

    def finish_eval(self, sums, gather, loss, samples):
        return EvalResult(loss, samples, {"rmse": loss ** 0.5}, task=self)

    def report(self, result):
        return {"rmse": result.metrics["rmse"]}

    def report_text(self, result):
        return "regression.txt", f"rmse {result.metrics['rmse']:.3f}\n"


class _Accuracy(_Regression):
    metrics = (Metric("acc", "accuracy", higher_is_better=True),)


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


def test_the_primary_metric_is_the_first():
    assert _Regression().primary.key == "rmse" and _Accuracy().primary.key == "acc"


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
    delta, verdict = task.judge(value, baseline, tolerance=0.03 + 1e-12)
    assert delta == pytest.approx(value - baseline)  # the base task's difference
    assert verdict == expected


def test_verdict_boundaries_and_missing_values():
    task = _Regression()
    assert task.verdict(0.5, 0.5) == "ok" and task.verdict(-0.5, 0.5) == "ok"  # inclusive
    assert task.verdict(0.5 + 1e-6, 0.5) == "worse" and task.verdict(-0.5 - 1e-6, 0.5) == "better"
    assert task.verdict(None, 0.5) is None
    assert task.judge(None, 0.9, 0.5) == (None, None) and task.judge(0.9, None, 0.5) == (None, None)


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


def test_three_methods_make_a_task_and_every_other_hook_has_a_default(tmp_path):
    task = _Minimal()
    # Optional checks take anything (built-in tasks override them).
    assert task.check_data(object(), "train_data") is None
    assert task.check_outputs(torch.zeros(2), torch.zeros(2), model_name=None,
                              all_targets=None) is None
    assert (task.delta_unit, task.tolerance_option) == ("pp", "tolerance_pp")
    assert task.default_tolerance() is None
    assert dict(task.loss_names) == {0: "loss"} and task.generates is None
    assert task.eval_learn_split == "val"
    assert (task.data_holds, task.output_noun) == ("targets", "outputs")
    # The default reports: the loss, the samples and every metric, in the metric's format.
    result = task.finish_eval(task.start_eval(torch.device("cpu")), None, 0.25, 8)
    assert task.report(result) == {"loss": 0.25, "samples": 8, "mae": 0.25}
    assert task.report_text(result) == (
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

    assert {name: cls.generates for name, cls in TASKS.items()} == {
        "classification": None, "regression": None, "lm": "text", "gan": "images",
        "ppo": None}
    assert {name: cls.eval_learn_split for name, cls in TASKS.items()} == {
        "classification": "val", "regression": "val", "lm": "val", "gan": "train",
        "ppo": "val"}
    assert GanTask().default_tolerance() == GanTask.default_tolerance_rel == 0.25
    assert LanguageModelTask().default_tolerance() is None
    assert RegressionTask().default_tolerance() is None
    from amptrain.tasks import PpoTask
    assert PpoTask().default_tolerance() == 0.05
    assert dict(GanTask.loss_names) == {0: "d_loss", 1: "g_loss"}
    # Every task words its data and outputs itself (the runner's and resume's messages).
    for cls in TASKS.values():
        assert cls.data_holds != Task.data_holds and cls.data_needs, cls
        assert cls.output_noun != Task.output_noun, cls
