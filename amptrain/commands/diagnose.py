"""``amptrain diagnose``: which modules overflow or underflow in fp16, from the command line."""
from __future__ import annotations

import argparse
import logging

from ..common import outdir
from ..config import RunConfig, build_config, config_fields
from ..common.errors import flag
from .common import add_config_flags, merged_values, with_out

HELP = "find which modules overflow or underflow in fp16 and what to do about it"

log = logging.getLogger("amptrain")

#: Train options that make no sense for a fixed number of diagnosis steps.
_NOT_FLAGS = {"epochs", "max_steps", "resume", "save_every", "keep_last",
              "eval_every", "log_every", "compile", "strategy"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--steps plus the train options that apply."""
    parser.add_argument("--config", help="YAML file of options (flags override it)")
    parser.add_argument("--steps", type=int, default=20,
                        help="optimizer steps per diagnosis run: each run's whole length, "
                             "as many epochs as they need (default: 20)")
    add_config_flags(parser, RunConfig, only=[name for name in config_fields(RunConfig)
                                              if name not in _NOT_FLAGS])


def run(args: argparse.Namespace) -> int:
    """Run, write DIR/diagnose.{json,md}, print the summary."""
    # deferred: torch loads when the command runs, not for --help
    from ..diagnose import diagnose, summary_lines, write_reports

    values = merged_values(args)
    ignored = sorted(k for k in values if k in _NOT_FLAGS)
    if ignored:  # only a --config YAML can bring these (a train config reused)
        log.info("diagnose ignores %s from --config: it runs --steps steps in each precision",
                 ", ".join(flag(k) for k in ignored))
        for key in ignored:
            del values[key]
    config = with_out(build_config(RunConfig, values, source="option"))
    out = str(config.out)  # decided by with_out
    outdir.claim_locked(out, outdir.DIAGNOSE_OUTPUTS)  # refused before the runs, not after
    report = diagnose(config, args.steps)
    json_path, md_path = write_reports(report, out)
    print("\n".join(summary_lines(report)))
    print(f"reports: {json_path}, {md_path}")
    return 0
