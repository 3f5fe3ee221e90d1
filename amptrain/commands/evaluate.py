"""``amptrain eval``: a checkpoint's metrics and reports on a dataset."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from ..common.errors import TrainingHalted

HELP = "evaluate a checkpoint"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The checkpoint, the data and where the reports go."""
    parser.add_argument("--checkpoint", required=True,
                        help="checkpoint file (e.g. DIR/checkpoints/last.pt) or a run directory")
    parser.add_argument("--data", help="dataset to evaluate on (default: the training data)")
    parser.add_argument("--precision", default="auto",
                        help="precision for evaluation (default: auto)")
    parser.add_argument("--out", required=True, help="directory for eval/ reports")
    parser.add_argument("--batch-size", type=int, default=256, help="evaluation batch size")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--episodes", type=int, default=None,
                        help="gym: runs: deterministic episodes to play (default 10)")


def run(args: argparse.Namespace) -> int:
    """Evaluate and print the headline metrics."""
    # deferred: torch loads when the command runs, not for --help
    from ..workflows.runner import run_evaluation

    result, trained_with = run_evaluation(
        checkpoint_path=args.checkpoint, data=args.data, precision=args.precision, out=args.out,
        batch_size=args.batch_size, device=args.device, progress=not args.no_progress,
        episodes=args.episodes)
    assert result.task is not None  # results of a pass carry their task
    bad = [name for name, value in (("loss", result.loss), *result.metrics.items())
           if isinstance(value, float) and not math.isfinite(value)]
    if bad:  # finite weights, yet non-finite outputs: the precision overflowed on this data
        raise TrainingHalted(f"evaluation of {args.checkpoint} gave a non-finite "
                             f"{' and '.join(bad)} on {result.samples} samples in --precision "
                             f"{args.precision}: the model's outputs overflow; evaluate with "
                             f"--precision 32-true")
    metrics = "  ".join(f"{m.label} {result.metrics[m.key]:.4f}" for m in result.task.metrics
                        if m.key in result.metrics)
    print(f"{metrics}  loss {result.loss:.4f} on {result.samples} samples "
          f"(checkpoint trained with {trained_with})")
    readable, _ = result.task.reports.report_text(result)
    reports = Path(args.out) / "eval"
    # The task's other files (a GAN's samples.png) after its two reports.
    others = sorted(p.name for p in reports.iterdir() if p.name not in (readable, "report.json")) \
        if reports.is_dir() else []
    print(f"reports: {reports}/ ({', '.join([readable, 'report.json', *others])})")
    return 0
