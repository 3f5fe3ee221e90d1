"""Checkpoint files: atomic writes, write faults, unreadable files (checkpoint.files).

A failed or killed write leaves the previous checkpoint intact, and every way a file
can be unreadable is one line that says what is wrong with it.
"""
from __future__ import annotations

import errno
import os
import random
import signal
from pathlib import Path

import pytest
import torch
from torch import nn

from amptrain import checkpoint
from amptrain.checkpoint import CheckpointWriteError
from amptrain.checkpoint import files as checkpoint_files
from amptrain.common.errors import UserError
from tests.checkpoint.helpers import (
    CLI_RUN,
    _assert_matches,
    _error_line,
    _finish,
    _records,
    _start,
    _train,
    _wait_for,
)


# -------------------------------------------------------------- clear errors
def _bad_files(tmp_path: Path, good: Path) -> dict[str, tuple[Path, str]]:
    data = good.read_bytes()
    files = {}

    def make(name, content, expected):
        path = tmp_path / f"{name}.pt"
        if callable(content):
            content(path)
        else:
            path.write_bytes(content)
        files[name] = (path, expected)

    make("missing", lambda p: None, "no such file")
    make("truncated", data[:len(data) // 2], "truncated")
    make("random", random.Random(0).randbytes(len(data)), "not a PyTorch checkpoint file")
    make("state_dict", lambda p: torch.save(nn.Linear(2, 2).state_dict(), p),
         "not an amptrain checkpoint (a bare state_dict of 2 tensors)")
    make("other", lambda p: torch.save({"epoch": 3, "weights": [1, 2]}, p),
         "not an amptrain checkpoint (a dict with keys epoch, weights)")
    make("pickled_module", lambda p: torch.save(nn.Linear(2, 2), p), "holds pickled Python objects")
    return files


def test_unreadable_checkpoints_give_one_line_exit_2(tmp_path, run_cli, cli_checkpoint):
    for name, (path, expected) in _bad_files(tmp_path, cli_checkpoint).items():
        line = _error_line(*run_cli("train", *CLI_RUN, "--resume", path,
                                    "--out", tmp_path / f"out-{name}"))
        assert str(path) in line and expected in line, (name, line)
        line = _error_line(*run_cli("eval", "--checkpoint", path, "--out", tmp_path / "ev"))
        assert expected in line, (name, line)


# ----------------------------------------------------------------- write faults
def _failing_writes(monkeypatch, fail_from: int, error: int = errno.ENOSPC) -> None:
    real = checkpoint_files._write
    calls = []

    def write(state, handle):
        calls.append(1)
        if len(calls) >= fail_from:
            handle.write(b"PK\x03\x04 partial bytes")  # some bytes got out before the disk filled
            raise OSError(error, os.strerror(error))
        real(state, handle)

    # atomic_save looks _write up in checkpoint.files, where it is defined.
    monkeypatch.setattr(checkpoint_files, "_write", write)


def test_disk_full_keeps_the_previous_checkpoint_and_says_so(tmp_path, monkeypatch):
    _failing_writes(monkeypatch, fail_from=2)
    with pytest.raises(CheckpointWriteError) as failed:
        _train(tmp_path, "32-true", save_every=3)
    message = str(failed.value)
    last = tmp_path / "checkpoints" / "last.pt"
    assert f"could not write checkpoint {last}: No space left on device (ENOSPC)" in message
    assert f"the previous checkpoint {last} is intact" in message
    assert "\n" not in message
    assert checkpoint.load(last)["step"] == 3
    assert sorted(p.name for p in last.parent.iterdir()) == ["last.pt", "step-3.pt"]


def test_disk_full_from_the_command_line_is_one_line(tmp_path, monkeypatch, run_cli):
    _failing_writes(monkeypatch, fail_from=1)
    code, err = run_cli("train", *CLI_RUN, "--out", tmp_path)
    assert code == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(
        f"amptrain: error: could not write checkpoint {tmp_path / 'checkpoints' / 'last.pt'}: "
        "No space left on device (ENOSPC) on the disk mounted at ")
    assert "; no earlier checkpoint was there" in err


def _read_only_dirs_stop_writes(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    probe.mkdir(mode=0o555)
    try:
        (probe / "file").write_bytes(b"")
        return False  # root (CAP_DAC_OVERRIDE) writes anyway
    except PermissionError:
        return True
    finally:
        probe.chmod(0o755)


def test_read_only_checkpoint_directory(tmp_path):
    if not _read_only_dirs_stop_writes(tmp_path):
        pytest.skip("this user writes into read-only directories (root); the ENOSPC tests "
                    "cover the same code path")
    class Freeze:
        def on_step_end(self, trainer):
            if trainer.step == 4:
                (tmp_path / "checkpoints").chmod(0o555)

    try:
        with pytest.raises(CheckpointWriteError, match="Permission denied .*previous checkpoint"):
            _train(tmp_path, "32-true", save_every=3, callbacks=[Freeze()])
    finally:
        (tmp_path / "checkpoints").chmod(0o755)
    assert checkpoint.load(tmp_path / "checkpoints" / "last.pt")["step"] == 3


# ------------------------------------------------------------ real processes
def _unfinished(out: Path) -> list[Path]:
    return list((out / "checkpoints").glob(".last.pt.*.tmp"))


def _save_under_way(out: Path) -> bool:
    """The stalled second save: last.pt exists (save 1 is done) and a temporary checkpoint
    file already holds some bytes."""
    if not (out / "checkpoints" / "last.pt").exists():
        return False  # a temporary file now belongs to save 1, which is still running
    for path in _unfinished(out):
        try:
            if path.stat().st_size > 0:
                return True
        except FileNotFoundError:
            pass
    return False


def _logged_past(out: Path, step: int) -> bool:
    path = out / "metrics.jsonl"
    return path.exists() and f'"step": {step},' in path.read_text()


@pytest.mark.slow
def test_sigkill_while_writing_a_checkpoint_leaves_the_previous_one(tmp_path, uninterrupted):
    # The second save (step 20) stalls after its first bytes; the process dies right there.
    proc = _start(tmp_path, "--save-every", "10", **{checkpoint.SLOW_SAVE_ENV: "2"})
    _wait_for(lambda: _save_under_way(tmp_path), proc)
    proc.kill()
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    partial = _unfinished(tmp_path)
    assert partial and partial[0].stat().st_size > 0
    assert checkpoint.load(tmp_path / "checkpoints" / "last.pt")["step"] == 10

    code, err = _finish(_start(tmp_path, "--save-every", "10", "--resume", "auto"))
    assert code == 0, err
    assert "at step 10" in err and not _unfinished(tmp_path)
    # Steps 11-20 were logged before the kill and again after the resume: once in the file.
    _assert_matches(tmp_path, uninterrupted)
    # And once in TensorBoard: the resumed writer purges what the killed one logged after
    # step 10 (read back as TensorBoard itself reads it).
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [r["step"] for r in _records(tmp_path)]


@pytest.mark.slow
def test_second_signal_exits_at_once_and_keeps_the_previous_checkpoint(tmp_path):
    proc = _start(tmp_path, **{checkpoint.SLOW_SAVE_ENV: "2:600"})
    # Past the epoch-end checkpoint (save 1, step 45), so the stop needs a new one (save 2).
    _wait_for(lambda: _logged_past(tmp_path, 50), proc)
    proc.send_signal(signal.SIGTERM)   # stop: the checkpoint it writes stalls
    _wait_for(lambda: _save_under_way(tmp_path), proc)
    proc.send_signal(signal.SIGTERM)   # and now at once
    code, err = _finish(proc, timeout=60)
    assert code == 143, err
    assert "second signal (SIGTERM): exiting now" in err and "Traceback" not in err
    assert checkpoint.load(tmp_path / "checkpoints" / "last.pt")["step"] == 45
    assert not _unfinished(tmp_path)


def test_a_planted_payload_in_a_checkpoint_never_runs(tmp_path):
    marker = tmp_path / "PWNED"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    path = tmp_path / "last.pt"
    torch.save({"format": checkpoint.FORMAT, "step": Payload()}, path)
    with pytest.raises(UserError, match="holds pickled Python objects"):
        checkpoint.load(path)
    assert not marker.exists()
