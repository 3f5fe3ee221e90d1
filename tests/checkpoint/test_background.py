"""Checkpoint writes on a background thread (checkpoint.background, the Trainer's saves).

The copy a save takes is the state at that step, whatever training does next; one write
is in flight at a time; a failed write raises its error (naming the file) at the next
wait and leaves the previous checkpoint; and real training processes killed or stopped
during a background write resume from a good checkpoint.
"""
from __future__ import annotations

import errno
import os
import signal
import threading
from pathlib import Path

import pytest
import torch

from amptrain import checkpoint
from amptrain.checkpoint import BackgroundWriter, CheckpointWriteError
from amptrain.checkpoint import files as checkpoint_files
from tests.checkpoint.helpers import (
    _assert_matches,
    _finish,
    _start,
    _stderr,
    _train,
    _wait_for,
)


def _state(step: int, weight: torch.Tensor) -> dict:
    return {"format": checkpoint.FORMAT, "format_version": checkpoint.FORMAT_VERSION,
            "step": step, "epoch": 0, "window_in_epoch": step, "config": {},
            "model": {"w": weight, "tied": weight}, "rng": {"python": (3, (2, 3), None)}}


def _writer_of(directory: Path, step: int, gate: threading.Event | None = None,
               done: list[int] | None = None):
    def write(state):
        if gate is not None:
            gate.wait(timeout=60)
        path = checkpoint.save_run_checkpoint(state, directory, step, keep_last=2)
        if done is not None:
            done.append(step)
        return path
    return write


def _unfinished(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


# ---------------------------------------------------------------- in-process
def test_the_copy_is_the_state_at_save_time_and_buffers_are_reused(tmp_path):
    writer = BackgroundWriter()
    weight = torch.arange(6.0).reshape(2, 3)
    gate = threading.Event()
    writer.submit(_state(1, weight), _writer_of(tmp_path, 1, gate), tmp_path)
    weight.add_(100)  # training goes on changing the weights in place
    gate.set()
    assert writer.wait() == tmp_path / checkpoint.LAST
    saved = checkpoint.load(tmp_path / checkpoint.LAST)
    assert torch.equal(saved["model"]["w"], torch.arange(6.0).reshape(2, 3))
    # Tied tensors stay one tensor in the file, as torch.save of the live state keeps them.
    assert saved["model"]["w"].untyped_storage().data_ptr() == \
        saved["model"]["tied"].untyped_storage().data_ptr()
    assert saved["rng"] == {"python": (3, (2, 3), None)} and not writer.busy

    staged_before = writer._staging._buffers[("model", "w")]
    writer.submit(_state(2, weight), _writer_of(tmp_path, 2), tmp_path)
    writer.wait()
    assert writer._staging._buffers[("model", "w")] is staged_before  # no new allocation
    assert torch.equal(checkpoint.load(tmp_path / checkpoint.LAST)["model"]["w"], weight)


def test_a_save_requested_while_one_is_in_flight_waits_and_both_files_are_right(tmp_path):
    writer = BackgroundWriter()
    gate, done = threading.Event(), []
    first, second = torch.full((4,), 1.0), torch.full((4,), 2.0)
    writer.submit(_state(1, first), _writer_of(tmp_path, 1, gate, done), tmp_path)
    assert writer.busy and done == []
    finished_when_submit_returned: list[list[int]] = []

    def second_save():
        writer.submit(_state(2, second), _writer_of(tmp_path, 2, None, done), tmp_path)
        finished_when_submit_returned.append(list(done))

    saver = threading.Thread(target=second_save)
    saver.start()
    saver.join(timeout=0.5)
    assert saver.is_alive(), "the second save did not wait for the first write"
    gate.set()
    saver.join(timeout=60)
    assert finished_when_submit_returned == [[1]]  # it returned only after write 1 ended
    writer.wait()
    assert done == [1, 2]
    assert torch.equal(checkpoint.load(tmp_path / "step-1.pt")["model"]["w"], first)
    assert torch.equal(checkpoint.load(tmp_path / "step-2.pt")["model"]["w"], second)
    assert checkpoint.load(tmp_path / checkpoint.LAST)["step"] == 2
    assert _unfinished(tmp_path) == []


def _disk_fills_on_write(monkeypatch, number: int) -> None:
    real, calls = checkpoint_files._write, []

    def write(state, handle):
        calls.append(1)
        if len(calls) == number:
            handle.write(b"PK\x03\x04 partial bytes")  # some bytes got out before the disk filled
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(state, handle)

    monkeypatch.setattr(checkpoint_files, "_write", write)


def test_a_full_disk_in_the_background_is_raised_at_the_next_wait(tmp_path, monkeypatch):
    _disk_fills_on_write(monkeypatch, number=2)
    writer = BackgroundWriter()
    writer.submit(_state(1, torch.ones(3)), _writer_of(tmp_path, 1), tmp_path)
    writer.submit(_state(2, torch.zeros(3)), _writer_of(tmp_path, 2), tmp_path)
    with pytest.raises(CheckpointWriteError) as failed:
        writer.wait()
    last = tmp_path / checkpoint.LAST
    assert f"could not write checkpoint {last}: No space left on device (ENOSPC) on the " \
        f"disk mounted at " in str(failed.value)
    assert f"the previous checkpoint {last} is intact" in str(failed.value)
    assert checkpoint.load(last)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "step-1.pt"]
    assert writer.wait() is None  # reported once


def test_a_full_disk_at_the_last_background_save_fails_the_run(tmp_path, monkeypatch):
    # 200 samples in batches of 32: 7 steps an epoch, 3 epochs. Saves: step 7 and 14 (epoch
    # ends, in the background) and 21 (the end). The write at step 14 fails; the run stops
    # at the next save with the error, and last.pt is still step 7's.
    _disk_fills_on_write(monkeypatch, number=2)
    with pytest.raises(CheckpointWriteError, match="No space left on device"):
        _train(tmp_path, "32-true")
    directory = tmp_path / "checkpoints"
    assert checkpoint.load(directory / "last.pt")["step"] == 7
    assert sorted(p.name for p in directory.iterdir()) == ["last.pt", "step-7.pt"]


def test_keep_last_rotation_with_background_saves(tmp_path):
    trainer = _train(tmp_path, "32-true", save_every=2, keep_last=2)
    directory = tmp_path / "checkpoints"
    assert not trainer.checkpointer.writes.busy
    assert sorted(p.name for p in directory.iterdir()) == ["last.pt", "step-20.pt",
                                                           "step-21.pt"]
    for name, step in (("step-20.pt", 20), ("step-21.pt", 21), ("last.pt", 21)):
        assert checkpoint.load(directory / name)["step"] == step
    final = checkpoint.load(directory / "last.pt")["model"]
    assert all(torch.equal(final[k], v) for k, v in trainer.model.state_dict().items())


# ------------------------------------------------------------ real processes
def _stuck_write_under_way(out: Path) -> bool:
    """Write 2 is stalled (its temporary file holds bytes) and write 1 is done."""
    directory = out / "checkpoints"
    if not (directory / "step-10.pt").exists():
        return False
    return any(p.stat().st_size > 0 for p in directory.glob(".last.pt.*.tmp"))


def _logged_past(out: Path, step: int) -> bool:
    path = out / "metrics.jsonl"
    return path.exists() and f'"step": {step},' in path.read_text()


@pytest.mark.slow
def test_sigterm_during_a_background_write(tmp_path, uninterrupted):
    # Write 2 (step 20) stalls for 3 s after its first bytes; SIGTERM arrives meanwhile.
    # The stop waits for it, writes its own checkpoint, and the resumed run ends bitwise
    # where an uninterrupted one does.
    proc = _start(tmp_path, "--save-every", "10", **{checkpoint.SLOW_SAVE_ENV: "2:3"})
    _wait_for(lambda: _stuck_write_under_way(tmp_path), proc)
    proc.send_signal(signal.SIGTERM)
    code, err = _finish(proc, timeout=120)
    assert code == 143, err
    stopped = int(err.split("stopped by SIGTERM after step ")[1].split(";")[0])
    directory = tmp_path / "checkpoints"
    assert checkpoint.load(directory / "last.pt")["step"] == stopped >= 20
    assert checkpoint.load(directory / "step-20.pt")["step"] == 20  # the stalled write ended
    assert not list(directory.glob(".*"))

    code, err = _finish(_start(tmp_path, "--save-every", "10", "--resume", "auto"))
    assert code == 0, err
    assert f"at step {stopped}" in err
    _assert_matches(tmp_path, uninterrupted)


@pytest.mark.slow
def test_sigkill_during_a_background_write_resumes_from_the_previous_one(tmp_path,
                                                                         uninterrupted):
    # Write 2 (step 20) stalls; training goes on past it (the write is in the background)
    # until save 3 waits for it. The process dies there; the resume starts from step 10.
    proc = _start(tmp_path, "--save-every", "10", **{checkpoint.SLOW_SAVE_ENV: "2:600"})
    _wait_for(lambda: _stuck_write_under_way(tmp_path) and _logged_past(tmp_path, 25), proc)
    proc.kill()
    proc.wait()
    _stderr(proc)
    proc.log_file.close()
    directory = tmp_path / "checkpoints"
    assert checkpoint.load(directory / "last.pt")["step"] == 10
    assert list(directory.glob(".last.pt.*.tmp"))

    code, err = _finish(_start(tmp_path, "--save-every", "10", "--resume", "auto"))
    assert code == 0, err
    assert "at step 10" in err and not list(directory.glob(".*"))
    _assert_matches(tmp_path, uninterrupted)


@pytest.mark.slow
def test_second_signal_while_waiting_for_a_stuck_write_exits_and_cleans_up(tmp_path):
    proc = _start(tmp_path, "--save-every", "10", **{checkpoint.SLOW_SAVE_ENV: "2:600"})
    _wait_for(lambda: _stuck_write_under_way(tmp_path) and _logged_past(tmp_path, 25), proc)
    proc.send_signal(signal.SIGTERM)  # the stop waits for the stuck write ...
    # Read by name: _stderr() moves the offset the process writes at.
    _wait_for(lambda: "finishing this step" in Path(proc.log_file.name).read_text(), proc)
    proc.send_signal(signal.SIGTERM)  # ... and the second signal does not
    code, err = _finish(proc, timeout=60)
    assert code == 143, err
    assert "second signal (SIGTERM): exiting now" in err and "Traceback" not in err
    directory = tmp_path / "checkpoints"
    assert checkpoint.load(directory / "last.pt")["step"] == 10
    assert not list(directory.glob(".*"))
