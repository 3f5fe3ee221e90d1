"""evaluation.py: one evaluation pass: the mean loss over every sample and the task's
metrics, under the precision's autocast, with the model's mode put back."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from amptrain import Precision
from amptrain.trainer.windows import DatasetWindows, SampleOrder
from amptrain.distributed import Strategy
from amptrain.trainer.evaluation import evaluate
from amptrain.trainer.logs import RunLogger
from amptrain.tasks import ClassificationTask
from tests.conftest import tiny_classification, tiny_mlp

CPU = torch.device("cpu")


class _Watched(nn.Module):
    """tiny_mlp, recording whether each forward ran in training mode."""

    def __init__(self) -> None:
        super().__init__()
        self.net = tiny_mlp()
        self.modes: list[bool] = []

    def forward(self, x):
        self.modes.append(self.training)
        return self.net(x)


def _windows(data, batch: int) -> DatasetWindows:
    plan = SampleOrder(len(data), batch, batch, shuffle=False)
    return DatasetWindows(data, plan, CPU)


def _evaluate(model, windows, precision: str = "32-true", **options):
    return evaluate(model, windows, precision=Precision(precision, device="cpu"),
                    task=ClassificationTask(), strategy=Strategy(CPU),
                    logger=RunLogger(None, enabled=False), **options)


def test_the_mean_loss_over_samples_and_the_accuracy():
    data = tiny_classification(n=130)  # windows of 50, 50 and 30: a smaller last batch
    model = _Watched()
    x, y = data.tensors
    with torch.no_grad():
        logits = model.net(x)
    result = _evaluate(model, _windows(data, 50))
    assert result.samples == 130
    assert result.loss == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-6)
    assert result.metrics == {"acc": pytest.approx((logits.argmax(1) == y).float().mean().item())}
    assert result.accuracy == result.metrics["acc"]  # the task's metric by its label
    assert 0 < result.metrics["acc"] < 1  # neither trivially right nor wrong


def test_the_model_runs_in_eval_mode_and_gets_its_mode_back():
    data = tiny_classification(n=64)
    model = _Watched().train()
    _evaluate(model, _windows(data, 32))
    assert model.modes == [False, False] and model.training
    model.eval()
    _evaluate(model, _windows(data, 32))
    assert not model.training


def test_a_callers_loss_replaces_the_tasks_and_no_gradient_is_kept():
    data = tiny_classification(n=64)
    model = _Watched()
    plain = _evaluate(model, _windows(data, 32))
    doubled = _evaluate(model, _windows(data, 32), loss_fn=lambda o, t: 2 * F.cross_entropy(o, t))
    assert doubled.loss == pytest.approx(2 * plain.loss)
    assert doubled.metrics == plain.metrics
    assert all(p.grad is None for p in model.parameters())


def test_the_pass_runs_under_the_precisions_autocast():
    data = tiny_classification(n=64)
    seen: list[torch.dtype] = []
    model = tiny_mlp()
    model.head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    result = _evaluate(model, _windows(data, 64), precision="bf16-mixed")
    assert seen == [torch.bfloat16] and result.samples == 64


def test_a_stop_asked_for_abandons_the_pass_between_batches_with_the_mode_back():
    # A signal during a long evaluation: the Trainer's stopping() turns true, the pass
    # ends at the next batch (EvaluationStopped) instead of after the last one.
    from amptrain.tasks.base import EvaluationStopped

    data = tiny_classification(n=100)
    model = _Watched().train()
    asked = []

    def stopping() -> bool:
        asked.append(len(model.modes))
        return len(model.modes) >= 2  # after two of the five batches

    with pytest.raises(EvaluationStopped):
        _evaluate(model, _windows(data, 20), stopping=stopping)
    assert model.modes == [False, False] and model.training  # two batches, mode put back
    assert asked == [0, 1, 2]
    assert _evaluate(model, _windows(data, 20), stopping=lambda: False).samples == 100
