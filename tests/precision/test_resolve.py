"""precision/resolve.py: the precision decision is made once and travels down unchanged
(runner -> Trainer -> Precision -> strategy); ``--precision`` is checked where declared."""
from __future__ import annotations

import pytest
import torch

from amptrain.config import RunConfig, TrainConfig
from amptrain.common.errors import UserError
from amptrain.precision import MODES, Precision, ResolvedPrecision, resolve_precision
from amptrain.precision import resolve as resolve_module
from amptrain.precision.hardware.support import auto_mode
from amptrain.workflows.runner import run_training
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification, tiny_mlp

CPU = torch.device("cpu")


@pytest.fixture
def decisions(monkeypatch):
    """Count the decisions: every one asks support whether the device runs the mode."""
    calls: list[str] = []
    original = resolve_module.unsupported_reason

    def counted(spec, device):
        calls.append(spec.name)
        return original(spec, device)

    monkeypatch.setattr(resolve_module, "unsupported_reason", counted)
    return calls


def test_a_decision_names_the_mode_and_keeps_the_users_spelling():
    decided = resolve_precision("mixed_bfloat16", "cpu")
    assert (decided.name, decided.given, decided.requested) == \
        ("bf16-mixed", "mixed_bfloat16", "bf16-mixed")
    assert decided.device == CPU and decided.spec is MODES["bf16-mixed"]
    auto = resolve_precision("auto", CPU)
    assert (auto.name, auto.given, auto.requested) == (auto_mode(CPU), "auto", "auto")


def test_a_decision_travels_unchanged(decisions):
    decided = resolve_precision("16-mixed", CPU)
    assert resolve_precision(decided) is decided
    assert resolve_precision(decided, "cpu") is decided
    precision = Precision(decided, device="cpu")
    assert precision.mode is decided and precision.name == "16-mixed"
    assert precision.given == "16-mixed" and precision.device == CPU
    assert decisions == ["16-mixed"]  # Precision took the decision, it did not make another


def test_a_decision_for_another_device_is_refused():
    on_meta = resolve_precision("32-true", "meta")
    with pytest.raises(UserError, match="32-true was decided for meta, not cpu"):
        resolve_precision(on_meta, CPU)
    with pytest.raises(UserError, match="decided for meta, not cpu"):
        Precision(on_meta, device="cpu")


def test_the_runner_decides_once_and_the_trainer_keeps_the_decision(decisions):
    config = RunConfig.from_options(model="mlp", data="digits", precision="auto", max_steps=2,
                                    no_progress=True)
    result = run_training(config)
    assert decisions == [auto_mode(CPU)]
    assert result.precision == auto_mode(CPU)


def test_a_library_trainer_decides_once_across_fits(decisions):
    trainer = Trainer(precision="auto", max_steps=2, batch_size=32, no_progress=True)
    decided = trainer.precision.mode
    for _ in range(2):  # each fit trains a fresh model with a fresh Precision
        trainer.fit(tiny_mlp(), tiny_classification())
        assert trainer.precision.mode is decided
    assert decisions == [auto_mode(CPU)]


def test_a_strategys_loss_scaler_does_not_decide_again(decisions):
    from amptrain.distributed.fsdp import sharded_grad_scaler

    precision = Precision("16-mixed", device="cpu", init_scale=256.0)
    scaler = sharded_grad_scaler()
    model = tiny_mlp()
    precision.weights_managed_elsewhere(model, owner="FSDP's fp32 shards", grad_scaler=scaler)
    assert decisions == ["16-mixed"]
    precision.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loss = model(torch.randn(4, 8)).sum()
    precision.backward(loss)
    assert isinstance(precision.guard.scaler, scaler) and precision.loss_scale == 256.0


@pytest.mark.parametrize("name", ["fp12", "O7", "bf-16"])
def test_precision_is_checked_where_it_is_declared(name):
    with pytest.raises(UserError, match=f"unknown precision '{name}'"):
        TrainConfig().with_options(precision=name)
    with pytest.raises(UserError, match=f"unknown precision '{name}'"):
        RunConfig.from_options(precision=name)


def test_an_alias_is_kept_as_the_user_spelled_it():
    config = RunConfig.from_options(precision="O2")
    assert config.precision.name == "O2"
    assert isinstance(resolve_precision(config.precision.name, CPU), ResolvedPrecision)
    assert resolve_precision(config.precision.name, CPU).name == "16-master"
