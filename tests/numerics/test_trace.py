"""The first non-finite value traced: a NaN planted in a user module at a known step is
named with that module and step, in the output and in nonfinite.json."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from amptrain.numerics.trace import first_nonfinite
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification

PLANTED_STEP = 3


class Poison(nn.Module):
    """Turns its input into NaN while ``armed``."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * float("nan") if self.armed else x


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), Poison(), nn.Linear(16, 3))


class Plant:
    """Arms the poison for step PLANTED_STEP only."""

    def __init__(self, poison: Poison) -> None:
        self.poison = poison

    def on_fit_start(self, trainer):
        self.poison.armed = PLANTED_STEP == 1

    def on_step_end(self, trainer):
        self.poison.armed = trainer.step + 1 == PLANTED_STEP


@pytest.mark.parametrize("precision,log_every", [("16-mixed", 1), ("32-true", 1),
                                                 ("16-mixed", 10)])
def test_a_planted_nan_is_traced_to_its_module_and_step(tmp_path, capsys, precision,
                                                        log_every):
    model = _model()
    trainer = Trainer(precision=precision, batch_size=16, max_steps=6, log_every=log_every,
                      no_progress=True, device="cpu", numerics="off", out=tmp_path,
                      callbacks=[Plant(model[2])])
    trainer.fit(model, tiny_classification())
    assert trainer.precision.skipped_steps == 1
    if log_every == 1:   # found out at once: replayed on the step's own weights
        trace = json.loads((tmp_path / "nonfinite.json").read_text())
        assert trace == {"step": PLANTED_STEP, "rank": 0, "module": "2", "phase": "forward",
                         "inputs_finite": True, "exact": True, "note": ""}
        assert ("step 3 turned non-finite: first in module '2' (forward"
                in capsys.readouterr().err)
    else:  # found out at the next step; the poison is disarmed by then -- and replayed
        trace = json.loads((tmp_path / "nonfinite.json").read_text())
        assert trace["step"] == PLANTED_STEP and trace["exact"] is False
    assert all(p.grad is None for p in model.parameters())  # the replay left no gradients


def test_healthy_runs_write_no_trace(tmp_path):
    trainer = Trainer(precision="16-mixed", batch_size=16, max_steps=3, no_progress=True,
                      device="cpu", numerics="off", out=tmp_path)
    trainer.fit(_model(), tiny_classification())
    assert not (tmp_path / "nonfinite.json").exists()


def test_backward_overflow_names_the_module_whose_gradient_turned_first():
    class Explode(nn.Module):
        def forward(self, x):
            return x

    class Big(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return g * float("inf")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 1)

        def forward(self, x):
            return self.c(Big.apply(self.b(self.a(x))))

    net = Net()
    found = first_nonfinite(net, lambda: net(torch.randn(2, 4)).sum().backward())
    # c's output gradient is finite; the infinite one arrives at b's output first
    assert found == ("b", "backward", True)


def test_nonfinite_inputs_are_said():
    net = nn.Sequential(nn.Linear(2, 2))
    found = first_nonfinite(net, lambda: net(torch.tensor([[float("inf"), 1.0]])))
    assert found == ("0", "forward", False)
