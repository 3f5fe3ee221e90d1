"""Exceptions that the command line turns into one clear line and an exit code.

Anything else that escapes is a bug in amptrain and keeps its traceback.
"""
from __future__ import annotations

import contextlib
import contextvars
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
    """

    exit_code = 2


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
