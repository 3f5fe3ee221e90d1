"""``amptrain train``: one training run, here or as torchrun processes."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..config import RunConfig
from ..common.errors import TrainingHalted, UserError
from .common import add_config_flags, config_from_args, number, with_out

HELP = "train a model in one precision"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every training option as a flag, ``--config``, and the launcher flags."""
    # deferred: torch loads when the command runs, not for --help
    from ..workflows.launch import add_launch_flags

    parser.add_argument("--config", help="YAML file of options (flags override it)")
    add_config_flags(parser, RunConfig)
    add_launch_flags(parser)


def run(args: argparse.Namespace) -> int:
    """Train; print the final metrics and where the outputs are (rank 0)."""
    # deferred: torch loads when the command runs, not for --help
    from ..distributed import is_main_process
    from ..workflows.launch import launch, launch_requested
    from ..precision import label
    from ..workflows.runner import run_training

    config = config_from_args(args)
    if config.checkpointing.resume == "auto" and not config.out:
        raise UserError("--resume auto needs --out (the run directory to continue)")
    config = with_out(config)
    if launch_requested(args):
        return launch(args, config)
    result = run_training(config)
    if not is_main_process():
        return 0
    bad = result.nonfinite_metrics()
    if bad:  # a run that learnt nothing usable must not look like a success
        raise TrainingHalted(
            f"training diverged: its final {' and '.join(bad)} "
            f"{'are' if len(bad) > 1 else 'is'} not finite after {result.steps} steps "
            f"({result.skipped_steps} skipped); lower --lr, set --clip-grad-norm or run "
            f"`amptrain diagnose` (outputs kept in {result.out}/)")
    metrics = "  ".join(f"val_{k} {number(v)}" for k, v in result.val_metrics.items()) \
        or "no validation metrics"
    speed = f", {result.samples_per_s:.0f} samples/s" if result.samples_per_s else ""
    speed += "".join(f", {value:.0f} {result.speed_units.get(key, key)}"  # the task's speeds
                     for key, value in result.speeds.items())
    if result.data_wait_frac is not None:
        speed += f", data wait {100 * result.data_wait_frac:.0f}%"
    print(f"done: {metrics}  val_loss {number(result.val_loss)}  after {result.steps} steps "
          f"({label(result.precision, config.precision.name)}{speed}, "
          f"{result.skipped_steps} skipped)")
    if result.learning_note:  # the task's word on a model that learnt nothing
        print(f"warning: {result.learning_note}")
    out = Path(result.out or config.out or ".")
    written = sorted(out.iterdir()) if out.is_dir() else []
    print(f"outputs: {result.out}/ ({', '.join(p.name + '/' * p.is_dir() for p in written)})")
    return 0
