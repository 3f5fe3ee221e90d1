"""Which checkpoint a run resumes from, and whether it may (checkpoint.resume).

``--resume auto`` skips damaged checkpoints, a config that contradicts the checkpoint is
refused, and a run stopped by a signal continues where it stopped.
"""
from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest

from amptrain import checkpoint
from amptrain.common.errors import Preempted, UserError
from amptrain.trainer import Trainer
from tests.checkpoint.helpers import (
    CLI_RUN,
    OPTIONS,
    TRAIN,
    VAL,
    _assert_matches,
    _error_line,
    _finish,
    _start,
    _train,
    _wait_for,
    dropout_mlp,
)


# ------------------------------------------------------------------- signals
class KillAt:
    def __init__(self, k: int, signum: int) -> None:
        self.k, self.signum = k, signum

    def on_step_end(self, trainer: Trainer) -> None:
        if trainer.step == self.k:
            os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_stops_at_step_boundary_with_checkpoint_and_restores_handlers(tmp_path, signum,
                                                                             code):
    def mine(*_):
        raise AssertionError("the trainer's handler should have caught this")

    previous = signal.signal(signum, mine)
    try:
        trainer = Trainer(precision="32-true", out=str(tmp_path), callbacks=[KillAt(4, signum)],
                          **OPTIONS)
        with pytest.raises(Preempted) as stopped:
            trainer.fit(dropout_mlp(), TRAIN, VAL)
        assert stopped.value.exit_code == code
        assert signal.Signals(signum).name in str(stopped.value)
        assert signal.getsignal(signum) is mine
        saved = checkpoint.load(tmp_path / "checkpoints" / "last.pt")
        assert saved["step"] == trainer.step and trainer.step in (4, 5)
        assert "--resume auto" in str(stopped.value)
        # a finished fit restores the handlers too
        Trainer(precision="32-true", **{**OPTIONS, "epochs": 1}).fit(dropout_mlp(), TRAIN)
        assert signal.getsignal(signum) is mine
    finally:
        signal.signal(signum, previous)


def test_no_handlers_outside_the_main_thread():
    import threading

    before = signal.getsignal(signal.SIGTERM)
    seen = []

    class Look:
        def on_step_end(self, trainer):
            seen.append(signal.getsignal(signal.SIGTERM))

    def train() -> None:
        trainer = Trainer(precision="32-true", callbacks=[Look()], **{**OPTIONS, "epochs": 1})
        trainer.fit(dropout_mlp(), TRAIN)

    worker = threading.Thread(target=train)
    worker.start()
    worker.join()
    assert seen and all(h is before for h in seen)


# -------------------------------------------------------------- resume auto
def _saved_run(tmp_path: Path) -> Path:
    _train(tmp_path, "32-true", save_every=3, keep_last=4, max_steps=9, epochs=3)
    return tmp_path / "checkpoints"  # saves at steps 3, 6, 7 (epoch end) and 9


def test_resume_auto_skips_corrupt_checkpoints_with_a_warning(tmp_path, notices):
    directory = _saved_run(tmp_path)
    assert sorted(p.name for p in directory.glob("*.pt")) == \
        ["last.pt", "step-3.pt", "step-6.pt", "step-7.pt", "step-9.pt"]
    good = (directory / "last.pt").read_bytes()
    # last.pt and step-9.pt share one inode: replace both files rather than truncate in place.
    (directory / "last.pt").unlink()
    (directory / "last.pt").write_bytes(good[:len(good) // 2])
    (directory / "step-9.pt").unlink()
    (directory / "step-9.pt").write_bytes(random.Random(0).randbytes(4096))
    (directory / ".last.pt.abc123.tmp").write_bytes(good[:100])  # a killed write

    path, state = checkpoint.find_resume("auto", tmp_path)
    assert path.name == "step-7.pt" and state["step"] == 7
    assert any("last.pt" in n and "truncated" in n for n in notices)
    assert any("step-9.pt" in n and "not a PyTorch checkpoint" in n for n in notices)
    assert not (directory / ".last.pt.abc123.tmp").exists()

    resumed = _train(tmp_path, "32-true", save_every=3, keep_last=4, max_steps=9, resume="auto")
    assert resumed.step == 9
    assert checkpoint.load(directory / "last.pt")["step"] == 9


def test_resume_auto_without_checkpoint_starts_fresh_but_all_corrupt_is_an_error(tmp_path):
    assert checkpoint.find_resume("auto", tmp_path) is None
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    (directory / "last.pt").write_bytes(b"garbage")
    with pytest.raises(UserError, match="none of the 1 checkpoints"):
        checkpoint.find_resume("auto", tmp_path)


def test_resume_path_accepts_a_file_or_a_run_directory(tmp_path):
    directory = _saved_run(tmp_path)
    assert checkpoint.find_resume(str(directory / "step-6.pt"), None)[1]["step"] == 6
    assert checkpoint.find_resume(str(tmp_path), None)[1]["step"] == 9


# -------------------------------------------------------------- clear errors
@pytest.mark.parametrize("change, expected", [
    (("--model", "mlp:32"), "--model mlp:32 does not match checkpoint"),
    (("--data", "synthetic-image:classes=5,size=8,channels=1,samples=256"),
     "has 5 classes, but checkpoint"),
    (("--data", "synthetic-image:classes=10,size=4,channels=1,samples=256"),
     "has inputs of shape (1, 4, 4), but checkpoint"),
    (("--batch-size", "32"), "--batch-size 32 differs from checkpoint"),
    (("--optimizer", "sgd"), "--optimizer sgd differs from checkpoint"),
])
def test_config_incompatible_with_the_checkpoint(tmp_path, run_cli, cli_checkpoint, change,
                                                 expected):
    args = list(CLI_RUN)
    if change[0] in args:
        args[args.index(change[0]) + 1] = change[1]
    else:
        args += change
    line = _error_line(*run_cli("train", *args, "--resume", cli_checkpoint,
                                "--out", tmp_path / "new"))
    assert expected in line, line


def test_resume_into_the_same_run_directory_continues(tmp_path, run_cli, cli_checkpoint):
    out = cli_checkpoint.parent.parent
    code, err = run_cli("train", *CLI_RUN[:-3], "--max-steps", "6", "--no-progress",
                        "--resume", "auto", "--out", out)
    assert code == 0, err
    assert "resuming from" in err and "at step 3" in err and "trained with 32-true" in err
    # Allowed, but the user learns that the continuation is not the original run's.
    assert "resume is not exact: --max-steps 6 (checkpoint: 3)" in err
    assert checkpoint.load(cli_checkpoint)["step"] == 6


# ------------------------------------------------------------ real processes
@pytest.mark.slow
def test_sigterm_to_a_real_training_process(tmp_path, uninterrupted):
    proc = _start(tmp_path)
    _wait_for(lambda: (tmp_path / "checkpoints" / "last.pt").exists(), proc)  # epoch 1 done
    proc.send_signal(signal.SIGTERM)
    code, err = _finish(proc)
    assert code == 143, err
    assert "Traceback" not in err and "stopped by SIGTERM after step" in err
    stopped_at = checkpoint.load(tmp_path / "checkpoints" / "last.pt")["step"]
    assert 45 <= stopped_at < 12 * 45

    code, err = _finish(_start(tmp_path, "--resume", "auto"))
    assert code == 0, err
    assert f"at step {stopped_at}" in err
    _assert_matches(tmp_path, uninterrupted)


@pytest.mark.parametrize("saved_epochs,saved_max,now_epochs,now_max,inexact", [
    (3, None, None, None, False),   # written before --epochs could be left unset: 3 passes
    (None, None, None, None, False),
    (3, 50, None, 50, True),        # then the fewer of 3 epochs and 50 steps; now 50 steps
    (2, None, None, None, True),
])
def test_a_checkpoint_that_spells_out_the_default_epochs_resumes_exactly(
        caplog, saved_epochs, saved_max, now_epochs, now_max, inexact):
    from amptrain.checkpoint.resume import check_compatible

    state = {"config": {"epochs": saved_epochs, "max_steps": saved_max}}
    with caplog.at_level("WARNING", logger="amptrain"):
        check_compatible(state, {"epochs": now_epochs, "max_steps": now_max}, {}, "last.pt")
    assert ("resume is not exact" in caplog.text) is inexact
