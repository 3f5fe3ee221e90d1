"""tasks/registry.py: the task registry and the one place that decides which task a run's
data and model, a checkpoint, or a compare summary is of (no fallback outside tasks/)."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from amptrain.common.errors import UserError
from amptrain.tasks import (DEFAULT_TASK, TASKS, ClassificationTask, GanTask,
                            LanguageModelTask, RegressionTask, Task, data_task, decide_task,
                            output_noun, saved_task_name, task_class, task_of_summary)
from amptrain.tasks import delta_field


def test_data_that_says_nothing_and_old_checkpoints_are_the_default_tasks():
    assert DEFAULT_TASK == "classification"
    assert data_task(None) == DEFAULT_TASK and data_task("lm") == "lm"
    assert saved_task_name({}) == DEFAULT_TASK
    assert saved_task_name({"run": {"task": "lm"}}) == "lm"
    # The task section (what the task learnt) outranks the run info.
    assert saved_task_name({"task": {"name": "gan"}, "run": {"task": "lm"}}) == "gan"


def test_task_class_and_output_noun_word_known_and_unknown_names():
    assert task_class("lm") is LanguageModelTask and task_class("nope") is None
    assert task_class(None) is None and task_class(3) is None
    assert output_noun("classification") == "classes"
    assert output_noun("regression") == "target values per sample"
    assert output_noun("nope") == output_noun(None) == Task.wording.output_noun == "outputs"


@pytest.mark.parametrize("cls", list(TASKS.values()), ids=list(TASKS))
def test_a_summary_row_tells_its_task_by_the_delta_field(cls):
    row = {"precision": "bf16-mixed", delta_field(cls()): 0.1}
    assert type(task_of_summary(row)) is cls
    assert type(task_of_summary([row, {}])) is cls  # a summary: its first row


def test_a_summary_without_any_tasks_field_is_the_default_tasks():
    assert type(task_of_summary([])) is ClassificationTask
    assert type(task_of_summary({"delta_acc": 1.0})) is ClassificationTask


def _decide(requested, *, hint=None, model_task=None, targets=None, loss=None):
    targets = targets if targets is not None else torch.arange(40) % 4
    data = TensorDataset(torch.randn(len(targets), 3), targets)
    return decide_task(requested, data_hint=hint, model_task=model_task, train_data=data,
                       loss=loss, model="m", data="d", class_names=None)


def test_auto_follows_the_model_then_the_data():
    assert type(_decide("auto")) is ClassificationTask
    assert type(_decide("auto", model_task="gan")) is GanTask
    assert type(_decide("auto", targets=torch.randn(40))) is RegressionTask
    assert type(_decide("auto", hint="regression", targets=torch.randn(40))) is RegressionTask
    # --task given: the model's own task is not asked.
    assert type(_decide("classification", model_task="gan")) is ClassificationTask
    assert _decide("regression", hint="regression", targets=torch.randn(40),
                   loss="l1").loss_name == "l1"


def test_a_task_that_does_not_fit_the_data_is_worded_by_both_tasks():
    with pytest.raises(UserError) as error:
        _decide("lm")
    assert str(error.value) == ("--task lm does not fit --data d, which holds class labels: "
                                "language modelling needs --data text:PATH (or use --task "
                                "classification)")
    with pytest.raises(UserError) as error:
        _decide("auto", hint="lm", model_task="gan")
    assert str(error.value).startswith("--model m trains gan, which does not fit --data d, "
                                       "which holds text for language modelling: gan needs "
                                       "images")
    with pytest.raises(UserError, match="loss huber applies to regression; this run's task "
                                        "is classification"):
        _decide("auto", loss="huber")
    with pytest.raises(UserError, match="every one of the 40 training labels is distinct"):
        _decide("auto", targets=torch.arange(40))
