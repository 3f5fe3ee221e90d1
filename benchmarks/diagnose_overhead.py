"""What diagnose's hooks cost: step time of 32-true training with and without them.

Three Trainers on the same model and data: plain, with the NonFiniteWatch (the 16-mixed
runs' hooks) and with the RangeRecorder (the statistics run's hooks). Steps are
interleaved A/B/C, warm-up steps are excluded, and the medians are compared.

    python benchmarks/diagnose_overhead.py [--model cnn] [--data digits] [--steps 30]
"""
from __future__ import annotations

import argparse
import copy
import statistics

import benchlib as bl
import torch

from amptrain.config import RunConfig, build_config
from amptrain.diagnose import RangeRecorder
from amptrain.precision.nonfinite import NonFiniteWatch
from amptrain.workflows.runner import data_and_model
from amptrain.trainer import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--data", default="digits")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    config = build_config(RunConfig, dict(model=args.model, data=args.data, precision="32-true",
                                          batch_size=args.batch_size, no_progress=True,
                                          scheduler="none"))
    data, model = data_and_model(config)
    variants = {}
    for name in ("plain", "watch", "recorder"):
        trainer = Trainer(config)
        trainer.setup(copy.deepcopy(model), data.train)
        if name == "watch":
            NonFiniteWatch(trainer.model, lambda t=trainer: t.step)
        elif name == "recorder":
            RangeRecorder(trainer.model)
        variants[name] = trainer
    times = bl.interleaved_step_times(variants, args.warmup, args.steps)
    base = statistics.median(times["plain"])
    print(f"{args.model} on {args.data}, batch {args.batch_size}, {args.steps} steps "
          f"(median, {torch.get_num_threads()} threads, {variants['plain'].device}):")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:<9} {median * 1e3:8.2f} ms/step  {median / base:5.2f}x")


if __name__ == "__main__":
    main()
