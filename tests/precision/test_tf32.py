"""TF32 switches are set per mode and can be captured and put back."""
from __future__ import annotations

import pytest
import torch

from amptrain.common.errors import AmptrainWarning
from amptrain.precision import MODES
from amptrain.precision.tf32 import MathSwitches, set_tf32
from tests.conftest import fake_gpu


def test_tf32_switches_follow_the_mode_and_are_restored(monkeypatch):
    fake_gpu(monkeypatch, "NVIDIA A100", 8, 0)
    saved = MathSwitches()
    cuda = torch.device("cuda")
    try:
        set_tf32(MODES["tf32"], cuda)
        tf32 = MathSwitches()
        assert tf32.values == (True, True)
        set_tf32(MODES["32-true"], cuda)
        assert MathSwitches().values == (False, False)
        set_tf32(MODES["bf16-mixed"], cuda)
        assert MathSwitches().values == (False, True)  # PyTorch's defaults
        tf32.apply()
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == \
            (True, True)
    finally:
        saved.apply()


def test_cpu_leaves_the_switches_alone():
    before = MathSwitches().values
    # an option that does nothing here reaches library users as a warning, not a log line
    with pytest.warns(AmptrainWarning, match="tf32 has no effect on cpu"):
        set_tf32(MODES["tf32"], torch.device("cpu"))
    assert MathSwitches().values == before
