"""Optimizer and schedule construction: fused kernels where they are exact, decay groups,
warm-up and the schedules' shapes."""
from __future__ import annotations

import math

import pytest
import torch

from amptrain.config import TrainConfig, build_config
from amptrain.optim import build_optimizer, build_scheduler, parameter_groups
from amptrain.precision import Precision
from tests.conftest import tiny_mlp


def test_fused_where_exact_and_not_for_half_sgd_on_the_cpu():
    model = tiny_mlp()
    for name in ("sgd", "adamw"):
        optimizer = build_optimizer(build_config(TrainConfig, {"optimizer": name}), model)
        assert optimizer.defaults["fused"] is True
    # torch 2.13's CPU fused SGD is wrong for half parameters (pytorch#191763).
    assert not Precision("bf16-true", device="cpu").allows_fused("sgd")
    assert not Precision("16-true", device="cpu").allows_fused("sgd")
    assert Precision("bf16-master", device="cpu").allows_fused("sgd")
    assert Precision("bf16-true", device="cpu").allows_fused("adamw")
    optimizer = build_optimizer(build_config(TrainConfig, {"optimizer": "sgd"}), model, fused_allowed=False)
    assert not optimizer.defaults["fused"]


def test_matrices_decay_and_biases_do_not():
    groups = parameter_groups(tiny_mlp(), 0.1)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert all(p.ndim > 1 for p in groups[0]["params"])
    assert all(p.ndim <= 1 for p in groups[1]["params"])


@pytest.mark.parametrize("scheduler,expected", [
    ("none", [0.5, 1.0, 1.0, 1.0, 1.0]),
    # after warm-up, progress (step - 2) / (5 - 2): cos decay from 1 at step 2
    ("cosine", [0.5, 1.0, 1.0, 0.5 * (1 + math.cos(math.pi / 3)),
                0.5 * (1 + math.cos(2 * math.pi / 3))]),
])
def test_warmup_then_schedule(scheduler, expected):
    model = tiny_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    schedule = build_scheduler(build_config(TrainConfig, {"scheduler": scheduler, "warmup_steps": 2}), optimizer, 5)
    seen = []
    for _ in range(5):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert seen == pytest.approx(expected)
