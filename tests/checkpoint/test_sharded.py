"""Sharded checkpoints (checkpoint.sharded), in one process: what a save holds, publishing,
rotation, a full disk, and which checkpoint ``--resume`` takes when a run has both kinds.

The real FSDP run (two gloo processes, stopped and resumed bitwise) is
tests/distributed/test_fsdp.py::test_fsdp_sharded_checkpoint_resumes_bitwise.
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

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def _pair(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def _step(model, optimizer, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    model(torch.randn(5, 4, generator=generator)).square().sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _plain(step: int) -> dict:
    return {"format": checkpoint.FORMAT, "format_version": checkpoint.FORMAT_VERSION,
            "step": step, "epoch": 0, "window_in_epoch": step, "config": {}, "rng": {}}


def _save(writer, directory: Path, step: int, model, optimizer, keep_last: int = 2) -> Path:
    return writer.submit(directory, step, _plain(step), model, optimizer, is_main=True,
                         keep_last=keep_last)


def _copy(model, optimizer):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            {i: {k: v.clone() for k, v in s.items()}
             for i, s in optimizer.state_dict()["state"].items()})


def test_a_sharded_save_loads_back_exactly_and_is_published(tmp_path):
    model, optimizer = _pair()
    _step(model, optimizer, 1)
    weights, moments = _copy(model, optimizer)
    writer = sharded.ShardedWriter()
    target = _save(writer, tmp_path, 1, model, optimizer)
    _step(model, optimizer, 2)  # training goes on: the save staged its own copy
    assert writer.wait() == target == tmp_path / "sharded" / "step-1"
    assert (tmp_path / "sharded" / "latest").read_text() == "step-1\n"
    assert sharded.latest_sharded(tmp_path) == target and sharded.is_sharded(target)
    assert not list((tmp_path / "sharded").glob(".*"))
    state = sharded.load_state(target)
    assert state["step"] == 1 and state["model"] == {} and state["sharded"] == str(target)

    fresh, fresh_optimizer = _pair(seed=5)
    sharded.load_into(target, fresh, fresh_optimizer)
    for name, value in weights.items():
        assert torch.equal(fresh.state_dict()[name], value), name
    for index, saved in moments.items():
        for key, value in saved.items():
            assert torch.equal(fresh_optimizer.state_dict()["state"][index][key], value)


def test_old_ones_are_pruned_and_the_same_step_is_not_written_twice(tmp_path):
    model, optimizer = _pair()
    writer = sharded.ShardedWriter()
    for step in (1, 2, 3):
        _step(model, optimizer, step)
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

    model, optimizer = _pair()
    writer = sharded.ShardedWriter()
    _save(writer, tmp_path, 1, model, optimizer)
    writer.wait()
    _step(model, optimizer, 2)

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
        checkpoint.save_run_checkpoint({**_plain(full_step), "model": {}}, directory,
                                       full_step, keep_last=1)
    if sharded_step is not None:
        model, optimizer = _pair()
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
    model, optimizer = _pair()
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
    model, optimizer = _pair()
    writer = sharded.ShardedWriter()
    _save(writer, tmp_path, 1, model, optimizer)
    writer.wait()
    other = nn.Sequential(nn.Linear(4, 9), nn.Tanh(), nn.Linear(9, 3))
    with pytest.raises(UserError, match="its shards do not load into this model"):
        sharded.load_into(tmp_path / "sharded" / "step-1", other,
                          torch.optim.AdamW(other.parameters()))


# ------------------------------------------------------------------- planted metadata
class _Payload:
    """Unpickling this creates ``marker``: the code a planted ``.metadata`` would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def _saved_step(directory: Path, step: int = 1) -> Path:
    model, optimizer = _pair()
    _step(model, optimizer, 1)
    writer = sharded.ShardedWriter()
    _save(writer, directory, step, model, optimizer)
    return writer.wait()


def _plant(step_dir: Path, change) -> None:
    """Rewrite ``step_dir/.metadata`` (a real one, loaded by DCP's own reader) changed."""
    import pickle

    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(step_dir)).read_metadata()
    change(metadata)
    (step_dir / ".metadata").write_bytes(pickle.dumps(metadata))


def test_a_planted_metadata_payload_never_runs_on_resume_or_load(tmp_path):
    step_dir = _saved_step(tmp_path / "run" / "checkpoints", 99)
    marker = tmp_path / "PWNED"
    _plant(step_dir, lambda m: setattr(m, "version", _Payload(marker)))
    for target in (str(step_dir), "auto", str(tmp_path / "run")):
        with pytest.raises(UserError, match=r"\.metadata: refers to io\.open.*planted"):
            checkpoint.find_resume(target, tmp_path / "run")
    model, optimizer = _pair()
    with pytest.raises(UserError, match="planted"):
        sharded.load_into(step_dir, model, optimizer)
    assert not marker.exists()


def test_auto_refuses_a_planted_step_even_beside_a_good_full_checkpoint(tmp_path):
    directory = tmp_path / "checkpoints"
    checkpoint.save_run_checkpoint({**_plain(3), "model": {}}, directory, 3, keep_last=1)
    step_dir = _saved_step(directory, 99)
    marker = tmp_path / "PWNED"
    _plant(step_dir, lambda m: m.planner_data.update(x=_Payload(marker)))
    with pytest.raises(sharded.UnsafeCheckpointError):
        checkpoint.find_resume("auto", tmp_path)
    assert not marker.exists()


def test_the_safe_reader_reads_what_dcp_wrote_and_is_checked_again_at_load(tmp_path):
    from amptrain.checkpoint.dcp_metadata import read_metadata, safe_reader

    step_dir = _saved_step(tmp_path)
    metadata = read_metadata(step_dir)
    assert "model.0.weight" in metadata.state_dict_metadata
    assert safe_reader(step_dir).read_metadata().storage_data == metadata.storage_data
    # Replaced between the check at discovery and the load: DCP's own read is safe too.
    marker = tmp_path / "PWNED"
    _plant(step_dir, lambda m: setattr(m, "version", _Payload(marker)))
    with pytest.raises(UserError, match="planted"):
        safe_reader(step_dir).read_metadata()
    assert not marker.exists()


def _entry(metadata, **changes):
    import dataclasses

    key = next(iter(metadata.storage_data))
    metadata.storage_data[key] = dataclasses.replace(metadata.storage_data[key], **changes)


@pytest.mark.parametrize("change, fragment", [
    (lambda d, m: _entry(m, relative_path="../../outside/x.distcp"), "outside"),
    (lambda d, m: _entry(m, relative_path="/etc/passwd"), "not a file of the checkpoint"),
    (lambda d, m: _entry(m, relative_path="gone.distcp"), "shard gone.distcp is missing"),
    (lambda d, m: (os.mkfifo(d / "pipe.distcp"), _entry(m, relative_path="pipe.distcp")),
     "is a FIFO (named pipe)"),
    (lambda d, m: _entry(m, offset=10**12), "lies outside the file"),
    (lambda d, m: _entry(m, length=-1), "lies outside the file"),
    (lambda d, m: _entry(m, transform_descriptors=["stream.zstd"]), "stream transform"),
    (lambda d, m: setattr(m, "storage_data", "everything"), "no storage table"),
    (lambda d, m: m.state_dict_metadata.update(x=3), "state-dict entries"),
], ids=["dot-dot", "absolute", "missing-shard", "fifo-shard", "offset", "negative-length",
        "transform", "no-table", "entry-type"])
def test_metadata_that_points_elsewhere_is_a_damaged_checkpoint(tmp_path, change, fragment):
    step_dir = _saved_step(tmp_path)
    _plant(step_dir, lambda m: change(step_dir, m))
    with pytest.raises(UserError, match="damaged") as refused:
        checkpoint.find_resume(str(step_dir), None)
    assert fragment in str(refused.value) and str(step_dir / ".metadata") in str(refused.value)


def test_a_truncated_metadata_is_skipped_by_auto_and_refused_by_path(tmp_path, caplog):
    directory = tmp_path / "checkpoints"
    checkpoint.save_run_checkpoint({**_plain(3), "model": {}}, directory, 3, keep_last=1)
    step_dir = _saved_step(directory, 9)
    data = (step_dir / ".metadata").read_bytes()
    (step_dir / ".metadata").write_bytes(data[:len(data) // 2])
    path, state = checkpoint.find_resume("auto", tmp_path)
    assert path == directory / "last.pt" and "unreadable sharded-checkpoint metadata" in caplog.text
    with pytest.raises(UserError, match="unreadable sharded-checkpoint metadata"):
        checkpoint.find_resume(str(step_dir), None)
