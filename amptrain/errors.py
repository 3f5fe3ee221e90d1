"""Exceptions that the command line turns into one clear line and an exit code.

Anything else that escapes is a bug in amptrain and keeps its traceback.
"""
from __future__ import annotations


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
