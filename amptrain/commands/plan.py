"""``amptrain plan``: the per-layer precision plan that keeps compare's verdict."""
from __future__ import annotations

import argparse
import logging

from ..config import RunConfig, build_config, config_fields
from ..common.errors import UserError, flag
from .common import add_config_flags, command_line, merged_values, with_out

HELP = ("find the largest set of Linear layers that can train in a low-bit format with "
        "compare's verdict ok, and write it as a precision plan")

log = logging.getLogger("amptrain")

_EXCLUDED_TRAIN_FLAGS = ("resume",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``train``'s options (--precision names the low-bit format) plus the search's."""
    # deferred: torch loads when the command runs, not for --help
    from ..compare.options import PlanOptions

    parser.add_argument("--config", help="YAML file of options (flags override it)")
    add_config_flags(parser, PlanOptions)
    add_config_flags(parser, RunConfig, only=[name for name in config_fields(RunConfig)
                                              if name not in _EXCLUDED_TRAIN_FLAGS])


def run(args: argparse.Namespace) -> int:
    """Rank, search, write DIR/precision-plan.yaml, plan.md, plan.json; print the result."""
    # deferred: torch loads when the command runs, not for --help
    from ..compare.options import PlanOptions
    from ..compare.precision_plan import run_plan

    values = merged_values(args, RunConfig, PlanOptions)
    plan_names, train_names = set(config_fields(PlanOptions)), set(config_fields(RunConfig))
    unknown = sorted(set(values) - plan_names - train_names)
    if unknown:  # only a --config YAML key can be unknown
        raise UserError(f"unknown option {flag(unknown[0])} in --config {args.config}")
    if "precision" not in values:
        raise UserError(f"plan needs {flag('precision')} FORMAT, the low-bit format to put "
                        f"layers in (e.g. mxfp4, nvfp4, fp8)")
    config = with_out(build_config(RunConfig, {k: v for k, v in values.items()
                                               if k in train_names}, source="option"),
                      prefix="plan-")
    options = build_config(PlanOptions, {k: v for k, v in values.items() if k in plan_names},
                           source="option")
    report = run_plan(config, options, command=command_line())
    plan = report["plan"]
    print(f"plan: {plan['layers_in_format']} of {len(report['ranking'])} eligible Linear "
          f"layers in {report['format']} ({100 * plan['lowbit_flops_share']:.0f} % of their "
          f"matmul FLOPs); verdict against {report['baseline']}: {plan['verdict']}")
    delta = report["task"]["delta_field"]
    for e in report["search"]:
        print(f"  candidate {e['candidate']}: {len(e['layers'])} layer(s), "
              f"{100 * e['lowbit_flops_share']:.0f} % FLOPs, {e['metric']} "
              f"{e['value'] if e['value'] is None else round(e['value'], 4)} "
              f"({delta} {e[delta] if e[delta] is None else round(e[delta], 4)}): "
              f"{e['verdict']}")
    if report["cut_short"]:
        print(f"warning: the search was cut short: {report['cut_short']}")
    print(f"outputs: {config.out}/ (precision-plan.yaml, plan.md, plan.json, search/); "
          f"train with --precision plan:{plan['file']}")
    return 0
