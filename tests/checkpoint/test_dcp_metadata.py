"""checkpoint/dcp_metadata.py: a sharded checkpoint's ``.metadata`` is read without running
code from it (a planted pickle is refused before anything it names is called) and what it
says is checked (every shard a regular file inside the checkpoint, ranges inside the file).

The sharded saves themselves are tests/checkpoint/test_sharded.py.
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from amptrain import checkpoint
from amptrain.checkpoint import sharded
from amptrain.checkpoint.dcp_metadata import (
    METADATA_FILE,
    UnsafeCheckpointError,
    read_metadata,
    safe_reader,
)
from amptrain.common.errors import UserError
from tests.checkpoint.helpers import adamw_pair, adamw_step, plain_state

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


# ------------------------------------------------------------------- a pickle by hand
class _System:
    """Unpickling this calls ``os.system``: the classic planted pickle."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _metadata(**entries):
    from torch.distributed.checkpoint.metadata import (
        Metadata,
        TensorProperties,
        TensorStorageMetadata,
    )

    return Metadata(state_dict_metadata={
        name: TensorStorageMetadata(properties=TensorProperties(dtype=dtype),
                                    size=torch.Size([2, 3]), chunks=[])
        for name, dtype in entries.items()}, storage_data={})


def test_a_pickle_of_dcps_own_metadata_reads_back(tmp_path):
    written = _metadata(weight=torch.bfloat16, bias=torch.float32)
    (tmp_path / METADATA_FILE).write_bytes(pickle.dumps(written))
    metadata = read_metadata(tmp_path)
    assert metadata == written and metadata is not written
    assert metadata.state_dict_metadata["weight"].properties.dtype is torch.bfloat16
    assert metadata.state_dict_metadata["bias"].size == torch.Size([2, 3])


def test_a_pickle_naming_os_system_is_refused_before_it_runs(tmp_path):
    marker = tmp_path / "PWNED"
    metadata = _metadata(weight=torch.float32)
    metadata.planner_data = {"x": _System(f"touch {marker}")}
    (tmp_path / METADATA_FILE).write_bytes(pickle.dumps(metadata))
    with pytest.raises(UnsafeCheckpointError, match=r"refers to posix\.system.*planted"):
        read_metadata(tmp_path)
    assert not marker.exists()
    # The payload is real: pickle's own reader runs it.
    pickle.loads((tmp_path / METADATA_FILE).read_bytes())
    assert marker.exists()


def _fifo(path: Path) -> None:
    os.mkfifo(path)


@pytest.mark.parametrize("make, fragment", [
    (lambda p: p.write_bytes(pickle.dumps({"state_dict_metadata": {}})),
     "holds a dict, not a sharded checkpoint's metadata"),
    (lambda p: p.write_bytes(b"\x80\x05garbage"), "unreadable sharded-checkpoint metadata"),
    (lambda p: None, r"unreadable sharded-checkpoint metadata \(FileNotFoundError"),
    (_fifo, "is a FIFO"),  # never opened: a reader would block on it
], ids=["not-metadata", "garbage", "absent", "fifo"])
def test_what_is_not_dcps_metadata_is_one_line(tmp_path, make, fragment):
    make(tmp_path / METADATA_FILE)
    with pytest.raises(UserError, match=fragment) as refused:
        read_metadata(tmp_path)
    assert not isinstance(refused.value, UnsafeCheckpointError)


# ------------------------------------------------------------------- planted metadata
class _Payload:
    """Unpickling this creates ``marker``: the code a planted ``.metadata`` would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def _saved_step(directory: Path, step: int = 1) -> Path:
    model, optimizer = adamw_pair()
    adamw_step(model, optimizer, 1)
    writer = sharded.ShardedWriter()
    writer.submit(directory, step, plain_state(step), model, optimizer, is_main=True,
                  keep_last=2)
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
    model, optimizer = adamw_pair()
    with pytest.raises(UserError, match="planted"):
        sharded.load_into(step_dir, model, optimizer)
    assert not marker.exists()


def test_auto_refuses_a_planted_step_even_beside_a_good_full_checkpoint(tmp_path):
    directory = tmp_path / "checkpoints"
    checkpoint.save_run_checkpoint({**plain_state(3), "model": {}}, directory, 3, keep_last=1)
    step_dir = _saved_step(directory, 99)
    marker = tmp_path / "PWNED"
    _plant(step_dir, lambda m: m.planner_data.update(x=_Payload(marker)))
    with pytest.raises(UnsafeCheckpointError):
        checkpoint.find_resume("auto", tmp_path)
    assert not marker.exists()


def test_the_safe_reader_reads_what_dcp_wrote_and_is_checked_again_at_load(tmp_path):
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
    # Issue 48: a NUL byte in a shard's name (realpath's ValueError before).
    (lambda d, m: _entry(m, relative_path="__0_0.distcp\0x"), "not a file of the checkpoint"),
    (lambda d, m: _entry(m, relative_path="gone.distcp"), "shard gone.distcp is missing"),
    (lambda d, m: (os.mkfifo(d / "pipe.distcp"), _entry(m, relative_path="pipe.distcp")),
     "is a FIFO (named pipe)"),
    (lambda d, m: _entry(m, offset=10**12), "lies outside the file"),
    (lambda d, m: _entry(m, length=-1), "lies outside the file"),
    (lambda d, m: _entry(m, transform_descriptors=["stream.zstd"]), "stream transform"),
    (lambda d, m: setattr(m, "storage_data", "everything"), "no storage table"),
    (lambda d, m: m.state_dict_metadata.update(x=3), "state-dict entries"),
], ids=["dot-dot", "absolute", "nul-byte", "missing-shard", "fifo-shard", "offset",
        "negative-length", "transform", "no-table", "entry-type"])
def test_metadata_that_points_elsewhere_is_a_damaged_checkpoint(tmp_path, change, fragment):
    step_dir = _saved_step(tmp_path)
    _plant(step_dir, lambda m: change(step_dir, m))
    with pytest.raises(UserError, match="damaged") as refused:
        checkpoint.find_resume(str(step_dir), None)
    assert fragment in str(refused.value) and str(step_dir / ".metadata") in str(refused.value)


def test_a_truncated_metadata_is_skipped_by_auto_and_refused_by_path(tmp_path, caplog):
    directory = tmp_path / "checkpoints"
    checkpoint.save_run_checkpoint({**plain_state(3), "model": {}}, directory, 3, keep_last=1)
    step_dir = _saved_step(directory, 9)
    data = (step_dir / ".metadata").read_bytes()
    (step_dir / ".metadata").write_bytes(data[:len(data) // 2])
    path, state = checkpoint.find_resume("auto", tmp_path)
    assert path == directory / "last.pt" and "unreadable sharded-checkpoint metadata" in caplog.text
    with pytest.raises(UserError, match="unreadable sharded-checkpoint metadata"):
        checkpoint.find_resume(str(step_dir), None)
