"""Checkpoints, exact resume, pre-emption and faults (issue 4).

In-process tests stop a run with ``stop_requested`` (what the signal handler sets) and
resume it in a new Trainer; the slow tests drive real ``python -m amptrain train``
processes with SIGTERM and SIGKILL.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from torch import nn

from amptrain import checkpoint, cli
from amptrain.checkpoint import CheckpointWriteError
from amptrain.errors import Preempted, UserError
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification

REPO = Path(__file__).resolve().parents[1]
COMPARED = ("step", "epoch", "loss", "lr", "loss_scale", "grad_norm", "skipped_steps")


@pytest.fixture(autouse=True)
def _restore_determinism():
    # --deterministic flips a process-wide switch; give the other tests their default back.
    yield
    torch.use_deterministic_algorithms(False)


@pytest.fixture
def notices():
    """Messages of the amptrain logger (the CLI turns its propagation off)."""
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("amptrain")
    handler, level = Collect(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)


def dropout_mlp(seed: int = 0) -> nn.Module:
    """Dropout makes the torch RNG part of the trajectory, so its restore is tested too."""
    torch.manual_seed(seed)
    return nn.Sequential(OrderedDict(
        body=nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Dropout(0.2)),
        head=nn.Linear(16, 3)))


TRAIN = tiny_classification(n=200)          # batch 32: 7 steps per epoch, the last partial
VAL = tiny_classification(n=64, seed=1)
OPTIONS = dict(device="cpu", deterministic=True, no_progress=True, batch_size=32, epochs=3,
               log_every=4, lr=0.02, scheduler="cosine", warmup_steps=2,
               # fp16: a huge initial scale overflows, and a short growth interval makes the
               # scale grow and back off again, so scale, growth tracker and skips all move.
               init_scale=2.0 ** 20, growth_interval=3)


class StopAt:
    """Asks the trainer to stop after step ``k``, as the SIGTERM handler would."""

    def __init__(self, k: int) -> None:
        self.k = k

    def on_step_end(self, trainer: Trainer) -> None:
        if trainer.step == self.k:
            trainer.stop_requested = "SIGTERM"


def _train(out: Path, precision: str, *, callbacks=(), **options) -> Trainer:
    trainer = Trainer(precision=precision, out=str(out), callbacks=callbacks,
                      **{**OPTIONS, **options})
    trainer.fit(dropout_mlp(), TRAIN, VAL)
    return trainer


def _records(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: r.get(k) for k in COMPARED} for r in map(json.loads, lines) if "loss" in r]


def _assert_same_state(a: Trainer, b: Trainer) -> None:
    for (name, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(x, y), name
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    for index, state in sa["state"].items():
        for key, value in state.items():
            assert torch.equal(value, sb["state"][index][key]), (index, key)
    assert a.scheduler.state_dict() == b.scheduler.state_dict()
    assert a.precision.state_dict() == b.precision.state_dict()  # scale AND growth tracker


@pytest.mark.parametrize("stop_at", [7, 10], ids=["epoch-boundary", "mid-epoch"])
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed", "16-master"])
def test_resume_is_bitwise_identical_to_an_uninterrupted_run(tmp_path, precision, stop_at):
    full = _train(tmp_path / "full", precision)

    with pytest.raises(Preempted) as stopped:
        _train(tmp_path / "cut", precision, callbacks=[StopAt(stop_at)])
    assert stopped.value.exit_code == 143
    saved = checkpoint.load(tmp_path / "cut" / "checkpoints" / "last.pt")
    assert (saved["step"], saved["epoch"], saved["window_in_epoch"]) == \
        (stop_at, stop_at // 7, stop_at % 7)

    resumed = _train(tmp_path / "cut", precision, resume="auto")
    assert resumed.step == full.step == 21
    _assert_same_state(full, resumed)
    # The log window in progress at the stop was saved: every logged value matches,
    # including the mean loss of the window that straddles the resume.
    assert _records(tmp_path / "cut") == _records(tmp_path / "full")
    later = [r for r in full.history if r["step"] > stop_at]
    assert [{k: r.get(k) for k in (*COMPARED, "val_acc", "val_loss")} for r in resumed.history] \
        == [{k: r.get(k) for k in (*COMPARED, "val_acc", "val_loss")} for r in later]
    if precision == "16-mixed":
        assert full.precision.skipped_steps > 0  # the scaler really backed off and grew
        assert len({r["loss_scale"] for r in _records(tmp_path / "full")}) > 1


def test_checkpoint_holds_the_documented_state(tmp_path):
    with pytest.raises(Preempted):
        _train(tmp_path, "16-mixed", callbacks=[StopAt(5)])
    state = checkpoint.load(tmp_path / "checkpoints" / "last.pt")
    assert {"model", "optimizer", "scheduler", "precision", "rng", "step", "epoch",
            "window_in_epoch", "config", "amptrain_version", "torch_version",
            "precision_name", "log_window"} <= set(state)
    assert set(state["rng"]) >= {"python", "numpy", "torch"}
    assert all(v.dtype == torch.float32 for v in state["model"].values() if v.is_floating_point())
    scaler = state["precision"]["scaler"]
    assert scaler["scale"] > 0 and "_growth_tracker" in scaler
    assert state["config"]["precision"] == "16-mixed" and state["config"]["batch_size"] == 32
    # Plain data only: it loads without unpickling arbitrary objects.
    torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)


def test_master_weights_are_what_the_checkpoint_keeps(tmp_path):
    with pytest.raises(Preempted):
        trainer = Trainer(precision="16-master", out=str(tmp_path), callbacks=[StopAt(3)],
                          **OPTIONS)
        trainer.fit(dropout_mlp(), TRAIN)
    state = checkpoint.load(tmp_path / "checkpoints" / "last.pt")
    masters = trainer.optimizer.param_groups[0]["params"]
    assert torch.equal(state["model"]["body.0.weight"], masters[0])  # fp32, not fp16-rounded
    assert not torch.equal(state["model"]["body.0.weight"],
                           masters[0].half().float())


# --------------------------------------------------------------- precision change
@pytest.mark.parametrize("first, then", [("16-master", "32-true"), ("32-true", "16-true"),
                                         ("16-mixed", "bf16-mixed")])
def test_resume_in_another_precision(tmp_path, notices, first, then):
    with pytest.raises(Preempted):
        _train(tmp_path, first, callbacks=[StopAt(5)])
    saved = checkpoint.load(tmp_path / "checkpoints" / "last.pt")

    trainer = Trainer(precision=then, out=str(tmp_path), resume="auto", **OPTIONS)
    trainer.setup(dropout_mlp(), TRAIN, VAL)
    assert any(f"trained with {first}, continuing in {then}" in n for n in notices)
    # Weights are the fp32 ones of the checkpoint (rounded only where `then` keeps half).
    dtype = trainer.model.head.weight.dtype
    assert torch.equal(trainer.model.head.weight, saved["model"]["head.weight"].to(dtype))
    # Optimizer state is matched by parameter position, with or without master copies.
    params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    saved_state = saved["optimizer"]["state"]
    for index, param in enumerate(params):
        moment = trainer.optimizer.state[param]["exp_avg"]
        assert moment.dtype == param.dtype and moment.shape == param.shape
        assert torch.equal(moment, saved_state[index]["exp_avg"].to(param.dtype))
    # The Adam eps floor belongs to the running precision, not to the checkpoint.
    eps = {g["eps"] for g in trainer.optimizer.param_groups}
    assert eps == ({1e-4} if then == "16-true" else {1e-8})
    result = trainer.run()
    assert result.steps == 21 and torch.isfinite(torch.tensor(result.final_loss))


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
@pytest.fixture
def run_cli(capsys):
    """``amptrain ARGS`` in this process: (exit code, stderr)."""
    logger = logging.getLogger("amptrain")
    saved = logger.handlers[:], logger.propagate, logger.level

    def run(*args: str) -> tuple[int, str]:
        logger.handlers.clear()  # the CLI then logs to the stderr captured right now
        capsys.readouterr()
        code = cli.main([str(a) for a in args])
        return code, capsys.readouterr().err

    yield run
    logger.handlers[:], logger.propagate, logger.level = saved


CLI_RUN = ("--model", "mlp:16", "--data", "digits", "--precision", "32-true", "--batch-size", "64",
           "--max-steps", "3", "--no-progress")


@pytest.fixture
def cli_checkpoint(tmp_path, run_cli) -> Path:
    code, err = run_cli("train", *CLI_RUN, "--out", tmp_path / "run")
    assert code == 0, err
    return tmp_path / "run" / "checkpoints" / "last.pt"


def _error_line(code: int, err: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("amptrain: error:")]
    assert len(errors) == 1, err
    return errors[0]


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


def test_checkpoint_of_another_model_names_the_first_mismatched_key(tmp_path, run_cli,
                                                                    cli_checkpoint):
    state = checkpoint.load(cli_checkpoint)
    torch.manual_seed(0)
    from amptrain.models import MLP

    state["model"] = MLP(64, 10, hidden=8).state_dict()  # same names, other shapes
    other = tmp_path / "other-model.pt"
    checkpoint.atomic_save(state, other)
    line = _error_line(*run_cli("train", *CLI_RUN, "--resume", other, "--out", tmp_path / "a"))
    assert "does not fit this model: 'body.1.weight' has shape (8, 64) in the checkpoint " \
           "but (16, 64) in the model" in line
    state["model"] = {"encoder.weight": torch.zeros(2, 2)}
    checkpoint.atomic_save(state, other)
    line = _error_line(*run_cli("train", *CLI_RUN, "--resume", other, "--out", tmp_path / "b"))
    assert "'body.1.weight' is missing from the checkpoint" in line


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


# ----------------------------------------------------------------- write faults
def _failing_writes(monkeypatch, fail_from: int, error: int = errno.ENOSPC) -> None:
    real = checkpoint._write
    calls = []

    def write(state, handle):
        calls.append(1)
        if len(calls) >= fail_from:
            handle.write(b"PK\x03\x04 partial bytes")  # some bytes got out before the disk filled
            raise OSError(error, os.strerror(error))
        real(state, handle)

    monkeypatch.setattr(checkpoint, "_write", write)


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
        "No space left on device (ENOSPC); no earlier checkpoint was there")


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
TRAIN_ARGS = ("train", "--model", "mlp:32", "--data", "digits", "--precision", "16-mixed",
              "--deterministic", "--batch-size", "32", "--epochs", "12", "--log-every", "5",
              "--no-progress")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != checkpoint.SLOW_SAVE_ENV}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **extra)
    return env


def _start(out: Path, *args: str, **env: str) -> subprocess.Popen:
    """``python -m amptrain train ...``; stderr goes to a file (a full pipe would block it)."""
    out.mkdir(parents=True, exist_ok=True)
    log_file = open(out / f"stderr-{time.monotonic_ns()}.txt", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "amptrain", *TRAIN_ARGS, *args,
                             "--out", str(out)], env=_env(**env), stdout=subprocess.DEVNULL,
                            stderr=log_file, text=True)
    proc.log_file = log_file  # type: ignore[attr-defined]
    return proc


def _stderr(proc: subprocess.Popen) -> str:
    proc.log_file.seek(0)
    return proc.log_file.read()


def _finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    proc.wait(timeout=timeout)
    err = _stderr(proc)
    proc.log_file.close()
    return proc.returncode, err


def _wait_for(condition, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"process ended early ({proc.returncode}): {_stderr(proc)}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out waiting")
        time.sleep(0.005)


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


def _final_weights(out: Path) -> dict[str, torch.Tensor]:
    state = checkpoint.load(out / "checkpoints" / "last.pt")
    assert state["step"] == 12 * 45
    return state["model"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    code, err = _finish(_start(out))
    assert code == 0, err
    return out


def _assert_matches(out: Path, reference: Path) -> None:
    mine, theirs = _final_weights(out), _final_weights(reference)
    for key in theirs:
        assert torch.equal(mine[key], theirs[key]), key
    assert _records(out) == _records(reference)


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
