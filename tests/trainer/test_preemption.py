"""amptrain/preemption.py: the first SIGTERM/SIGINT asks the Trainer to stop, a second
one exits at once, and the previous handlers come back afterwards.

Signals are real: sent to this process with os.kill, only while stop_on_signals has its
handler installed (checked before each send)."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from amptrain.trainer import preemption
from amptrain.common.errors import Preempted
from amptrain.trainer.preemption import STOP_SIGNALS, exit_code, preempted, stop_on_signals


def send(sig: signal.Signals, trainer=None) -> None:
    """Deliver ``sig`` to this process through the handler stop_on_signals installed."""
    handler = signal.getsignal(sig)
    assert callable(handler) and handler.__module__ == preemption.__name__, handler
    os.kill(os.getpid(), sig)
    # Python runs the handler in the main thread at its next check; wait for it.
    deadline = time.monotonic() + 5
    while trainer is not None and trainer.stop_requested is None and time.monotonic() < deadline:
        time.sleep(0.001)


@pytest.fixture
def handlers():
    """The handlers of the stop signals before the test, put back after it whatever happens."""
    saved = {sig: signal.getsignal(sig) for sig in (*STOP_SIGNALS, signal.SIGUSR1)}
    yield saved
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_first_sigterm_requests_a_stop_and_the_second_exits_143(handlers, caplog):
    trainer = SimpleNamespace(stop_requested=None)
    with caplog.at_level(logging.WARNING, logger="amptrain"), \
            pytest.raises(SystemExit) as caught, stop_on_signals(trainer):
        send(signal.SIGTERM, trainer)
        assert trainer.stop_requested == "SIGTERM"  # the run goes on to a checkpoint
        send(signal.SIGTERM)
        time.sleep(1)  # not reached: the second signal raises in this thread
        pytest.fail("the second SIGTERM did not exit")
    assert caught.value.code == 128 + signal.SIGTERM == 143
    messages = [r.getMessage() for r in caplog.records]
    assert any("SIGTERM: finishing this step" in m for m in messages)
    assert any("second signal (SIGTERM): exiting now" in m for m in messages)
    assert signal.getsignal(signal.SIGTERM) is handlers[signal.SIGTERM]


def test_second_sigint_raises_keyboard_interrupt_whatever_came_first(handlers):
    trainer = SimpleNamespace(stop_requested=None)
    with pytest.raises(KeyboardInterrupt), stop_on_signals(trainer):
        send(signal.SIGTERM, trainer)
        send(signal.SIGINT)  # a different signal is a second signal too
        time.sleep(1)
        pytest.fail("the second signal did not interrupt")
    assert trainer.stop_requested == "SIGTERM"  # the first one's name stays
    assert signal.getsignal(signal.SIGINT) is handlers[signal.SIGINT]
    trainer = SimpleNamespace(stop_requested=None)
    with stop_on_signals(trainer):
        send(signal.SIGINT, trainer)
    assert trainer.stop_requested == "SIGINT"


def test_previous_handlers_come_back_even_when_the_body_raises(handlers):
    def mine(signum, frame):
        pass

    signal.signal(signal.SIGTERM, mine)
    trainer = SimpleNamespace(stop_requested=None)
    with pytest.raises(ValueError), stop_on_signals(trainer):
        assert signal.getsignal(signal.SIGTERM) is not mine
        assert signal.getsignal(signal.SIGINT) is not handlers[signal.SIGINT]
        raise ValueError("the training step failed")
    assert signal.getsignal(signal.SIGTERM) is mine
    assert signal.getsignal(signal.SIGINT) is handlers[signal.SIGINT]
    # Each context has its own "first signal": a new run starts afresh.
    for _ in range(2):
        trainer = SimpleNamespace(stop_requested=None)
        with stop_on_signals(trainer):
            send(signal.SIGTERM, trainer)
        assert trainer.stop_requested == "SIGTERM"


def test_only_the_given_signals_are_handled(handlers):
    trainer = SimpleNamespace(stop_requested=None)
    with stop_on_signals(trainer, signals=(signal.SIGUSR1,)):
        assert signal.getsignal(signal.SIGTERM) is handlers[signal.SIGTERM]
        send(signal.SIGUSR1, trainer)
    assert trainer.stop_requested == "SIGUSR1"
    assert signal.getsignal(signal.SIGUSR1) is handlers[signal.SIGUSR1]


def test_a_handler_installed_outside_python_becomes_the_default(handlers, monkeypatch):
    real_signal = signal.signal
    calls = []

    def fake_signal(sig, handler):
        calls.append((sig, handler))
        previous = real_signal(sig, handler)
        return None if len(calls) == 1 else previous  # "not installed from Python"

    monkeypatch.setattr(preemption.signal, "signal", fake_signal)
    with stop_on_signals(SimpleNamespace(stop_requested=None), signals=(signal.SIGUSR1,)):
        pass
    monkeypatch.undo()
    assert calls[-1] == (signal.SIGUSR1, signal.SIG_DFL)
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


def test_outside_the_main_thread_nothing_changes(handlers):
    seen = {}

    def worker() -> None:
        with stop_on_signals(SimpleNamespace(stop_requested=None)):
            seen["inside"] = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(timeout=10)
    assert seen["inside"] == {sig: handlers[sig] for sig in STOP_SIGNALS}


def test_exit_codes_and_the_preempted_error():
    assert exit_code("SIGTERM") == 143 and exit_code("SIGINT") == 130
    assert exit_code("diverged") == 1
    error = preempted("SIGTERM", 12, None)
    assert isinstance(error, Preempted) and error.exit_code == 143
    assert str(error) == ("stopped by SIGTERM after step 12; no checkpoint written (no output "
                          "directory)")
    error = preempted("SIGINT", 3, "runs/a/checkpoints/last.pt")
    assert error.exit_code == 130
    assert "checkpoint runs/a/checkpoints/last.pt written; continue with --resume auto" \
        in str(error)


@pytest.mark.slow
@pytest.mark.timeout(600)   # a hang guard only: a busy machine may run it 6x slower
def test_a_signal_during_a_long_evaluation_stops_the_run_without_finishing_it(tmp_path):
    # Issue 48: 5,000 evaluation episodes (the bound is 10,000, of up to 10,000 steps
    # each) were played to the end after SIGTERM, past a cluster's grace period. The
    # environment signals its own run as the second evaluation episode starts.
    pytest.importorskip("gymnasium")
    from tests.commands.helpers import REPO

    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "amptrain", "train", "--data",
         "gym:tests.data.hostile_envs:SignalsInEval-v0", "--env-steps", "1024",
         "--eval-episodes", "5000", "--out", str(out), "--no-progress", "--logger", "none"],
        capture_output=True, text=True, env=env, timeout=580, cwd=tmp_path)
    assert result.returncode == 143, result.stderr
    assert "stopped by SIGTERM after step 16; checkpoint" in result.stderr
    assert "val_return" not in (out / "metrics.jsonl").read_text()  # abandoned, not logged
    assert (out / "checkpoints" / "last.pt").is_file()
