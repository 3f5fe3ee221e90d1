"""trainer/parts.py: the Trainer keeps one parts object (a Prepared after ``prepare``, a
RunParts after ``setup``) and its public names read it; ``use_windows`` swaps the windows for
the loop and the checkpoints at once; TaskState is the task's learnt state as a section."""
from __future__ import annotations

import logging

import pytest
import torch

from amptrain.checkpoint.stateful import Stateful
from amptrain.common.errors import UserError
from amptrain.data.core import TensorData
from amptrain.tasks import resolve_task
from amptrain.trainer import Trainer
from amptrain.trainer.parts import Prepared, RunParts, TaskState
from amptrain.trainer.windows import Windows
from tests.conftest import tiny_classification, tiny_mlp

OPTIONS = dict(precision="32-true", device="cpu", deterministic=True, no_progress=True,
               batch_size=32, micro_batch_size=16, max_steps=4, lr=0.05)
DATA = tiny_classification(n=96)

#: Trainer name -> the RunParts field it reads.
SAME_OBJECT = {"model": "model", "task": "task", "evaluator": "evaluator", "steps": "steps",
               "train_windows": "windows", "lr_schedule": "lr_schedule",
               "run_length": "run_length", "checkpointer": "checkpointer"}


def _regression(n: int, scale: float, seed: int = 0) -> TensorData:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorData(x, scale * x[:, :1] + 3.0)


def test_before_setup_every_part_is_none_and_the_counts_zero():
    trainer = Trainer(**OPTIONS)
    for name in SAME_OBJECT:
        assert getattr(trainer, name) is None, name
    for name in ("optimizer", "scheduler", "train_model", "last_eval", "loss_fn"):
        assert getattr(trainer, name) is None, name
    assert trainer.total_steps == 0 and trainer.constant_lr is False
    assert trainer.parts == {} and trainer.optimizers == {}
    with pytest.raises(UserError, match="set the Trainer up first"):
        _ = trainer.micro_batch_size
    with pytest.raises(UserError, match="set the Trainer up first"):
        trainer.train_windows = None


def test_after_setup_the_public_names_read_the_one_run_parts():
    trainer = Trainer(**OPTIONS)
    model = tiny_mlp()
    trainer.setup(model, DATA)
    parts = trainer._built
    assert type(parts) is RunParts
    for name, field in SAME_OBJECT.items():
        assert getattr(trainer, name) is getattr(parts, field), name
    assert trainer.model is model  # 32-true on the CPU: the user's own module
    assert trainer.total_steps == parts.run_length.total_steps == 4
    assert trainer.micro_batch_size == parts.windows.micro_batch == 16
    assert trainer.parts is parts.steps.parts and list(trainer.parts) == ["model"]
    assert trainer.optimizer is parts.steps.only().optimizer
    assert trainer.optimizers == {"model": trainer.optimizer}
    assert trainer.loss_fn is parts.evaluator.loss_fn and trainer.constant_lr is False
    assert trainer.checkpointer.windows is parts.windows


def test_the_callers_optimizer_without_a_schedule_is_a_constant_lr():
    trainer = Trainer(**OPTIONS)
    model = tiny_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer.setup(model, DATA, optimizer=optimizer)
    assert trainer.constant_lr is True and trainer.optimizer is optimizer


def test_prepare_keeps_a_prepared_without_the_training_parts():
    trainer = Trainer(**OPTIONS)
    model = trainer.prepare(tiny_mlp(), class_names=["a", "b", "c"])
    parts = trainer._built
    assert type(parts) is Prepared and not isinstance(parts, RunParts)
    assert trainer.model is parts.model is model and trainer.task is parts.task
    assert trainer.evaluator is parts.evaluator
    for name in ("steps", "train_windows", "lr_schedule", "run_length", "checkpointer"):
        assert getattr(trainer, name) is None, name
    assert trainer.total_steps == 0 and trainer.parts == {}


class _CountingWindows(Windows):
    """The set-up windows' own reader, counting the epochs the loop reads."""

    def __init__(self, inner: Windows) -> None:
        super().__init__(inner.reader)
        self.epochs_read = 0

    def epoch(self, epoch: int, start: int = 0):
        self.epochs_read += 1
        yield from super().epoch(epoch, start)


def test_use_windows_swaps_the_loops_and_the_checkpoints_windows():
    trainer = Trainer(**OPTIONS)
    trainer.setup(tiny_mlp(), DATA)
    original = trainer.train_windows
    counting = _CountingWindows(original)
    trainer.train_windows = counting
    assert trainer._built.windows is counting and trainer.checkpointer.windows is counting
    trainer.run()
    # 4 steps of 3 per epoch: two epochs read, all from the new windows.
    assert trainer.step == 4 and counting.epochs_read == 2 and not original.ended


def test_the_task_section_is_the_tasks_learnt_state():
    trainer = Trainer(**OPTIONS)
    trainer.setup(tiny_mlp(classes=1), _regression(96, scale=2.0))
    task_state = trainer.checkpointer.registry._parts["task"]  # the register's own part
    assert isinstance(task_state, TaskState) and isinstance(task_state, Stateful)
    assert task_state.task is trainer.task
    state = task_state.state_dict()
    assert state["name"] == "regression" == trainer.task.name
    assert state["target_mean"] == pytest.approx([3.0], abs=0.5)
    assert trainer.state_dict()["task"] == state


def _learnt(data: TensorData) -> TaskState:
    task = resolve_task("regression", data)
    task.learn_from(data)
    return TaskState(task)


def test_the_same_learnt_state_loads_silently(caplog):
    saved = _learnt(_regression(64, scale=2.0)).state_dict()
    again = _learnt(_regression(64, scale=2.0))
    with caplog.at_level(logging.WARNING, logger="amptrain"):
        again.load_state_dict(saved)
    assert "the task learnt" not in caplog.text
    assert again.state_dict() == saved


def test_data_that_relearns_other_values_warns(caplog):
    saved = _learnt(_regression(64, scale=2.0)).state_dict()
    other = _learnt(_regression(64, scale=5.0))
    with caplog.at_level(logging.WARNING, logger="amptrain"):
        other.load_state_dict(saved)
    assert "the task learnt" in caplog.text and "not the unbroken run's" in caplog.text
    # What the data taught this run stays: the warning changes nothing.
    assert other.state_dict()["target_std"] != saved["target_std"]


def test_the_task_section_of_an_older_file_is_migrated():
    part = _learnt(_regression(64, scale=2.0))
    assert part.migrate({"task": {"name": "regression", "target_mean": [1.0]}}, 0) == {
        "name": "regression", "target_mean": [1.0]}
    # A file from before tasks kept no task entry: the section is the name alone.
    assert part.migrate({"step": 3}, 0) == {"name": "regression"}
