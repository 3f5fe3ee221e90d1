"""Stopping on SIGTERM / SIGINT at a step boundary, with a checkpoint.

Clusters pre-empt jobs with SIGTERM (then SIGKILL after a grace period); people stop
runs with Ctrl-C. The first signal only asks the Trainer to stop: it finishes the
current optimizer step, writes a checkpoint and raises :class:`~amptrain.common.errors.Preempted`
(exit 128 + signal number: 143 for SIGTERM, 130 for SIGINT). A second signal exits at
once, without a checkpoint; the previous one is still intact because checkpoint writes
are atomic.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any, Iterator

from ..common.errors import Preempted

log = logging.getLogger("amptrain")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_code(reason: str) -> int:
    """The shell's exit status for a stop caused by ``reason`` (a signal name), else 1."""
    try:
        return 128 + int(signal.Signals[reason])
    except KeyError:
        return 1


@contextlib.contextmanager
def stop_on_signals(trainer: Any, signals: tuple[signal.Signals, ...] = STOP_SIGNALS
                    ) -> Iterator[None]:
    """While inside, the first of ``signals`` sets ``trainer.stop_requested`` to its name.

    The Trainer polls ``stop_requested`` after every step. A second signal raises
    ``KeyboardInterrupt`` (SIGINT) or ``SystemExit(128 + signum)``. The previous handlers
    come back on exit. Outside the main thread Python cannot install handlers, so
    nothing is changed there (the host application owns signals).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[str] = []
    owner = os.getpid()

    def handle(signum: int, frame: Any) -> None:
        if os.getpid() != owner:
            # A process forked while the handler was installed (an async environment's
            # worker) is not the Trainer: it dies of the signal as it would without us.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        name = signal.Signals(signum).name
        if received:
            log.warning("second signal (%s): exiting now, without a checkpoint", name)
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        received.append(name)
        trainer.stop_requested = name
        log.warning("%s: finishing this step, then writing a checkpoint and stopping "
                    "(send it again to exit at once)", name)

    previous = {sig: signal.signal(sig, handle) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            # None means a handler installed outside Python; it cannot be put back.
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def agreed_stop(requested: str | None, current: str | None, step: int, every: int,
                strategy: Any) -> str | None:
    """The stop all ranks act on after ``step``, given this rank's signal (``requested``)
    and the stop already agreed on (``current``).

    One process stops right after the step it was signalled in. Several must stop at
    the same step, or the collective checkpoint would hang: they agree every ``every``
    steps (--log-every boundaries, where the loop reads the device anyway: no extra sync
    per step).
    """
    if strategy.world_size == 1:
        return requested
    if step % every:
        return current
    import torch

    stop = torch.tensor([0.0 if requested is None else 1.0], device=strategy.device)
    if strategy.reduce_sum(stop).item() > 0:
        return requested or "SIGTERM"
    return current


def preempted(reason: str, step: int, checkpoint: Path | None) -> Preempted:
    """The exception that ends a stopped run, telling the user how to continue."""
    where = (f"checkpoint {checkpoint} written; continue with --resume auto" if checkpoint
             else "no checkpoint written (no output directory)")
    return Preempted(f"stopped by {reason} after step {step}; {where}", exit_code(reason))
