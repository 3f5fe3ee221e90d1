"""Regression: standardised targets inside the task, metrics in the data's units, checks."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from amptrain.data import TensorData
from amptrain.common.errors import UserError
from amptrain.tasks import EvalResult, RegressionTask, build_task, infer_task, resolve_task
from amptrain.trainer import Trainer
from amptrain.tasks import delta_field, judge

NOISE = 0.5


def linear_data(n: int, seed: int, targets: int = 1) -> TensorData:
    """y = x @ w * 10 + 100 + noise: large values in their own units, a known function."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=torch.Generator().manual_seed(seed + 100))
    w = torch.tensor([[1.5, -2.0, 0.5, 3.0, 0.0], [0.5, 0.5, -1.0, 0.0, 2.0]][:targets]).T
    y = x @ w * 10 + 100 + NOISE * torch.randn(n, targets, generator=g)
    return TensorData(x, y.squeeze(1) if targets == 1 else y)


def test_standardises_with_training_statistics_and_reports_in_data_units():
    data = linear_data(500, 0)
    task = RegressionTask()
    task.learn_from(data)
    y = data.tensors[1].double()
    assert task.target_mean == pytest.approx([float(y.mean())])
    assert task.target_std == pytest.approx([float(y.std(unbiased=False))])
    # An output of 0 is the mean; the loss is on standardised units.
    outputs = torch.zeros(len(y), 1)
    assert float(task.loss(outputs, data.tensors[1])) == pytest.approx(1.0, rel=1e-4)
    assert torch.allclose(task.to_units(outputs)[:, 0], torch.full_like(y, y.mean()).float())
    rebuilt = build_task("regression", **task.state())
    assert rebuilt.state() == task.state()


def test_losses_and_multi_target_rows():
    data = linear_data(64, 1, targets=2)
    for loss in ("mse", "l1", "huber"):
        task = RegressionTask(loss=loss)
        task.learn_from(data)
        assert len(task.target_mean) == 2
        value = task.loss(torch.zeros(64, 2), data.tensors[1])
        assert value.ndim == 0 and math.isfinite(float(value))
    with pytest.raises(UserError, match="loss must be one of mse, l1, huber"):
        RegressionTask(loss="cross")


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_learns_a_linear_function_down_to_the_noise(precision):
    train, val = linear_data(2000, 0), linear_data(500, 1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 1))
    trainer = Trainer(precision=precision, epochs=10, batch_size=64, lr=3e-2, no_progress=True,
                      device="cpu", log_every=1000)
    result = trainer.fit(model, train, val)
    assert trainer.task.name == "regression"  # auto: float targets
    metrics = result.val_metrics
    # Targets span ~40 units around 100: RMSE near the noise level means it learnt w.
    assert metrics["rmse"] < (1.15 if precision == "32-true" else 2.0) * NOISE
    assert metrics["r2"] > 0.999
    assert metrics["mse"] == pytest.approx(metrics["rmse"] ** 2)
    assert trainer.last_eval.rmse == metrics["rmse"]  # by key or label
    y_val = val.tensors[1].numpy()
    baseline = float(np.sqrt(np.mean((y_val - y_val.mean()) ** 2)))
    assert metrics["rmse"] < baseline / 20


def test_reports_written_by_evaluation(tmp_path):
    trainer = Trainer(precision="32-true", max_steps=20, batch_size=32, no_progress=True,
                      device="cpu", out=str(tmp_path / "run"))
    torch.manual_seed(0)
    trainer.fit(nn.Linear(5, 1), linear_data(200, 0), linear_data(64, 1))
    text = (tmp_path / "run" / "eval" / "regression_report.txt").read_text()
    assert "RMSE" in text and "R2" in text and "data's units" in text
    assert not (tmp_path / "run" / "eval" / "classification_report.txt").exists()
    records = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert '"val_rmse"' in records and '"val_r2"' in records and '"val_acc"' not in records


@pytest.mark.parametrize("targets, fragment", [
    (torch.tensor([0, 1, 2] * 10), "integer class labels"),
    (torch.tensor([1.0, float("nan")] * 15), "NaN or infinite"),
    (torch.zeros(30, 2, 2), "one value or one row of values"),
])
def test_bad_targets_name_the_option(targets, fragment):
    with pytest.raises(UserError, match=fragment):
        RegressionTask().checks.check_data(TensorData(torch.zeros(30, 5), targets), "train_data")


def test_outputs_must_match_the_targets_per_sample():
    task = RegressionTask()
    with pytest.raises(UserError, match="returns 3 value\\(s\\) per sample, but the regression "
                                        "targets have 1"):
        task.checks.check_outputs(torch.zeros(4, 3), torch.zeros(4), model_name="mlp",
                                  all_targets=None)
    task.checks.check_outputs(torch.zeros(4, 1), torch.zeros(4), model_name=None, all_targets=None)


def test_task_auto_and_loss_only_for_regression():
    floats, ints = linear_data(10, 0), TensorData(torch.zeros(10, 5), torch.zeros(10).long())
    assert infer_task(floats) == "regression" and infer_task(ints) == "classification"
    assert resolve_task("auto", floats, loss="l1").loss_name == "l1"
    with pytest.raises(UserError, match="loss huber applies to regression"):
        resolve_task("auto", ints, loss="huber")


def test_verdict_is_the_relative_change_of_rmse():
    task = RegressionTask()
    delta, verdict = judge(task, 1.01, 1.0, 0.02)
    assert delta == pytest.approx(0.01) and verdict == "ok"
    assert judge(task, 1.05, 1.0, 0.02)[1] == "worse"  # a higher RMSE is worse
    assert judge(task, 0.9, 1.0, 0.02)[1] == "better"
    assert delta_field(task) == "delta_rmse_rel" and task.verdict.format_delta(0.0123) == "+1.23 %"


# ------------------------------------------------ the end-of-run line (learning_note)
def test_an_untrained_regression_ends_with_a_line_saying_so():
    model = nn.Linear(5, 1)
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)  # it predicts the training targets' mean: R² about 0
    trainer = Trainer(precision="32-true", max_steps=1, batch_size=32, no_progress=True,
                      device="cpu", optimizer="sgd", lr=1e-9, momentum=0.0)
    result = trainer.fit(model, linear_data(200, 0), linear_data(64, 1))
    assert result.val_metrics["r2"] < 0.05
    assert result.learning_note is not None and "has not learnt" in result.learning_note
    assert "R²" in result.learning_note and "max_steps" in result.learning_note


@pytest.mark.parametrize("r2, said", [(-0.16, True), (0.01, True), (0.5, False),
                                      (float("nan"), False)])
def test_the_line_comes_only_for_r2_near_zero_or_below(r2, said):
    task = RegressionTask(target_mean=[0.0], target_std=[1.0])
    result = EvalResult(loss=1.0, samples=10, metrics={"rmse": 1.0, "r2": r2}, task=task)
    assert (task.wording.learning_note(result) is not None) is said
