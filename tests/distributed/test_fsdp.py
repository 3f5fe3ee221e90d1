"""FSDP2: training in real processes, checkpoints that load on one device, the policy."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from amptrain import checkpoint
from amptrain.distributed.fsdp import _shard_units, fsdp_fp32_modules, fsdp_policy
from amptrain.errors import UserError
from amptrain.precision import Precision
from tests.conftest import tiny_mlp
from tests.distributed import worker
from tests.distributed.helpers import _assert_params_close, _reference


# --------------------------------------------------------- worker scenarios
@pytest.mark.slow
def test_fsdp_trains_and_its_checkpoint_loads_on_one_device(scenarios):
    result = scenarios("fsdp", 0)
    for precision, keep in (("32-true", []), ("bf16-mixed", ["head"])):
        run = result[precision]
        state = checkpoint.load(run["checkpoint"])
        assert all(v.dtype == torch.float32 for v in state["model"].values())
        model = tiny_mlp()
        model.load_state_dict(state["model"])  # strict: plain names, full shapes
        reference = _reference(precision=precision, optimizer="adamw", lr=0.01, keep_fp32=keep)
        losses, ref_losses = run["losses"], [r["loss"] for r in reference.history if "loss" in r]
        assert losses[-1] < losses[0]
        if precision == "32-true":  # same maths as one process: reduce-scatter averages
            _assert_params_close(model.state_dict(), worker.params(reference), 1e-5, 1e-6,
                                 moved_by=1e-2)
            assert losses == pytest.approx(ref_losses, rel=1e-5)
        else:
            assert losses == pytest.approx(ref_losses, rel=2e-2)
    resumed = result["resume"]
    _assert_params_close(resumed["resumed"], resumed["straight"], 1e-6, 1e-7)


# ------------------------------------------------------------- unit checks
@pytest.mark.parametrize("name,param,reduce", [
    ("32-true", None, torch.float32), ("16-mixed", torch.float16, torch.float32),
    ("bf16-mixed", torch.bfloat16, torch.float32), ("16-master", torch.float16, torch.float32),
    ("bf16-master", torch.bfloat16, torch.float32)])
def test_fsdp_policy_follows_the_precision(name, param, reduce):
    precision = Precision(name, device="cpu")
    policy = fsdp_policy(precision)
    assert (policy.param_dtype, policy.reduce_dtype) == (param, reduce)
    assert fsdp_policy(precision, fp32=True).param_dtype is None


@pytest.mark.parametrize("name", ["16-true", "bf16-true"])
def test_fsdp_refuses_modes_without_fp32_weights(name):
    with pytest.raises(UserError, match="-mixed with --strategy fsdp"):
        fsdp_policy(Precision(name, device="cpu"))


def test_fsdp_groups_blocks_and_keeps_fp32_modules_apart():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    assert _shard_units(model) == [model[0], model[1], model[3]]
    fp32 = fsdp_fp32_modules(Precision("bf16-mixed", device="cpu", keep_fp32=["3"]), model)
    assert fp32 == [model[3], model[1]]
    assert fsdp_fp32_modules(Precision("32-true", device="cpu"), model) == []
