"""compare's timing lane against the training loop it stands for (issue 38 item 1).

compare times each precision in its own lane (a set-up Trainer stepped between device
syncs, the precisions interleaved) and then trains the real runs. The speed it reports
must be the speed training has. This script alternates, in one process, round by round:

* compare's timing lane for the precision (``measure_speed_and_memory``: the median step),
* a normal training run of the same config, timed two ways: the wall time between
  consecutive steps of its loop (a callback; warm-up steps dropped), and the speed the
  run logs itself (``samples_per_s``, what compare's cross-check reads from its runs).

By default on the tiny BERT of examples/tiny_hf_model.py and its review CSV (written to a
temporary directory), the model a newcomer saw timed 40x too slow on an AVX2 EPYC:

    python benchmarks/compare_lane.py --precisions 32-true,bf16-mixed --rounds 3 [--record]
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import benchlib as bl

from amptrain.compare import CompareOptions, measure_speed_and_memory, speed_figures
from amptrain.config import RunConfig
from amptrain.workflows.runner import run_training


class StepClock:
    """Trainer callback: the wall time between consecutive steps of the training loop."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.last: float | None = None

    def on_step_end(self, trainer: object) -> None:
        now = time.perf_counter()
        if self.last is not None:
            self.times.append(now - self.last)
        self.last = now


def tiny_hf(directory: Path) -> tuple[str, str]:
    """The README's tiny BERT and review CSV, written into ``directory``."""
    spec = importlib.util.spec_from_file_location(
        "tiny_hf_model", bl.ROOT / "examples" / "tiny_hf_model.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.write_tiny_bert(directory / "tiny-bert")
    example.write_reviews_csv(directory / "reviews.csv")
    return f"hf:{directory / 'tiny-bert'}", f"csv-text:{directory / 'reviews.csv'}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="default: the tiny BERT of examples/tiny_hf_model.py")
    parser.add_argument("--data", help="default: its review CSV")
    parser.add_argument("--precisions", default="32-true")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    bl.add_common_args(parser)
    args = parser.parse_args()
    if bool(args.model) != bool(args.data):
        parser.error("--model and --data go together (neither: the tiny BERT and its CSV)")
    bl.apply_threads(args.threads)
    machine = bl.machine()
    with tempfile.TemporaryDirectory(prefix="compare-lane-") as workdir:
        rows = measure(args, Path(workdir))
    table = bl.markdown_table(
        ["precision", "compare's lane ms/step", "training loop ms/step",
         "the run's logged ms/step", "lane / loop", "rounds"], rows)
    notes = [f"{args.model or 'examples/tiny_hf_model.py tiny BERT'} on "
             f"{args.data or 'its review CSV'}, batch {args.batch_size}, device "
             f"{args.device}; {args.rounds} rounds, each: compare's timing lane (5 warm-up + "
             f"20 timed steps, median), then a training run of {args.epochs} epochs (median "
             f"step-to-step wall time after 2 steps; and batch / the run's own logged "
             f"samples_per_s, which compare's cross-check reads). lane / loop is the median of "
             f"the per-round ratios, 1.00 when compare reports the speed training has."]
    bl.report("compare's timing lane vs the training loop", machine, table, notes,
              record=args.record)
    return 0


def measure(args: argparse.Namespace, workdir: Path) -> list[list[str]]:
    """One table row per precision: the lane, the loop, the logged step, their ratio."""
    model, data = (args.model, args.data) if args.model and args.data else tiny_hf(workdir)
    rows = []
    for precision in args.precisions.split(","):
        config = RunConfig.from_options(model=model, data=data, precision=precision,
                                        batch_size=args.batch_size, epochs=args.epochs,
                                        lr=3e-3, device=args.device, no_progress=True,
                                        log_every=5)
        options = CompareOptions(precisions=precision, bench_steps=20, timing_warmup=5)
        lane, loop, logged = [], [], []
        for round_ in range(args.rounds):
            timed = measure_speed_and_memory(config, [precision], options)[precision]
            lane.append(speed_figures(timed)["step_time_ms"])
            clock = StepClock()
            result = run_training(config.with_options(out=str(workdir / f"{precision}-{round_}")),
                                  callbacks=[clock])
            loop.append(statistics.median(clock.times[2:]) * 1e3)
            if result.samples_per_s:
                logged.append(args.batch_size / result.samples_per_s * 1e3)
        ratios = [a / b for a, b in zip(lane, loop)]
        rows.append([precision, f"{bl.median(lane):.2f}", f"{bl.median(loop):.2f}",
                     f"{bl.median(logged):.2f}" if logged else "-",
                     f"**{bl.median(ratios):.2f}**", bl.span(ratios)])
        print(rows[-1], file=sys.stderr)
    return rows


if __name__ == "__main__":
    sys.exit(main())
