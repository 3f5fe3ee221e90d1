"""trainer/named.py: --optimizer and --scheduler take any torch.optim class by name with
its keyword arguments, checked in one line (issue 49 friction 5)."""
from __future__ import annotations

import pytest
import torch

from amptrain.common.errors import UserError, cli_spelling
from amptrain.config import TrainConfig
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification, tiny_mlp


def test_a_torch_optimizer_and_schedule_by_name_with_their_arguments(capsys):
    trainer = Trainer(precision="32-true", device="cpu", no_progress=True, batch_size=32,
                      epochs=3, optimizer="Adadelta", optimizer_args='{"rho": 0.8}',
                      scheduler="StepLR", scheduler_args="{'step_size': 1, 'gamma': 0.7}")
    trainer.fit(tiny_mlp(), tiny_classification(n=64))
    optimizer = trainer.optimizer
    assert type(optimizer) is torch.optim.Adadelta
    group = optimizer.param_groups[0]
    # its own defaults (lr 1.0, no weight decay) where no flag was given, rho as asked
    assert group["rho"] == 0.8 and group["weight_decay"] == 0
    assert group["lr"] == pytest.approx(1.0 * 0.7 ** 3)  # StepLR stepped once per epoch
    assert "scheduler StepLR steps once per epoch (scheduler_interval step for per-step)" \
        in capsys.readouterr().err.splitlines()[0]
    per_step = Trainer(precision="32-true", device="cpu", no_progress=True, batch_size=32,
                       epochs=1, optimizer="adadelta", scheduler="StepLR",
                       scheduler_args='{"step_size": 1, "gamma": 0.5}',
                       scheduler_interval="step")
    per_step.fit(tiny_mlp(), tiny_classification(n=64))
    assert per_step.optimizer.param_groups[0]["lr"] == pytest.approx(0.25)


@pytest.mark.parametrize("options, message", [
    (dict(optimizer="Adadleta"), r"^--optimizer Adadleta is not one of amptrain's \(sgd, adamw, "
                                 r"adamw8bit\) nor a torch.optim class: did you mean Adadelta"),
    (dict(optimizer="Adadelta", optimizer_args='{"rhoo": 0.9}'),
     r"^--optimizer-args: Adadelta takes no argument 'rhoo'; did you mean 'rho'\? it takes "),
    (dict(optimizer="Adadelta", optimizer_args='{"lr": 2}'), r"'lr' is set by amptrain"),
    (dict(optimizer="Adadelta", optimizer_args="__import__('os')"),
     r"^--optimizer-args must be a JSON object of keyword arguments"),
    (dict(optimizer="adamw", optimizer_args='{"betas": [0.9, 0.95]}'),
     r"^--optimizer-args is for a torch.optim --optimizer"),
    (dict(scheduler="SteLR"), r"did you mean StepLR"),
    (dict(scheduler="StepLR", scheduler_args='{"step": 1}'),
     r"^--scheduler-args: StepLR takes no argument 'step'"),
    (dict(scheduler="ReduceLROnPlateau"), r"steps on a metric"),
    (dict(scheduler="cosine", scheduler_interval="epoch"),
     r"^--scheduler-interval is for a torch.optim.lr_scheduler --scheduler"),
])
def test_a_bad_name_or_keyword_is_refused_in_one_line(options, message):
    with cli_spelling(), pytest.raises(UserError, match=message):
        TrainConfig.from_options(**options)


def test_a_value_the_class_refuses_names_the_flag():
    trainer = Trainer(precision="32-true", device="cpu", no_progress=True, batch_size=32,
                      max_steps=1, optimizer="Adadelta", optimizer_args='{"rho": -1}')
    refused = (r"^--optimizer-args: Adadelta refused its arguments "
               r"\{\"lr\": 1.0, \"rho\": -1\}: Invalid rho value: -1$")
    with cli_spelling(), pytest.raises(UserError, match=refused):
        trainer.fit(tiny_mlp(), tiny_classification(n=64))
