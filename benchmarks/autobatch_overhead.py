"""What out-of-memory readiness costs per step: the Trainer's step with and without it.

Every step the Trainer saves the RNG state and the module buffers (a StepStart, so that a
redo after an out-of-memory error starts from the same state) and MicroBatchSizer.run
guards the forward/backward. This compares two Trainers on the same model and data: one
as shipped, one whose ``sizer.run`` is a direct call of the forward/backward and whose
StepStart saves nothing. Steps are
interleaved A/B, warm-up steps are excluded, and the medians are compared.

    python benchmarks/autobatch_overhead.py [--model cnn] [--data digits] [--steps 40]
"""
from __future__ import annotations

import argparse
import copy
import statistics

import benchlib as bl
import torch

from amptrain.config import RunConfig, build_config
from amptrain.workflows.runner import data_and_model
from amptrain.trainer import Trainer


def _unguarded(window, forward_backward, *, plan, **_):
    forward_backward(window)
    return window, plan


class _NoStepStart:
    def save(self) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--data", default="digits")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    config = build_config(RunConfig, dict(model=args.model, data=args.data,
                                          precision=args.precision, batch_size=args.batch_size,
                                          accumulate=args.accumulate, no_progress=True,
                                          scheduler="none"))
    data, model = data_and_model(config)
    variants = {}
    for name in ("unguarded", "guarded"):
        trainer = Trainer(config)
        trainer.setup(copy.deepcopy(model), data.train)
        if name == "unguarded":
            trainer.sizer.run = _unguarded
            trainer._ready().train_step.start = _NoStepStart()
        variants[name] = trainer
    times = bl.interleaved_step_times(variants, args.warmup, args.steps)
    base = statistics.median(times["unguarded"])
    buffers = sum(1 for _ in model.buffers())
    print(f"{args.model} on {args.data}, {args.precision}, batch {args.batch_size} "
          f"(accumulate {args.accumulate}), {buffers} buffers, median of {args.steps} steps:")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:10s} {median * 1e3:8.2f} ms  ({median / base:.3f}x)")


if __name__ == "__main__":
    main()
