"""errors.py: how an error names an option (flag under the CLI, keyword for a library caller)
and the exit code each kind of error carries."""
from __future__ import annotations

import pytest

from amptrain.common.errors import (AmptrainError, Preempted, TrainingHalted, UserError,
                                    cli_spelling, flag)


def test_a_library_caller_reads_the_keyword_it_passed():
    assert flag("micro_batch_size") == "micro_batch_size"
    assert flag("lr") == "lr"


def test_the_command_line_reads_the_flag():
    with cli_spelling():
        assert flag("micro_batch_size") == "--micro-batch-size"
        assert flag("lr") == "--lr"
    assert flag("micro_batch_size") == "micro_batch_size"  # back to the keyword after it


def test_nested_blocks_restore_what_was_there_before():
    with cli_spelling():
        with cli_spelling():
            assert flag("keep_fp32") == "--keep-fp32"
        assert flag("keep_fp32") == "--keep-fp32"  # the outer block still holds
    assert flag("keep_fp32") == "keep_fp32"


def test_an_error_inside_the_block_does_not_leave_the_cli_spelling_on():
    with pytest.raises(UserError, match="^--epochs must be"):
        with cli_spelling():
            raise UserError(f"{flag('epochs')} must be an integer >= 1")
    assert flag("epochs") == "epochs"


def test_exit_codes():
    assert UserError("bad flag").exit_code == 2         # bad input
    assert TrainingHalted("diverged").exit_code == 1    # stopped on purpose
    assert AmptrainError("other").exit_code == 1
    assert all(issubclass(kind, AmptrainError) for kind in (UserError, TrainingHalted, Preempted))
    # A preempted run exits with the code of the signal that stopped it, per instance.
    term, interrupt = Preempted("SIGTERM", 143), Preempted("SIGINT", 130)
    assert (term.exit_code, interrupt.exit_code) == (143, 130)
    assert str(term) == "SIGTERM"


# ----------------------------------------------------------------- issue 36, class 7
def test_a_user_error_is_bounded_whatever_it_echoes():
    from amptrain.common.errors import MESSAGE_LIMIT, UserError

    message = str(UserError("--model " + "lol" * 10**6 + " is unknown"))
    assert len(message) < MESSAGE_LIMIT + 50 and message.endswith("(3000019 characters in all)")
    assert str(UserError("short")) == "short"


def test_bounded_echo_is_one_short_line():
    from amptrain.common.errors import bounded

    assert bounded("a\nb   c") == "a b c"
    long = bounded("x" * 10**7)
    assert long.startswith("x" * 200 + "...") and long.endswith("(10000000 characters in all)")


def test_a_user_error_from_a_dataloader_worker_is_the_users_line_again():
    # torch rebuilds a worker's exception from its whole traceback text.
    from amptrain.common.errors import UserError

    wrapped = ("Caught UserError in DataLoader worker process 1.\nOriginal Traceback (most "
               "recent call last):\n  File \"x.py\", line 3, in f\n    raise UserError(...)\n"
               "amptrain.common.errors.UserError: --data module:m.f: "
               "training sample 40 is unusable\n")
    assert str(UserError(wrapped)) == "--data module:m.f: training sample 40 is unusable"
