"""A step's outcome is read from the device only when asked; a halt carries its step."""
from __future__ import annotations

import torch

from amptrain.common.errors import TrainingHalted
from amptrain.precision import NonFiniteHalt, StepOutcome


def test_outcome_reads_the_flag_only_when_asked():
    assert StepOutcome(None).skipped() is False          # no guard flag: the step happened
    assert StepOutcome(torch.zeros(())).skipped() is False
    assert StepOutcome(torch.ones(())).skipped() is True
    # On the CPU nothing is copied ahead: the flag stays the tensor the guard produced.
    flag = torch.zeros(())
    outcome = StepOutcome(flag, host_buffer=torch.zeros(()))
    flag.fill_(1.0)
    assert outcome.skipped() is True


def test_halt_is_a_training_halt_with_its_step():
    halt = NonFiniteHalt("loss scale at its floor", step=7)
    assert isinstance(halt, TrainingHalted) and halt.exit_code == 1 and halt.step == 7
