"""The classification task: labels checked against the model's outputs, accuracy and the
classification report, and compare's verdict in percentage points."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from amptrain.data import TensorData
from amptrain.common.errors import UserError
from amptrain.tasks import ClassificationTask, build_task
from amptrain.tasks import judge

X = torch.randn(20, 4)
Y = torch.arange(20) % 3


@pytest.mark.parametrize("labels,names,fragment", [
    (Y.float(), None, "labels are float32"),
    (Y - 1, None, "label -1 is negative"),
    (Y, ["a", "b"], "label 2 is outside the 2 classes"),
])
def test_labels_that_are_not_class_indices(labels, names, fragment):
    with pytest.raises(UserError, match=fragment):
        ClassificationTask(names).checks.check_data(TensorData(X, labels), "train_data")


def test_outputs_against_labels():
    logits = torch.zeros(4, 3)
    task = ClassificationTask([str(i) for i in range(3)])
    task.checks.check_outputs(logits, torch.tensor([0, 1, 2, 2]), model_name=None,
                              all_targets=None)
    with pytest.raises(UserError, match="returns 3 outputs per sample, but the data has 10"):
        ClassificationTask([str(i) for i in range(10)]).checks.check_outputs(
            logits, torch.tensor([0, 1]), model_name="m", all_targets=None)
    with pytest.raises(UserError, match="label 5 is outside the model's 3 outputs"):
        ClassificationTask().checks.check_outputs(logits, torch.tensor([0, 1]), model_name=None,
                                           all_targets=torch.tensor([0, 5]))
    with pytest.raises(UserError, match="one row of class logits per sample"):
        ClassificationTask().checks.check_outputs(torch.zeros(4), torch.tensor([0, 1, 0, 1]),
                                           model_name=None, all_targets=None)
    # Class probabilities (same shape as the logits) are valid cross-entropy targets.
    ClassificationTask().checks.check_outputs(logits, torch.full((4, 3), 1 / 3), model_name=None,
                                       all_targets=None)


def test_evaluation_sums_accuracy_and_reports(tmp_path):
    task = ClassificationTask(["a", "b", "c"])
    sums = task.start_eval(torch.device("cpu"))
    sums.update(torch.tensor([[2.0, 0, 0], [0, 2.0, 0]]), torch.tensor([0, 2]))
    sums.update(torch.tensor([[0, 0, 2.0]]), torch.tensor([2]))
    result = task.finish_eval(sums, lambda t: t, loss=0.5, samples=3)
    assert result.metrics == {"acc": pytest.approx(2 / 3)}
    assert result.accuracy == result.metrics["acc"]
    assert result.record() == {"val_loss": 0.5, "val_acc": pytest.approx(2 / 3)}
    result.write(tmp_path)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["confusion_matrix"] == [[1, 0, 0], [0, 0, 0], [0, 1, 1]]
    assert "macro avg" in (tmp_path / "classification_report.txt").read_text()


def test_verdict_in_percentage_points():
    task = build_task("classification")
    assert judge(task, 0.962, 0.965, tolerance=0.5) == (pytest.approx(-0.3), "ok")
    assert judge(task, 0.95, 0.965, tolerance=0.5) == (pytest.approx(-1.5), "worse")
    assert judge(task, 0.975, 0.965, tolerance=0.5)[1] == "better"
    assert judge(task, None, 0.965, tolerance=0.5) == (None, None)
    with pytest.raises(UserError, match="unknown task 'vision'"):
        build_task("vision")


def test_validation_classes_never_seen_in_training_are_said_once(caplog):
    """Issue 28, class 2: accuracy 0 on a class the model never saw, without a word, looks
    like a broken model; the run says why instead."""
    import logging

    from amptrain.trainer import Trainer
    from tests.conftest import tiny_classification, tiny_mlp

    train = tiny_classification(n=64)
    x, y = train.tensors
    keep = y != 2  # class 2 only in validation
    val = TensorData(x[:16], torch.full((16,), 2))
    with caplog.at_level(logging.WARNING, logger="amptrain"):
        Trainer(device="cpu", no_progress=True, max_steps=1, batch_size=16).fit(
            tiny_mlp(), TensorData(x[keep], y[keep]), val, class_names=["a", "b", "c"])
    said = [r.getMessage() for r in caplog.records if "never occur" in r.getMessage()]
    assert said == ["warning: 16 validation sample(s) are of 1 class(es) that never occur in "
                    "the training data (e.g. 'c'): the model cannot learn them, so they count "
                    "as errors in val_acc"]


def test_every_task_words_its_data_and_outputs():
    from amptrain.tasks import TASKS

    for name, cls in TASKS.items():
        assert cls.wording.data_holds and cls.wording.data_needs and cls.wording.output_noun, name
        needs = cls.wording.data_needs
        assert name in needs or needs.startswith("language modelling")
    assert TASKS["classification"].wording.output_noun == "classes"


# ------------------------------------------------ the end-of-run line (learning_note)
def test_a_classifier_at_chance_ends_with_a_line_saying_so():
    from amptrain.trainer import Trainer
    from tests.conftest import tiny_mlp

    labels = torch.arange(120) % 4
    blank = TensorData(torch.zeros(120, 16), labels)  # nothing to learn from: one answer
    trainer = Trainer(precision="32-true", device="cpu", no_progress=True, batch_size=32,
                      max_steps=1)
    result = trainer.fit(tiny_mlp(features=16, classes=4), blank, blank)
    assert result.val_metrics["acc"] <= 0.25 + 1e-9
    assert result.learning_note is not None and "at chance" in result.learning_note
    assert "4 classes" in result.learning_note


@pytest.mark.parametrize("accuracy, said", [(0.25, True), (0.6, True), (0.64, False),
                                            (0.97, False)])
def test_chance_is_the_most_frequent_class(accuracy, said):
    from amptrain.tasks import EvalResult

    task = ClassificationTask(class_names=["a", "b", "c"])
    targets = np.array([0] * 6 + [1] * 2 + [2] * 2)  # always "a": 60 %
    result = EvalResult(loss=1.0, samples=10, metrics={"acc": accuracy}, task=task,
                        details={"targets": targets, "class_names": ["a", "b", "c"]})
    assert (task.wording.learning_note(result) is not None) is said
