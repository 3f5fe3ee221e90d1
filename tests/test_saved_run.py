"""A saved run read back (amptrain/saved_run.py): the checkpoint a --checkpoint names and
the task an old checkpoint trained."""
from __future__ import annotations

import logging

import pytest

from amptrain import checkpoint
from amptrain.errors import UserError
from amptrain.saved_run import checkpoint_file, saved_task_name


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
    from amptrain.saved_run import load_run

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
