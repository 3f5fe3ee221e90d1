"""A saved run read back (amptrain/saved_run.py): the checkpoint a --checkpoint names and
the task an old checkpoint trained."""
from __future__ import annotations

import logging

import pytest

from amptrain import checkpoint
from amptrain.common.errors import UserError
from amptrain.workflows.saved_run import checkpoint_file, saved_task_name


# ------------------------------------------------------------- checkpoint_file
def test_a_checkpoint_file_passes_through(tmp_path):
    path = tmp_path / "step-4.pt"
    path.write_bytes(b"not read here")
    assert checkpoint_file(path) == path
    assert checkpoint_file(str(path)) == path
    # A path that does not exist is passed on too: loading it says what is wrong.
    assert checkpoint_file(tmp_path / "missing.pt") == tmp_path / "missing.pt"


def test_a_run_directory_resolves_to_its_last_checkpoint(tmp_path, caplog):
    run = tmp_path / "run"
    (run / checkpoint.CHECKPOINT_DIR).mkdir(parents=True)
    last = run / checkpoint.CHECKPOINT_DIR / checkpoint.LAST
    last.write_bytes(b"x")
    (run / checkpoint.CHECKPOINT_DIR / "step-2.pt").write_bytes(b"x")
    with caplog.at_level(logging.INFO, logger="amptrain"):
        assert checkpoint_file(run) == last
    assert f"is a directory: using {last}" in caplog.text
    # The checkpoints folder itself works as well.
    assert checkpoint_file(run / checkpoint.CHECKPOINT_DIR) == last


def test_an_empty_directory_is_a_user_error(tmp_path):
    with pytest.raises(UserError) as error:
        checkpoint_file(tmp_path)
    message = str(error.value)
    assert message.startswith(f"--checkpoint {tmp_path} is a directory with no checkpoint in it")
    assert f"RUN_DIR/{checkpoint.CHECKPOINT_DIR}/{checkpoint.LAST}" in message


def test_saved_task_name_reads_old_checkpoints_as_classifiers():
    assert saved_task_name({}) == "classification"
    assert saved_task_name({"run": {"task": "lm"}}) == "lm"
    assert saved_task_name({"task": {"name": "regression"}, "run": {"task": "lm"}}) \
        == "regression"


@pytest.mark.parametrize("inputs", [
    {"num_classes": 10, "input_shape": [64], "kind": "features", "vocab_size": 2 ** 40},
    {"num_classes": 10, "input_shape": [1 << 20, 1 << 20], "kind": "features"},
    {"num_classes": -3, "input_shape": [64], "kind": "features"},
    {"num_classes": 10, "input_shape": [0, "wide"], "kind": "features"},
], ids=["vocab-2^40", "terabyte-input", "negative-classes", "shape-not-counts"])
def test_a_saved_run_asking_for_terabytes_is_a_damaged_checkpoint(tmp_path, inputs):
    from amptrain.workflows.saved_run import load_run

    path = tmp_path / "last.pt"
    checkpoint.atomic_save({"format": checkpoint.FORMAT, "format_version": 1, "model": {},
                            "step": 1, "epoch": 0, "window_in_epoch": 1, "config": {},
                            "run": {"model": "mlp", "inputs": inputs}}, path)
    with pytest.raises(UserError, match="'run' section does not describe the model's inputs "
                                        r"\(a damaged or hand-edited file\)"):
        load_run(str(path))


@pytest.mark.parametrize("special, kind", [("/dev/zero", "a character device")])
def test_a_device_or_fifo_as_checkpoint_is_named(tmp_path, special, kind):
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, what in ((special, kind), (fifo, "a FIFO (named pipe)")):
        with pytest.raises(UserError) as error:
            checkpoint_file(path)
        assert str(error.value) == f"--checkpoint {path} is {what}, not a regular file"


# ------------------------------------------------------------- the one loader
def _mlp_checkpoint(tmp_path, damage=None):
    """A checkpoint of an mlp for digits with the sections `amptrain train` writes."""
    import torch

    from amptrain.models import ModelInputs, build_model
    from tests.workflows.test_generate import _checkpoint

    inputs = ModelInputs(10, (1, 8, 8), kind="image")
    torch.manual_seed(1)
    model = build_model("mlp", inputs)
    path = _checkpoint(tmp_path / "mlp.pt", "mlp", inputs, {"name": "classification"}, model)
    if damage is not None:
        state = checkpoint.load(path)
        damage(state["model"])
        checkpoint.atomic_save(state, path)
    return path, model


def _no_trainer(monkeypatch):
    """Building a Trainer fails the test: the commands load a run without one."""
    from amptrain.trainer import core

    def refuse(*args, **kwargs):
        raise AssertionError("a Trainer was built")

    monkeypatch.setattr(core.Trainer, "__init__", refuse)


def test_open_run_loads_the_model_its_weights_and_its_task(tmp_path, monkeypatch):
    import torch

    from amptrain.workflows.saved_run import open_run
    from amptrain.tasks import ClassificationTask

    _no_trainer(monkeypatch)
    path, model = _mlp_checkpoint(tmp_path)
    saved = open_run(tmp_path / "mlp.pt")
    assert saved.path == path and saved.task_name == "classification"
    assert isinstance(saved.task(["a"] * 10), ClassificationTask)
    loaded = saved.load_model(precision="32-true", device="cpu")
    assert loaded.device == torch.device("cpu") and loaded.precision.name == "32-true"
    assert not loaded.model.training
    for (name, want), got in zip(model.state_dict().items(),
                                 loaded.model.state_dict().values()):
        assert torch.equal(want, got), name
    # A half-weight mode holds the weights in its dtype (what eval and generate run).
    half = saved.load_model(precision="bf16-true", device="cpu")
    weights = [p for p in half.model.parameters() if p.ndim == 2]
    assert weights and all(p.dtype == torch.bfloat16 for p in weights)
    assert all(torch.equal(p.float(), w.bfloat16().float()) for p, w in
               zip(weights, [p for p in model.parameters() if p.ndim == 2]))


def test_weights_that_do_not_fit_the_rebuilt_model_are_one_line(tmp_path):
    from amptrain.workflows.saved_run import open_run

    path, _ = _mlp_checkpoint(tmp_path, damage=lambda weights: weights.pop(next(iter(weights))))
    with pytest.raises(UserError, match="checkpoint does not fit this model"):
        open_run(path).load_model(precision="32-true", device="cpu")


def test_a_checkpoint_not_written_by_train_is_refused_by_the_loader(tmp_path):
    from amptrain.workflows.saved_run import open_run

    path = tmp_path / "library.pt"
    checkpoint.atomic_save({"format": checkpoint.FORMAT, "format_version": 1, "model": {},
                            "step": 1, "epoch": 0, "window_in_epoch": 1, "config": {}}, path)
    with pytest.raises(UserError, match="was not written by `amptrain train`"):
        open_run(path)


def test_eval_without_a_trainer_measures_the_saved_model(tmp_path, monkeypatch):
    import json

    import torch

    from amptrain.data import DataOptions, build_data
    from amptrain.workflows.runner import run_evaluation

    _no_trainer(monkeypatch)
    path, model = _mlp_checkpoint(tmp_path)
    result, trained_with = run_evaluation(checkpoint_path=path, data=None,
                                          precision="32-true", out=str(tmp_path / "ev"),
                                          device="cpu")
    assert trained_with == "unknown"  # the hand-made checkpoint names no precision
    val = build_data("digits", DataOptions(fitted={}, task="classification")).val
    x, y = val.tensors
    model.eval()
    with torch.no_grad():
        logits = model(x)
    assert result.samples == len(y)
    assert result.metrics["acc"] == pytest.approx(float((logits.argmax(1) == y).float().mean()))
    assert result.loss == pytest.approx(float(torch.nn.functional.cross_entropy(logits, y)),
                                        rel=1e-5)
    report = json.loads((tmp_path / "ev" / "eval" / "report.json").read_text())
    assert report["accuracy"] == result.metrics["acc"] and report["samples"] == len(y)
