"""``amptrain compare``: the A/B precision study from the command line."""
from __future__ import annotations

import argparse
import logging
from typing import Any

from ..config import RunConfig, build_config, config_fields, replace_options
from ..common.errors import UserError, flag
from .common import add_config_flags, command_line, default_out, merged_values

HELP = "A/B study: train in several precisions, compare speed, memory and accuracy"

log = logging.getLogger("amptrain")

_EXCLUDED_TRAIN_FLAGS = ("precision", "resume")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``train``'s options (but --precision and --resume) plus the study's."""
    # deferred: torch loads when the command runs, not for --help
    from ..compare import CompareOptions

    parser.add_argument("--config", help="YAML file of options (flags override it)")
    compare_fields = list(config_fields(CompareOptions))
    add_config_flags(parser, CompareOptions, only=[n for n in compare_fields if n != "interleave"])
    parser.add_argument("--interleave", action=argparse.BooleanOptionalAction,
                        default=argparse.SUPPRESS,
                        help=config_fields(CompareOptions)["interleave"].metadata["help"]
                        + " (default: on)")
    train_fields = [name for name in config_fields(RunConfig)
                    if name not in _EXCLUDED_TRAIN_FLAGS]
    add_config_flags(parser, RunConfig, only=train_fields)


def split_values(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """(train values, compare values) from --config YAML overridden by the given flags
    (met in :func:`~amptrain.commands.common.merged_values`, as every command's are)."""
    # deferred: torch loads when the command runs, not for --help
    from ..compare import CompareOptions

    train_names, compare_names = set(config_fields(RunConfig)), set(config_fields(CompareOptions))
    values = merged_values(args, RunConfig, CompareOptions)
    unknown = sorted(set(values) - train_names - compare_names)
    if unknown:  # only a --config YAML key can be unknown: the flags are the parser's
        raise UserError(f"unknown option {flag(unknown[0])} in --config {args.config}")
    if "precision" in values:  # no --precision flag here: from the YAML
        log.info("compare: ignoring precision from --config; each of --precisions is trained")
        values.pop("precision")
    train = {k: v for k, v in values.items() if k in train_names}
    compare = {k: v for k, v in values.items() if k in compare_names}
    return train, compare


def emulated_here(device: str) -> set[str]:
    """The precisions that ``device`` only emulates (asked of the precision layer)."""
    # deferred: torch loads when the command runs, not for --help
    from ..precision.hardware.devices import resolve_device
    from ..precision.hardware.support import device_features, emulated_precisions

    where = resolve_device(device)
    return {p for p, e in emulated_precisions(where, device_features(where)).items() if e}


def emulated_plans(rows: list[str], device: str) -> set[str]:
    """The precision-plan rows (``plan:FILE``) with a format that ``device`` only emulates."""
    # deferred: torch loads when the command runs, not for --help
    from ..common.choices import PLAN_PREFIX
    from ..precision.hardware.devices import resolve_device
    from ..precision.precision_plan import native_formats
    from ..precision.resolve import resolve_precision

    where = resolve_device(device)   # --device's value may be "auto"
    plans = [resolve_precision(row, where) for row in rows if row.startswith(PLAN_PREFIX)]
    return {p.name for p in plans
            if p.plan is not None and not all(native_formats(p.plan, p.device).values())}


def run(args: argparse.Namespace) -> int:
    """Run the study, print the summary table and where the reports are."""
    # deferred: torch loads when the command runs, not for --help
    from ..compare import CompareOptions, run_compare
    from ..compare.rows import row_names
    from ..compare.summary import data_wait_warning
    from ..precision.modes import as_given
    from ..report import format_table, timing_warning
    from ..report.tables import is_emulated, seed_warning

    train_values, compare_values = split_values(args)
    config = build_config(RunConfig, train_values, source="option")
    options = build_config(CompareOptions, compare_values, source="option")
    if not config.out:
        config = replace_options(config, out=default_out(config, prefix="compare-"))
    result = run_compare(config, options, command=command_line())
    emulated = emulated_here(config.device) | emulated_plans(
        [r["precision"] for r in result["summary"]], config.device)
    given = as_given([*str(options.precisions).split(","), options.baseline])  # Keras names
    rows = [r["precision"] for r in result["summary"]]
    names = row_names(config, rows)   # mxfp4 rceil: the low-bit settings a row ran with
    print(format_table(result["summary"], result["baseline"], emulated, given, names))
    marked = [names.get(p, p) for p in rows if is_emulated(p, emulated)]
    if marked:
        print(f"(emulated): {', '.join(marked)} {'has' if len(marked) == 1 else 'have'} no "
              f"hardware on this device: for studying that format's numerics here, never "
              f"faster than 32-true here; {'its' if len(marked) == 1 else 'their'} speed says "
              f"nothing about hardware that has it")
    warning = timing_warning(result["summary"])
    if warning:
        print(f"warning: {warning}")
    weak = seed_warning(result["summary"])
    if weak:
        print(f"warning: {weak}")
    waiting = data_wait_warning(result["summary"])
    if waiting:
        print(f"warning: {waiting}")
    runs = "" if options.speed_only else ", runs/"
    print(f"outputs: {config.out}/ (compare.json, study.json, report.md, report.html, "
          f"compare.png{runs})")
    return 0
