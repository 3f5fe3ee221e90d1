"""What a checkpoint holds, and that it brings a run back exactly (checkpoint.state).

Weights, optimizer, scheduler, loss scale and random generators are saved and restored
bitwise, also into another precision; weights that do not fit the model are named.
"""
from __future__ import annotations

import pytest
import torch

from amptrain import checkpoint
from amptrain.common.errors import Preempted
from amptrain.trainer import Trainer
from tests.checkpoint.helpers import (
    CLI_RUN,
    COMPARED,
    OPTIONS,
    TRAIN,
    VAL,
    StopAt,
    _error_line,
    _records,
    _train,
    dropout_mlp,
)


def _assert_same_state(a: Trainer, b: Trainer) -> None:
    for (name, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(x, y), name
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    for index, state in sa["state"].items():
        for key, value in state.items():
            assert torch.equal(value, sb["state"][index][key]), (index, key)
    assert a.scheduler.state_dict() == b.scheduler.state_dict()
    assert a.precision.state_dict() == b.precision.state_dict()  # scale AND growth tracker


@pytest.mark.parametrize("stop_at", [7, 10], ids=["epoch-boundary", "mid-epoch"])
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed", "16-master"])
def test_resume_is_bitwise_identical_to_an_uninterrupted_run(tmp_path, precision, stop_at):
    full = _train(tmp_path / "full", precision)

    with pytest.raises(Preempted) as stopped:
        _train(tmp_path / "cut", precision, callbacks=[StopAt(stop_at)])
    assert stopped.value.exit_code == 143
    saved = checkpoint.load(tmp_path / "cut" / "checkpoints" / "last.pt")
    assert (saved["step"], saved["epoch"], saved["window_in_epoch"]) == \
        (stop_at, stop_at // 7, stop_at % 7)

    resumed = _train(tmp_path / "cut", precision, resume="auto")
    assert resumed.step == full.step == 21
    _assert_same_state(full, resumed)
    # The log window in progress at the stop was saved: every logged value matches,
    # including the mean loss of the window that straddles the resume.
    assert _records(tmp_path / "cut") == _records(tmp_path / "full")
    later = [r for r in full.history if r["step"] > stop_at]
    assert [{k: r.get(k) for k in (*COMPARED, "val_acc", "val_loss")} for r in resumed.history] \
        == [{k: r.get(k) for k in (*COMPARED, "val_acc", "val_loss")} for r in later]
    if precision == "16-mixed":
        assert full.precision.skipped_steps > 0  # the scaler really backed off and grew
        assert len({r["loss_scale"] for r in _records(tmp_path / "full")}) > 1


def test_checkpoint_holds_the_documented_state(tmp_path):
    with pytest.raises(Preempted):
        _train(tmp_path, "16-mixed", callbacks=[StopAt(5)])
    state = checkpoint.load(tmp_path / "checkpoints" / "last.pt")
    assert {"model", "optimizers", "precision", "rng", "step", "epoch", "window_in_epoch",
            "config", "amptrain_version", "torch_version", "precision_name", "position",
            "log_interval", "task", "sections"} <= set(state)
    assert set(state["optimizers"]["model"]) == {"optimizer", "scheduler"}
    assert set(state["rng"]) >= {"python", "numpy", "torch"}
    assert all(v.dtype == torch.float32 for v in state["model"].values() if v.is_floating_point())
    scaler = state["precision"]["scaler"]
    assert scaler["scale"] > 0 and "_growth_tracker" in scaler
    assert state["config"]["precision"] == "16-mixed" and state["config"]["batch_size"] == 32
    # Plain data only: it loads without unpickling arbitrary objects.
    torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)


def test_master_weights_are_what_the_checkpoint_keeps(tmp_path):
    with pytest.raises(Preempted):
        trainer = Trainer(precision="16-master", out=str(tmp_path), callbacks=[StopAt(3)],
                          **OPTIONS)
        trainer.fit(dropout_mlp(), TRAIN)
    state = checkpoint.load(tmp_path / "checkpoints" / "last.pt")
    masters = trainer.optimizer.param_groups[0]["params"]
    assert torch.equal(state["model"]["body.0.weight"], masters[0])  # fp32, not fp16-rounded
    assert not torch.equal(state["model"]["body.0.weight"],
                           masters[0].half().float())


# --------------------------------------------------------------- precision change
@pytest.mark.parametrize("first, then", [("16-master", "32-true"), ("32-true", "16-true"),
                                         ("16-mixed", "bf16-mixed")])
def test_resume_in_another_precision(tmp_path, notices, first, then):
    with pytest.raises(Preempted):
        _train(tmp_path, first, callbacks=[StopAt(5)])
    saved = checkpoint.load(tmp_path / "checkpoints" / "last.pt")

    trainer = Trainer(precision=then, out=str(tmp_path), resume="auto", **OPTIONS)
    trainer.setup(dropout_mlp(), TRAIN, VAL)
    assert any(f"trained with {first}, continuing in {then}" in n for n in notices)
    # Weights are the fp32 ones of the checkpoint (rounded only where `then` keeps half).
    dtype = trainer.model.head.weight.dtype
    assert torch.equal(trainer.model.head.weight, saved["model"]["head.weight"].to(dtype))
    # Optimizer state is matched by parameter position, with or without master copies.
    params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    saved_state = saved["optimizers"]["model"]["optimizer"]["state"]
    for index, param in enumerate(params):
        moment = trainer.optimizer.state[param]["exp_avg"]
        assert moment.dtype == param.dtype and moment.shape == param.shape
        assert torch.equal(moment, saved_state[index]["exp_avg"].to(param.dtype))
    # The Adam eps floor belongs to the running precision, not to the checkpoint.
    eps = {g["eps"] for g in trainer.optimizer.param_groups}
    assert eps == ({1e-4} if then == "16-true" else {1e-8})
    result = trainer.run()
    assert result.steps == 21 and torch.isfinite(torch.tensor(result.final_loss))


# ------------------------------------------------------------ another model
def test_checkpoint_of_another_model_names_the_first_mismatched_key(tmp_path, run_cli,
                                                                    cli_checkpoint):
    state = checkpoint.load(cli_checkpoint)
    torch.manual_seed(0)
    from amptrain.models import MLP

    state["model"] = MLP(64, 10, hidden=8).state_dict()  # same names, other shapes
    other = tmp_path / "other-model.pt"
    checkpoint.atomic_save(state, other)
    line = _error_line(*run_cli("train", *CLI_RUN, "--resume", other, "--out", tmp_path / "a"))
    assert "does not fit this model: 'body.1.weight' has shape (8, 64) in the checkpoint " \
           "but (16, 64) in the model" in line
    state["model"] = {"encoder.weight": torch.zeros(2, 2)}
    checkpoint.atomic_save(state, other)
    line = _error_line(*run_cli("train", *CLI_RUN, "--resume", other, "--out", tmp_path / "b"))
    assert "'body.1.weight' is missing from the checkpoint" in line
