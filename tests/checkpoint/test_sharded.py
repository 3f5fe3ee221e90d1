"""Sharded checkpoints (checkpoint.sharded), in one process: what a save holds, publishing,
rotation, a full disk, and which checkpoint ``--resume`` takes when a run has both kinds.

The real FSDP run (two gloo processes, stopped and resumed bitwise) is
tests/distributed/test_fsdp.py::test_fsdp_sharded_checkpoint_resumes_bitwise.
A planted or damaged ``.metadata`` (checkpoint.dcp_metadata): tests/checkpoint/test_dcp_metadata.py.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from amptrain import checkpoint
from amptrain.checkpoint import CheckpointWriteError, sharded
from amptrain.common.errors import UserError
from tests.checkpoint.helpers import adamw_pair, adamw_step, plain_state

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def _save(writer, directory: Path, step: int, model, optimizer, keep_last: int = 2) -> Path:
    return writer.submit(directory, step, plain_state(step), model, optimizer, is_main=True,
                         keep_last=keep_last)


def _copy(model, optimizer):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            {i: {k: v.clone() for k, v in s.items()}
             for i, s in optimizer.state_dict()["state"].items()})


def test_a_sharded_save_loads_back_exactly_and_is_published(tmp_path):
    model, optimizer = adamw_pair()
    adamw_step(model, optimizer, 1)
    weights, moments = _copy(model, optimizer)
    writer = sharded.ShardedWriter()
    target = _save(writer, tmp_path, 1, model, optimizer)
    adamw_step(model, optimizer, 2)  # training goes on: the save staged its own copy
    assert writer.wait() == target == tmp_path / "sharded" / "step-1"
    assert (tmp_path / "sharded" / "latest").read_text() == "step-1\n"
    assert sharded.latest_sharded(tmp_path) == target and sharded.is_sharded(target)
    assert not list((tmp_path / "sharded").glob(".*"))
    state = sharded.load_state(target)
    assert state["step"] == 1 and state["model"] == {} and state["sharded"] == str(target)

    fresh, fresh_optimizer = adamw_pair(seed=5)
    sharded.load_into(target, fresh, fresh_optimizer)
    for name, value in weights.items():
        assert torch.equal(fresh.state_dict()[name], value), name
    for index, saved in moments.items():
        for key, value in saved.items():
            assert torch.equal(fresh_optimizer.state_dict()["state"][index][key], value)


def test_old_ones_are_pruned_and_the_same_step_is_not_written_twice(tmp_path):
    model, optimizer = adamw_pair()
    writer = sharded.ShardedWriter()
    for step in (1, 2, 3):
        adamw_step(model, optimizer, step)
        _save(writer, tmp_path, step, model, optimizer, keep_last=2)
    writer.wait()
    assert sorted(p.name for p in (tmp_path / "sharded").iterdir()) == \
        ["latest", "step-2", "step-3"]
    before = (tmp_path / "sharded" / "step-3" / ".metadata").stat().st_mtime_ns
    _save(writer, tmp_path, 3, model, optimizer)  # --save-every and an epoch end at once
    assert not writer.busy
    assert (tmp_path / "sharded" / "step-3" / ".metadata").stat().st_mtime_ns == before


def test_a_full_disk_names_the_checkpoint_and_keeps_the_previous_one(tmp_path, monkeypatch):
    from torch.distributed.checkpoint import filesystem

    model, optimizer = adamw_pair()
    writer = sharded.ShardedWriter()
    _save(writer, tmp_path, 1, model, optimizer)
    writer.wait()
    adamw_step(model, optimizer, 2)

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(filesystem, "_write_item", disk_full)
    _save(writer, tmp_path, 2, model, optimizer)
    with pytest.raises(CheckpointWriteError) as failed:
        writer.wait()
    message = str(failed.value)
    assert f"could not write checkpoint {tmp_path / 'sharded' / 'step-2'}" in message
    assert "No space left on device (ENOSPC)" in message
    assert f"the previous checkpoint {tmp_path / 'sharded' / 'step-1'} is intact" in message
    assert sharded.latest_sharded(tmp_path) == tmp_path / "sharded" / "step-1"
    assert writer.wait() is None  # reported once
    # The unfinished directory goes at the next --resume auto.
    assert (tmp_path / "sharded" / ".step-2.tmp").is_dir()
    run = tmp_path.parent / f"{tmp_path.name}-run"
    (run / "checkpoints").mkdir(parents=True)
    os.replace(tmp_path / "sharded", run / "checkpoints" / "sharded")
    path, state = checkpoint.find_resume("auto", run)
    assert path == run / "checkpoints" / "sharded" / "step-1" and state["step"] == 1
    assert not (run / "checkpoints" / "sharded" / ".step-2.tmp").exists()


@pytest.mark.parametrize("full_step, sharded_step, expected", [
    (2, 3, "sharded"), (3, 2, "full"), (3, 3, "full"), (None, 3, "sharded"), (3, None, "full"),
])
def test_resume_takes_the_newer_of_the_full_and_the_sharded_checkpoint(
        tmp_path, full_step, sharded_step, expected):
    directory = tmp_path / "checkpoints"
    if full_step is not None:
        checkpoint.save_run_checkpoint({**plain_state(full_step), "model": {}}, directory,
                                       full_step, keep_last=1)
    if sharded_step is not None:
        model, optimizer = adamw_pair()
        writer = sharded.ShardedWriter()
        _save(writer, directory, sharded_step, model, optimizer)
        writer.wait()
    newest = max(s for s in (full_step, sharded_step) if s is not None)
    for target in ("auto", str(tmp_path), str(directory)):
        path, state = checkpoint.find_resume(target, tmp_path)
        assert state["step"] == newest
        assert (path.name == f"step-{newest}") == (expected == "sharded"), path
        assert ("sharded" in state) == (expected == "sharded")


def test_resume_path_accepts_a_step_directory_and_refuses_a_partial_one(tmp_path):
    model, optimizer = adamw_pair()
    writer = sharded.ShardedWriter()
    _save(writer, tmp_path, 4, model, optimizer)
    writer.wait()
    step_dir = tmp_path / "sharded" / "step-4"
    path, state = checkpoint.find_resume(str(step_dir), None)
    assert path == step_dir and state["step"] == 4
    assert checkpoint.read(step_dir)["step"] == 4
    (step_dir / ".metadata").unlink()
    with pytest.raises(UserError, match="not a sharded checkpoint directory"):
        checkpoint.read(step_dir)


def test_shards_of_another_model_are_one_line(tmp_path):
    model, optimizer = adamw_pair()
    writer = sharded.ShardedWriter()
    _save(writer, tmp_path, 1, model, optimizer)
    writer.wait()
    other = nn.Sequential(nn.Linear(4, 9), nn.Tanh(), nn.Linear(9, 3))
    with pytest.raises(UserError, match="its shards do not load into this model"):
        sharded.load_into(tmp_path / "sharded" / "step-1", other,
                          torch.optim.AdamW(other.parameters()))
