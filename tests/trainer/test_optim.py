"""Optimizer and schedule construction: fused kernels where they are exact, decay groups,
warm-up and the schedules' shapes."""
from __future__ import annotations

import math

import pytest
import torch

from amptrain.config import TrainConfig, build_config
from amptrain.trainer.optim import build_optimizer, build_scheduler, parameter_groups
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
    config = build_config(TrainConfig, {"optimizer": "sgd"})
    optimizer = build_optimizer(config, model, fused_allowed=False)
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
    config = build_config(TrainConfig, {"scheduler": scheduler, "warmup_steps": 2})
    schedule = build_scheduler(config, optimizer, 5)
    seen = []
    for _ in range(5):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert seen == pytest.approx(expected)


# ------------------------------------------------------------------ adamw8bit
def _wide_model() -> torch.nn.Module:
    # Tensors of >= 4096 values are quantised (smaller ones stay unquantised, as in the paper).
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 64))


def _steps(model, optimizer, precision, steps=3, inject_at=None):
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    for i in range(steps):
        with precision.autocast():
            loss = (model(x.to(next(model.parameters()).dtype)).float() ** 2).mean()
        precision.backward(loss)
        if i == inject_at:
            model[0].weight.grad[0, 0] = float("inf")
        precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)


@pytest.mark.slow  # torch.compile of torchao's step: ~45 s once per machine, then cached
def test_adamw8bit_state_is_under_a_third_of_adam_and_takes_the_weight_update_rules():
    from amptrain.compare.ladder import memory_ladder

    ladders = {}
    for optimizer_name, mode, rule in [("adamw", "32-true", "plain"),
                                       ("adamw8bit", "bf16-true", "kahan")]:
        config = build_config(TrainConfig, {"optimizer": optimizer_name, "precision": mode,
                                            "weight_update": rule, "device": "cpu"})
        precision = Precision.from_config(config.precision, device="cpu")
        model = _wide_model()
        optimizer = build_optimizer(config, model)
        model, optimizer = precision.setup(model, optimizer)
        _steps(model, optimizer, precision)
        if optimizer_name == "adamw8bit":
            state = optimizer.state[model[0].weight]
            assert type(state["exp_avg"]).__name__ == "OptimState8bit"
            assert state["exp_avg"].codes.dtype == torch.uint8
            before = [p.detach().clone() for p in model.parameters()]
            comps = [c.buffer.clone() for c in precision.weight_update.chunks]
            _steps(model, optimizer, precision, steps=1, inject_at=0)   # skipped
            assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
            assert all(torch.equal(a, c.buffer)
                       for a, c in zip(comps, precision.weight_update.chunks))
        ladders[optimizer_name] = memory_ladder(model, optimizer, precision)
    state = {name: ladder["optimizer_state_bytes"] for name, ladder in ladders.items()}
    assert state["adamw8bit"] <= 0.3 * state["adamw"]
    assert ladders["adamw"]["bytes_per_param"] == pytest.approx(16.0, abs=0.01)
    # bf16 weights + bf16 grads + bf16 compensation + ~2 bytes of 8-bit moments
    assert ladders["adamw8bit"]["bytes_per_param"] < 8.5


def test_adamw8bit_without_torchao_names_the_flag(monkeypatch):
    import sys

    from amptrain.common.errors import UserError

    monkeypatch.setitem(sys.modules, "torchao.optim", None)
    config = build_config(TrainConfig, {"optimizer": "adamw8bit"})
    with pytest.raises(UserError, match=r"optimizer adamw8bit needs torchao .*lowbit"):
        build_optimizer(config, tiny_mlp())


def test_adamw8bit_on_an_unsupported_device_or_without_a_compiler_names_the_flag(monkeypatch):
    from amptrain.common.errors import UserError

    config = build_config(TrainConfig, {"optimizer": "adamw8bit"})
    with pytest.raises(UserError, match="optimizer adamw8bit runs on cpu and cuda only"):
        build_optimizer(config, tiny_mlp().to("meta"))
    monkeypatch.setattr("amptrain.trainer.optim.shutil.which", lambda name: None)
    with pytest.raises(UserError, match="needs a C.. compiler"):
        build_optimizer(config, tiny_mlp())


@pytest.mark.slow  # torchao's compiled step (cached after the first test)
def test_adamw8bit_with_kahan_resumes_bitwise_from_a_weights_only_checkpoint(tmp_path):
    from amptrain import checkpoint
    from amptrain.common.errors import Preempted
    from amptrain.trainer import Trainer
    from tests.checkpoint.helpers import OPTIONS, TRAIN, StopAt

    def model() -> torch.nn.Module:
        torch.manual_seed(0)   # a 4096-value matrix: its moments are quantised
        return torch.nn.Sequential(torch.nn.Linear(8, 512), torch.nn.Tanh(),
                                   torch.nn.Linear(512, 3))

    options = {**OPTIONS, "precision": "bf16-true", "optimizer": "adamw8bit",
               "weight_update": "kahan", "lr": 1e-3, "epochs": 2}

    def train(out, **more):
        trainer = Trainer(out=str(out), **{**options, **more})
        trainer.fit(model(), TRAIN)
        return trainer

    full = train(tmp_path / "full")
    with pytest.raises(Preempted):
        train(tmp_path / "cut", callbacks=[StopAt(9)])
    saved = checkpoint.load(tmp_path / "cut" / "checkpoints" / "last.pt")  # weights_only
    moments = saved["optimizers"]["model"]["optimizer"]["state"]
    assert any(isinstance(v, dict) for s in moments.values() for v in s.values())
    resumed = train(tmp_path / "cut", resume="auto")
    assert resumed.step == full.step == 14
    for a, b in zip(full.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)
    state = resumed.optimizer.state[resumed.model[0].weight]["exp_avg"]
    assert type(state).__name__ == "OptimState8bit"
    assert torch.equal(state.codes, full.optimizer.state[full.model[0].weight]["exp_avg"].codes)
    assert all(torch.equal(a, b) for a, b in zip(full.precision.weight_update.buffers(),
                                                 resumed.precision.weight_update.buffers()))


def test_adamw8bit_refuses_fsdp_sharded_parameters():
    pytest.importorskip("torchao", reason="adamw8bit needs torchao (amptrain[lowbit])")
    from amptrain.common.errors import UserError
    from amptrain.trainer.optim import adamw8bit_class

    class DTensor(torch.nn.Parameter):  # what FSDP2 shards parameters into, by name
        pass

    model = torch.nn.Linear(4, 4)
    model.weight = DTensor(model.weight.detach())
    with pytest.raises(UserError, match="adamw8bit is not supported with strategy fsdp"):
        adamw8bit_class(model)
