"""``amptrain audit``: run a training script under observation and report the traps of
mixed precision it falls into, or audit an amptrain run directory (docs/audit.md)."""
from __future__ import annotations

import argparse
import json
import logging
import os

from ..common.errors import UserError

HELP = "audit a training script (`audit -- python train.py`) or a run directory for precision traps"

log = logging.getLogger("amptrain")


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=None, metavar="N",
                        help="stop observing, and end the script cleanly, after N optimizer "
                             "steps (default: run it to its end)")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help='also write {"findings": [...]} to FILE (a new file)')


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--steps``, ``--json`` and the command (after ``--``) or a run directory."""
    _options(parser)
    parser.add_argument("target", nargs=argparse.REMAINDER, metavar="-- COMMAND ... | RUN_DIR",
                        help="the command that trains (`-- python train.py ...`, `-- torchrun "
                             "...`), or an amptrain run directory")


def _target(args: argparse.Namespace) -> tuple[list[str], str | None]:
    """(the command, or the run directory)."""
    words = list(args.target)
    if words and words[0] == "--":
        return words[1:], None
    if words and os.path.isdir(words[0]):
        # REMAINDER took the options written after the directory (`audit runs --json f`)
        late = argparse.ArgumentParser(prog="amptrain audit RUN_DIR", add_help=False,
                                       exit_on_error=False)
        _options(late)
        try:
            given, extra = late.parse_known_args(words[1:])
        except argparse.ArgumentError as error:
            raise UserError(f"amptrain audit: {error}") from None
        if extra:
            raise UserError(f"amptrain audit: a run directory takes no further words "
                            f"(got {' '.join(extra)!r})")
        for name in ("steps", "json"):
            if getattr(given, name) is not None:
                setattr(args, name, getattr(given, name))
        return [], words[0]
    if not words:
        raise UserError("amptrain audit needs a command after `--` (e.g. `amptrain audit -- "
                        "python train.py`) or a run directory")
    raise UserError(f"amptrain audit: {words[0]!r} is not a run directory; put the command "
                    "after `--` (e.g. `amptrain audit -- python train.py`)")


def run(args: argparse.Namespace) -> int:
    """Audit, print the findings, write ``--json``; exit 1 when any finding is an error."""
    # deferred: torch loads when the command runs, not for --help
    from ..common import outdir

    command, run_dir = _target(args)
    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps must be an integer >= 1 (got {args.steps})")
    if args.json is not None and (os.path.exists(args.json) or os.path.islink(args.json)):
        raise UserError(f"--json: {args.json} exists already and amptrain never replaces what "
                        "it did not write; move it away or choose another --json")
    returncode, stopped = 0, False
    if run_dir is not None:
        if args.steps is not None:
            raise UserError("--steps applies to a command under audit, not to a run directory")
        from ..audit.rundir import audit_run_dir  # deferred: torch and yaml
        report, has_numerics = audit_run_dir(run_dir)
        if not has_numerics:
            print(f"{run_dir} has no numerics.jsonl (a run with --numerics off): audited its "
                  "config.yaml alone")
        text = report.format("sampled steps in numerics.jsonl")
    else:
        from ..audit.launch import run_audited  # deferred: the observer imports torch
        audited = run_audited(command, steps=args.steps)
        report, returncode, stopped = audited.report, audited.returncode, audited.stopped
        text = report.format()
        if stopped:
            text += f"\n(the audit ended the script after {args.steps} optimizer steps)"
    print(text)
    if args.json is not None:
        outdir.write_text(args.json, json.dumps({"findings": report.to_json()["findings"]},
                                                indent=2) + "\n", replace=False, option="json")
    if report.has_errors:
        return 1
    if returncode != 0:
        from ..audit.launch import describe_exit, exit_status  # deferred: as above
        print(f"amptrain audit: the command {describe_exit(returncode)}")
        return exit_status(returncode)
    return 0
