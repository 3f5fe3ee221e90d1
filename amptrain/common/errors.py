"""Exceptions that the command line turns into one clear line and an exit code.

Anything else that escapes is a bug in amptrain and keeps its traceback.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import warnings
from types import FrameType
from typing import Iterator

#: True while the command line runs: errors then name flags (``--micro-batch-size``);
#: a library caller gets the keyword it passed (``micro_batch_size``).
_CLI_SPELLING: contextvars.ContextVar[bool] = contextvars.ContextVar("amptrain_cli_spelling",
                                                                     default=False)


def flag(name: str) -> str:
    """How an error names option ``name``: ``--micro-batch-size`` on the command line,
    ``micro_batch_size`` (the keyword) for a library caller."""
    return "--" + name.replace("_", "-") if _CLI_SPELLING.get() else name


@contextlib.contextmanager
def cli_spelling() -> Iterator[None]:
    """Within this block errors name command-line flags (the CLI wraps each command)."""
    token = _CLI_SPELLING.set(True)
    try:
        yield
    finally:
        _CLI_SPELLING.reset(token)


class AmptrainError(Exception):
    """Base class: an expected failure with a message meant for the user."""

    exit_code = 1


class UserError(AmptrainError):
    """Bad input: unknown name, missing path, impossible flag combination (exit 2).

    The message should say what to change, naming the flag where there is one.
    A ``UserError`` raised in a DataLoader worker arrives in the training process rebuilt
    from the worker's whole traceback (torch's ``ExceptionWrapper``); its message is then
    the user's line again, whichever place reads the loader.
    """

    exit_code = 2

    def __init__(self, *args: object) -> None:
        if len(args) == 1 and isinstance(args[0], str):
            message = _unwrapped(args[0])
            if len(message) > MESSAGE_LIMIT:  # whatever a message echoed, one line stays one
                message = f"{message[:MESSAGE_LIMIT]}... ({len(message)} characters in all)"
            args = (message,)
        super().__init__(*args)


def _unwrapped(message: str) -> str:
    """The original line of a message torch wrapped in a DataLoader worker's traceback
    ("Caught UserError in DataLoader worker process 0.\nOriginal Traceback ...")."""
    head = message.split("\n", 1)[0]
    if not (head.startswith("Caught UserError") and "DataLoader worker" in head):
        return message
    lines = [line for line in message.strip().splitlines() if line.strip()]
    return lines[-1].split("UserError: ", 1)[-1] if lines else message


#: The longest message a UserError carries: the last bound, for an echo nobody bounded.
MESSAGE_LIMIT = 2000
#: The most characters of the user's own input an error message repeats (a YAML file, a
#: value): a hostile file must not turn one error line into megabytes.
ECHO_LIMIT = 200


def bounded(text: object, limit: int = ECHO_LIMIT) -> str:
    """``text`` as one line of at most ``limit`` characters (the rest said as a count)."""
    whole = str(text)
    line = " ".join(whole[:4 * limit].split())  # never split (copy) megabytes for 200
    if len(line) <= limit and len(whole) <= 4 * limit:
        return line
    return f"{line[:limit]}... ({len(whole)} characters in all)"


class TrainingHalted(AmptrainError):
    """Training stopped on purpose because continuing would waste the run (exit 1).

    Raised for repeated non-finite steps or a loss scale that reached its floor.
    """

    exit_code = 1


class Preempted(AmptrainError):
    """A signal asked the run to stop; a checkpoint was written first."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class AmptrainWarning(UserWarning):
    """Something a library user should know although nothing failed: a precision this
    device only emulates, modules kept in fp32 that were not asked for, an option that does
    nothing here. Issued with :func:`warn`; filter it with ``warnings.filterwarnings``.
    The command line prints each one once as ``amptrain: warning: ...``."""


def first_line(error: BaseException) -> str:
    """An error's first line (200 characters at most), or its type's name: what amptrain's
    one-line messages quote of another library's error (torch's run to pages)."""
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__


def _caller_stacklevel() -> int:
    """The stacklevel of the first frame outside amptrain, so that a warning names the
    user's line (where ``Trainer.fit`` or ``Precision.setup`` was called), not ours."""
    # amptrain/ itself (this module lives in amptrain/common/).
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame: FrameType | None = sys._getframe(2)  # warn()'s caller's caller: stacklevel 2
    level = 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


#: Messages :func:`warn` has issued in this process. Python's own "once per place" registry
#: is not enough: every ``warnings.catch_warnings`` block (torch's and ours) resets it, and
#: ``compare`` sets up many Trainers, so the same warning would come back per run.
_ISSUED: set[str] = set()


def warn(message: str) -> None:
    """Issue ``message`` as an :class:`AmptrainWarning` through ``warnings.warn`` (visible
    without ``logging``, filterable), once per process; the command line starts each
    invocation afresh (:func:`forget_warnings`)."""
    if message in _ISSUED:
        return
    _ISSUED.add(message)
    warnings.warn(message, AmptrainWarning, stacklevel=_caller_stacklevel())


def forget_warnings() -> None:
    """Let every warning be issued once more (a new command-line invocation, a new test)."""
    _ISSUED.clear()
