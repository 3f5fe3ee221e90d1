"""Where a process sits in a torchrun job (amptrain/distributed/base.py): its device.

The launcher that reads torchrun's environment (amptrain/launch.py) is tested in
tests/test_launch.py.
"""
from __future__ import annotations

import pytest
import torch

from amptrain.distributed import process_device
from amptrain.common.errors import UserError


# ------------------------------------------------------------- unit checks
def test_each_process_takes_its_local_gpu_or_the_cpu():
    assert process_device("cpu", 3) == torch.device("cpu")
    if not torch.cuda.is_available():
        assert process_device("auto", 1) == torch.device("cpu")
    else:
        assert process_device("auto", 0) == torch.device("cuda", 0)
        with pytest.raises(UserError, match="--device cuda"):
            process_device("cuda:0", 0)
