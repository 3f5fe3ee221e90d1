"""trainer/schedule.py: a caller's LR scheduler steps in the unit asked for (Lightning's
convention: per epoch unless ``{"interval": "step"}``), and the first line says it."""
from __future__ import annotations

import pytest
import torch

from amptrain.common.errors import UserError
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification, tiny_mlp

LR0 = 1.0


def _fit(scheduler_of, **options):
    """``fit`` 3 epochs of 2 steps (64 samples at batch 32) with Adadelta and the
    scheduler ``scheduler_of(optimizer)``; returns the trainer."""
    model = tiny_mlp()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=LR0)
    trainer = Trainer(**{"precision": "32-true", "device": "cpu", "no_progress": True,
                         "batch_size": 32, "epochs": 3, **options})
    trainer.fit(model, tiny_classification(n=64), optimizer=optimizer,
                scheduler=scheduler_of(optimizer))
    return trainer


def test_a_bare_scheduler_steps_once_per_epoch_and_the_first_line_says_so(capsys):
    trainer = _fit(lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7))
    assert trainer.scheduler.last_epoch == 3
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(LR0 * 0.7 ** 3)
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("amptrain: precision ")
    assert "your scheduler steps once per epoch" in first


def test_the_dict_form_steps_per_optimizer_step_or_every_n(capsys):
    trainer = _fit(lambda opt: {"scheduler": torch.optim.lr_scheduler.StepLR(
        opt, step_size=1, gamma=0.7), "interval": "step"})
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(LR0 * 0.7 ** 6)
    assert "your scheduler steps once per step" in capsys.readouterr().err.splitlines()[0]
    every_two = _fit(lambda opt: {"scheduler": torch.optim.lr_scheduler.StepLR(
        opt, step_size=1, gamma=0.5), "interval": "step", "frequency": 4})
    assert every_two.optimizer.param_groups[0]["lr"] == pytest.approx(LR0 * 0.5)  # 6 // 4


def test_a_resumed_run_continues_the_per_epoch_schedule(tmp_path):
    def step_lr(opt):
        return {"scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7),
                "interval": "epoch", "frequency": 2}

    whole = _fit(step_lr, epochs=4)
    _fit(step_lr, epochs=3, out=str(tmp_path / "run"))  # stops between the 2 epochs of a step
    resumed = _fit(step_lr, epochs=4, out=str(tmp_path / "run"), resume="auto")
    assert whole.optimizer.param_groups[0]["lr"] == pytest.approx(LR0 * 0.7 ** 2)
    assert resumed.optimizer.param_groups[0]["lr"] == whole.optimizer.param_groups[0]["lr"]
    assert resumed.scheduler.last_epoch == whole.scheduler.last_epoch == 2


@pytest.mark.parametrize("given, message", [
    ({"scheduler": None, "interval": "batch"},
     r"^scheduler's interval must be 'epoch' or 'step' \(got 'batch'\)$"),
    ({"scheduler": None, "interval": "epoch", "frequency": 0},
     r"^scheduler's frequency must be a whole number of epochs >= 1 \(got 0\)$"),
    ({"sched": None}, r"^scheduler as a dict takes the keys 'scheduler' \(required\)"),
    ("cosine", r"^scheduler must be a torch.optim.lr_scheduler object .*\(got str\)$"),
])
def test_a_bad_scheduler_is_refused_in_one_line_naming_scheduler(given, message):
    model = tiny_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if isinstance(given, dict) and "scheduler" in given:
        given = {**given, "scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1)}
    trainer = Trainer(precision="32-true", device="cpu", no_progress=True, batch_size=32,
                      max_steps=1)
    with pytest.raises(UserError, match=message):
        trainer.fit(model, tiny_classification(n=64), optimizer=optimizer, scheduler=given)
