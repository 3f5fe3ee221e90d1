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
