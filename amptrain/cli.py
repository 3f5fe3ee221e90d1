"""The ``amptrain`` command line: the parser, logging to stderr, and exit codes.

Each command's flags and output live in :mod:`amptrain.commands`; this module only
dispatches. User errors print one line on stderr and exit 2; no traceback.
"""
from __future__ import annotations

import argparse
import difflib
import logging
import os
import sys
import warnings
from collections.abc import Callable, Collection, Sequence
from typing import Any, NoReturn

from .version import __version__
from .commands import COMMANDS
from .commands import load as load_command
from .common.errors import AmptrainError, AmptrainWarning, Preempted, cli_spelling, forget_warnings
from .common import outdir


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2), and flags are never
    abbreviated: ``compare --precision X`` would otherwise be taken for ``--precisions X``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"amptrain: error: {message} (see `{self.prog} --help`)\n")


def build_parser(flags_of: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The ``amptrain`` parser: one sub-command per entry of :data:`~amptrain.commands.COMMANDS`.

    ``flags_of``: the commands whose flags are added (None: all). :func:`main` adds only
    the command on the command line: a command's ``add_arguments`` may import what its
    flags need (torch, for some), while its module, and so ``amptrain --help``, does not.
    """
    parser = _Parser(prog="amptrain", description="Fast, safe and measurable mixed-precision "
                                                  "training for PyTorch.")
    parser.add_argument("--version", action="version", version=f"amptrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        command = load_command(name)
        parser_of_command = sub.add_parser(name, help=command.HELP, description=command.HELP)
        if flags_of is None or name in flags_of:
            command.add_arguments(parser_of_command)
        parser_of_command.set_defaults(handler=command.run)
    return parser


def named_command(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (the top level
    takes only --help and --version, which have no values)."""
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    return first if first in COMMANDS else None


class _CurrentStderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at emit time, not the stream of the first call.

    ``main()`` may run many times in one process (tests, notebooks) with stderr swapped in
    between; a handler bound to the first stream would write to a closed file.
    """

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def configure_logging() -> None:
    """amptrain's notices go to stderr as ``amptrain: message``."""
    logger = logging.getLogger("amptrain")
    if not logger.handlers:
        handler = _CurrentStderrHandler()
        handler.setFormatter(logging.Formatter("amptrain: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def _say(text: str) -> None:
    """One line on stderr, written in one call so that the lines of several torchrun
    processes cannot interleave; ranks other than 0 say who they are."""
    rank = os.environ.get("RANK", "0") if "LOCAL_RANK" in os.environ else "0"
    who = "amptrain" if rank == "0" else f"amptrain[rank {rank}]"
    sys.stderr.write(f"{who}: {text}\n")
    sys.stderr.flush()


def _refuse_unknown(parser: argparse.ArgumentParser, command: str | None,
                    extras: list[str]) -> NoReturn:
    """The usage error for flags no parser took, naming the closest flag of the command
    (``--epoch 3``: did you mean --epochs?), as the library's keywords do."""
    chosen = parser
    for action in parser._actions:  # the sub-command's own parser knows its flags
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            chosen = action.choices[command]
    known = [s for s in chosen._option_string_actions if s.startswith("--")]
    hints = [f"did you mean {close[0]}?" for token in extras if token.startswith("--")
             for close in [difflib.get_close_matches(token.split("=", 1)[0], known, 1, 0.75)]
             if close]
    hint = f" ({'; '.join(hints)})" if hints else ""
    chosen.error(f"unrecognized arguments: {' '.join(extras)}{hint}")


def _refuse_unknown_command(parser: argparse.ArgumentParser, word: str) -> NoReturn:
    """The usage error for a command that does not exist, naming the closest one
    (``trian``: did you mean train?), as mistyped flags get."""
    close = difflib.get_close_matches(word, list(COMMANDS), 1, 0.6)
    hint = f"; did you mean {close[0]}?" if close else f"; the commands: {', '.join(COMMANDS)}"
    parser.error(f"unknown command {word!r}{hint}")


def _print_warnings(shown_before: Callable[..., None]) -> Callable[..., None]:
    """A ``warnings.showwarning`` that prints amptrain's own warnings as ``amptrain:
    warning: ...`` lines (once each, as the library issues them) and passes anything else
    to ``shown_before``."""
    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any
             ) -> None:
        if issubclass(category, AmptrainWarning):
            logging.getLogger("amptrain").warning("warning: %s", message)
        else:
            shown_before(message, category, *args, **kwargs)
    return show


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``amptrain`` console script and ``python -m amptrain``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(flags_of=[name for name in [named_command(argv)] if name])
    word = next((arg for arg in argv if not arg.startswith("-")), None)
    if word is not None and word not in COMMANDS:
        _refuse_unknown_command(parser, word)
    args, extras = parser.parse_known_args(argv)
    if extras:
        _refuse_unknown(parser, getattr(args, "command", None), extras)
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return 2
    configure_logging()
    try:
        with cli_spelling(), warnings.catch_warnings():
            warnings.showwarning = _print_warnings(warnings.showwarning)
            forget_warnings()  # each invocation says its warnings once
            return args.handler(args)
    except Preempted as exc:  # not an error: the run stopped on request, with a checkpoint
        _say(f"{exc}")
        return exc.exit_code
    except AmptrainError as exc:
        _say(f"error: {exc}")
        return exc.exit_code
    except KeyboardInterrupt:
        print("amptrain: interrupted", file=sys.stderr)
        return 130
    finally:

        outdir.release_all()  # the locks of the command's --out end with it

