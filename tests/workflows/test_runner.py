"""Command-level orchestration (amptrain/runner.py): what a run records about its data,
and seeded preparation of data and model.

``run_training`` and ``run_evaluation`` are exercised end to end by the command tests
(tests/test_cli.py, tests/commands/) and tests/test_hf.py.
"""
from __future__ import annotations


import pytest
import torch

from amptrain.config import RunConfig
from amptrain.common.errors import UserError
from amptrain.models import ModelInputs, build_model
from amptrain.workflows.runner import (assemble, check_precision, decide_task, model_inputs,
                                       data_and_model, run_info)


# ------------------------------------------------------------- what a run records
def test_model_inputs_of_digits(digits):
    assert model_inputs(digits) == ModelInputs(num_classes=10, input_shape=(1, 8, 8),
                                               kind="image", vocab_size=None)


def test_run_info_rebuilds_the_model_without_the_training_flags(digits):
    config = RunConfig.from_options(model="mlp", data="digits", lr=0.5, epochs=9)
    info = run_info(config, digits)
    assert info["model"] == "mlp" and info["data"] == "digits"
    assert info["class_names"] == [str(d) for d in range(10)]
    assert info["inputs"] == {"num_classes": 10, "input_shape": (1, 8, 8), "kind": "image",
                              "vocab_size": None}
    assert info["data_fitted"] == digits.fitted
    # As run_evaluation does: the recorded inputs build the same architecture.
    inputs = ModelInputs(**{**info["inputs"], "input_shape": tuple(info["inputs"]["input_shape"])})
    assert inputs == model_inputs(digits)
    model = build_model(info["model"], inputs)
    assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


# ------------------------------------------------------------- data_and_model
def _weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_the_same_seed_gives_the_same_initial_weights():
    data, first = data_and_model(RunConfig.from_options(model="mlp", data="digits", seed=3))
    torch.manual_seed(12345)  # whatever ran before does not matter
    _, second = data_and_model(RunConfig.from_options(model="mlp", data="digits", seed=3))
    assert model_inputs(data).num_classes == 10
    a, b = _weights(first), _weights(second)
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_another_seed_gives_other_initial_weights():
    _, first = data_and_model(RunConfig.from_options(model="mlp", data="digits", seed=3))
    _, other = data_and_model(RunConfig.from_options(model="mlp", data="digits", seed=4))
    a, b = _weights(first), _weights(other)
    assert [x.shape for x in a] == [y.shape for y in b]
    matrices = [(x, y) for x, y in zip(a, b) if x.ndim >= 2]
    assert matrices and not any(torch.equal(x, y) for x, y in matrices)


def test_task_must_fit_the_data(tmp_path):
    (tmp_path / "a.txt").write_text("words and more words. " * 200)
    lm = RunConfig.from_options(model="gpt", data=f"text:{tmp_path / 'a.txt'}", seq_len=16)
    data, model = data_and_model(lm)
    assert data.task == "lm" and run_info(lm, data)["task"] == "lm"
    assert model(torch.zeros(2, 16, dtype=torch.long)).shape == (2, 16, 256)
    with pytest.raises(UserError, match="--task classification does not fit --data text:"):
        data_and_model(RunConfig.from_options(model="gpt", data=lm.data, seq_len=16,
                                              task="classification"))
    with pytest.raises(UserError, match="--task lm does not fit --data digits, which holds "
                                        "class labels: language modelling needs"):
        data_and_model(RunConfig(task="lm"))


def test_text_encoder_follows_tokenizer_then_model():
    from amptrain.workflows.runner import text_encoder

    assert text_encoder("cnn", None) is None and text_encoder("gpt", "byte") is None


# ------------------------------------------------------------- the one downward pass
def test_assemble_decides_the_task_once_from_the_data(digits):
    run = assemble(RunConfig.from_options(model="mlp", data="digits", seed=3))
    assert run.task.name == "classification" and run.task.class_names == run.data.class_names
    assert run_info(RunConfig(model="mlp"), run.data, run.task)["task"] == "classification"
    _, model = data_and_model(RunConfig.from_options(model="mlp", data="digits", seed=3))
    assert all(torch.equal(a, b) for a, b in zip(run.model.state_dict().values(),
                                                  model.state_dict().values()))


def test_decide_task_checks_loss_and_wording(digits):
    with pytest.raises(UserError, match="loss huber applies to regression"):
        decide_task(RunConfig(loss="huber"), digits)
    with pytest.raises(UserError, match=r"which holds class labels: regression needs float "
                                        r"targets \(npz with float y\) \(or use --task "
                                        r"classification\)"):
        decide_task(RunConfig(task="regression"), digits)


def test_check_precision_resolves_and_refuses_up_front():
    cpu = torch.device("cpu")
    assert check_precision(RunConfig.from_options(precision="32"), cpu).name == "32-true"
    with pytest.raises(UserError, match="fp8 is not supported on mps"):
        check_precision(RunConfig.from_options(precision="fp8"), torch.device("mps"))
